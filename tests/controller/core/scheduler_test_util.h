// Shared helpers for scheduler tests: a harness that runs steps through a FakeAgent.
#ifndef VAMP_TESTS_CONTROLLER_CORE_SCHEDULER_TEST_UTIL_H_
#define VAMP_TESTS_CONTROLLER_CORE_SCHEDULER_TEST_UTIL_H_

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "controller/core/scheduler.h"
#include "controller/core/static_arbiter.h"
#include "gtest/gtest.h"
#include "tests/controller/core/fake_agent.h"

namespace vamp::testing {

inline std::vector<TokenId> Iota(int n, TokenId start = 0) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

inline RequestSpec Spec(RequestId id, std::vector<TokenId> prompt, int32_t max_tokens) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids = std::move(prompt);
  spec.sampling_params.max_tokens = max_tokens;
  return spec;
}

// Default sampled token: never a stop token unless a test configures one.
inline TokenId DefaultSample(RequestId id, int32_t position) {
  return 100000 + static_cast<TokenId>(id % 1000) * 100 + position % 100;
}

inline std::string PlanSummary(const StepPlan& p) {
  std::string s = absl::StrCat("step ", p.step, " blocks ", p.num_blocks, " tokens ",
                               p.total_num_scheduled_tokens, ";");
  for (const auto& n : p.new_requests) {
    absl::StrAppend(&s, " new ", n.request_id, " c", n.num_computed_tokens, " s",
                    n.num_scheduled_tokens, " [", absl::StrJoin(n.block_ids, ","), "]");
  }
  for (const auto& c : p.cached_requests) {
    absl::StrAppend(&s, " cached ", c.request_id, c.resumed ? " resumed" : "", " c",
                    c.num_computed_tokens, " s", c.num_scheduled_tokens, " [",
                    absl::StrJoin(c.new_block_ids, ","), "]");
  }
  absl::StrAppend(&s, " preempted [", absl::StrJoin(p.preempted_ids, ","), "] finished [",
                  absl::StrJoin(p.finished_ids, ","), "]");
  return s;
}

class Harness {
 public:
  explicit Harness(const SchedulerConfig& config,
                   std::unique_ptr<MemoryArbiter> arbiter = std::make_unique<StaticArbiter>(),
                   ExpertOffloader* offloader = nullptr)
      : block_size_(config.block_size),
        agent_([this](RequestId id, int32_t pos) { return sampler_(id, pos); }) {
    auto s = Scheduler::Create(config, &clock_, std::move(arbiter), offloader);
    EXPECT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(s).value();
  }

  struct StepResult {
    StepPlan plan;
    std::vector<RequestOutput> outputs;
  };

  // Schedule, execute on the fake agent, apply the output; checks invariants along the way.
  StepResult Step() {
    StepResult result;
    absl::StatusOr<StepPlan> plan = scheduler_->Schedule();
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return result;
    result.plan = *plan;
    absl::Status inv = scheduler_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    absl::StatusOr<StepOutput> out = agent_.Execute(*plan, block_size_);
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok() && !plan->empty()) {
      auto outputs = scheduler_->UpdateFromOutput(*out);
      EXPECT_TRUE(outputs.ok()) << outputs.status();
      if (outputs.ok()) result.outputs = *std::move(outputs);
      inv = scheduler_->CheckInvariants();
      EXPECT_TRUE(inv.ok()) << inv;
    }
    clock_.AdvanceMicros(step_micros_);
    return result;
  }

  // Steps until no request is live (or `max_steps`); returns the number of steps taken.
  int RunToCompletion(int max_steps = 10000) {
    int steps = 0;
    while (scheduler_->has_unfinished_requests() && steps < max_steps) {
      Step();
      ++steps;
    }
    return steps;
  }

  Scheduler& scheduler() { return *scheduler_; }
  FakeAgent& agent() { return agent_; }
  ManualClock& clock() { return clock_; }
  void set_sampler(FakeAgent::Sampler s) { sampler_ = std::move(s); }
  void set_step_micros(int64_t us) { step_micros_ = us; }

 private:
  int32_t block_size_;
  ManualClock clock_;
  FakeAgent::Sampler sampler_ = DefaultSample;
  FakeAgent agent_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t step_micros_ = 1000;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_CONTROLLER_CORE_SCHEDULER_TEST_UTIL_H_
