// ServingEngine (controller/serving/serving_engine.h) against fake agents on loopback: requests
// are admitted or refused with the scheduler's reason, stream their tokens one event per step
// and end with usage; Abort ends one and tells the agents; drain refuses new work until undrain;
// the pool is sized from the agents' Init answers alone, forced offloads and restores change it
// on every rank with one step round each, one that a rank refuses is rolled back on every rank
// and the refused step is run again without hurting serving; a rank whose reported memory is not
// the controller's view, or that dies, fails every live request with an error naming it, and the
// engine then refuses work instead of hanging.
#include "controller/serving/serving_engine.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/serving/fake_agent_service.h"

namespace vamp {
namespace {

using ::testing::Each;
using testing::FakeAgentGroup;
using testing::FakeRankSpec;
using ::testing::HasSubstr;

// The events one request's sink received.
class EventLog {
 public:
  EngineSink Sink() {
    return [this](const EngineEvent& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e);
    };
  }
  // Waits until the request finished; false after `timeout` without.
  bool WaitFinished(absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto finished = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !events_.empty() && events_.back().finished;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&finished), timeout);
  }
  // Waits for at least `n` events.
  bool WaitEvents(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<EngineEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<int32_t> tokens() {
    std::vector<int32_t> out;
    for (const EngineEvent& e : events())
      out.insert(out.end(), e.token_ids.begin(), e.token_ids.end());
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<EngineEvent> events_ ABSL_GUARDED_BY(mu_);
};

ServingRequest Request(int32_t prompt_tokens, int32_t max_tokens) {
  ServingRequest r;
  for (int32_t i = 0; i < prompt_tokens; ++i) r.prompt_token_ids.push_back(10 + i % 50);
  r.sampling.max_tokens = max_tokens;
  return r;
}

bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

class ServingEngineTest : public ::testing::Test {
 protected:
  // Two ranks with different memory; rank 0 samples token 7 for everyone.
  ServingEngineTest() : agents_({Rank(64, 8), Rank(60, 6)}) {}

  static FakeRankSpec Rank(int64_t kv_blocks, int64_t blocks_per_group) {
    FakeRankSpec r;
    r.kv_blocks = kv_blocks;
    r.blocks_per_group = blocks_per_group;
    return r;
  }

  void SetUp() override {
    ASSERT_TRUE(agents_.status().ok()) << agents_.status();
    ServingEngineOptions options;
    options.scheduler.max_model_len = 512;  // 32 of the 60 blocks
    options.arbiter = "static";             // no offload but the ones a test forces
    options.ranks = agents_.init_responses();
    options.offload.retry_after_micros = 60 * 1000000;  // a refusal pauses remaps for the test
    options.model_name = "fake-model";
    absl::StatusOr<std::unique_ptr<ServingEngine>> engine =
        ServingEngine::Start(agents_.group(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }

  void TearDown() override { engine_.reset(); }

  int32_t PoolBlocks() {
    vamp::v1::GetStatusResponse status;
    engine_->Snapshot(&status);
    return static_cast<int32_t>(status.kv_pool().total_blocks());
  }

  FakeAgentGroup agents_;
  std::unique_ptr<ServingEngine> engine_;
};

TEST_F(ServingEngineTest, StreamsEveryStepsTokenAndEndsWithUsage) {
  EventLog log;
  absl::StatusOr<RequestId> id = engine_->Submit(Request(20, 4), log.Sink());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(log.WaitFinished());
  const std::vector<EngineEvent> events = log.events();
  ASSERT_EQ(events.size(), 4u) << "one token a step, the last one finishing";
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].token_ids.size(), 1u);
    EXPECT_EQ(events[i].completion_tokens, static_cast<int32_t>(i + 1));
    EXPECT_EQ(events[i].prompt_tokens, 20);
    EXPECT_EQ(events[i].finished, i + 1 == events.size());
    EXPECT_TRUE(events[i].error.empty());
  }
  EXPECT_THAT(log.tokens(), Each(7)) << "the agents' sampled tokens, unchanged";
  EXPECT_EQ(events.back().finish_reason, FinishReason::kLength);
  // The agents got the prompt once, as a new request.
  std::vector<int32_t> prompt;
  for (const vamp::v1::StepRequest& s : agents_.agent(1).steps()) {
    for (const vamp::v1::NewRequest& r : s.new_requests()) {
      if (r.request_id() == *id)
        prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    }
  }
  EXPECT_EQ(prompt, Request(20, 4).prompt_token_ids);
}

TEST_F(ServingEngineTest, ARequestTheSchedulerRefusesEndsWithItsReason) {
  EventLog refused;
  ASSERT_TRUE(engine_->Submit(Request(600, 4), refused.Sink()).ok()) << "refused when admitted";
  ASSERT_TRUE(refused.WaitFinished());
  const std::vector<EngineEvent> events = refused.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish_reason, FinishReason::kAbort);
  EXPECT_THAT(events[0].error, HasSubstr("max_model_len is 512"));
  EXPECT_EQ(events[0].prompt_tokens, 600);
  // The engine keeps serving others.
  EventLog ok;
  ASSERT_TRUE(engine_->Submit(Request(8, 2), ok.Sink()).ok());
  ASSERT_TRUE(ok.WaitFinished());
  EXPECT_EQ(ok.events().back().finish_reason, FinishReason::kLength);
  EXPECT_TRUE(engine_->healthy());
}

TEST_F(ServingEngineTest, AbortEndsTheRequestAndTellsTheAgents) {
  EventLog log;
  absl::StatusOr<RequestId> id = engine_->Submit(Request(8, 400), log.Sink());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(log.WaitEvents(2));
  engine_->Abort(*id);
  // Another request keeps the engine stepping: the step after the abort frees the aborted one on
  // the agents, and from then on its sink hears nothing, never a finish.
  EventLog other;
  ASSERT_TRUE(engine_->Submit(Request(8, 3), other.Sink()).ok());
  ASSERT_TRUE(other.WaitFinished());
  for (int r = 0; r < 2; ++r) {
    const std::vector<uint64_t> f = agents_.agent(r).finished_ids();
    EXPECT_NE(std::find(f.begin(), f.end(), *id), f.end()) << "rank " << r;
  }
  const size_t delivered = log.events().size();
  EXPECT_LT(delivered, 400u);
  EventLog third;
  ASSERT_TRUE(engine_->Submit(Request(8, 3), third.Sink()).ok());
  ASSERT_TRUE(third.WaitFinished());
  EXPECT_EQ(log.events().size(), delivered);
  for (const EngineEvent& e : log.events()) EXPECT_FALSE(e.finished);
}

TEST_F(ServingEngineTest, DrainRefusesNewRequestsUntilUndrain) {
  engine_->Drain();
  EXPECT_TRUE(engine_->draining());
  EventLog log;
  absl::StatusOr<RequestId> refused = engine_->Submit(Request(8, 2), log.Sink());
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("draining"));
  engine_->Undrain();
  ASSERT_TRUE(engine_->Submit(Request(8, 2), log.Sink()).ok());
  EXPECT_TRUE(log.WaitFinished());
}

TEST_F(ServingEngineTest, ForcedOffloadAndRestoreResizeThePoolOnEveryRankInOneStepRoundEach) {
  EXPECT_EQ(PoolBlocks(), 60) << "the cross-rank minimum";
  // The group's Init (GetStats for the rendezvous, then Init) and nothing else: the engine sized
  // its pool from the Init answers.
  const int64_t unary[2] = {agents_.agent(0).unary_calls(), agents_.agent(1).unary_calls()};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(unary[r], 2) << "rank " << r;
    EXPECT_TRUE(agents_.agent(r).steps().empty());
  }
  ASSERT_TRUE(engine_->ForceRemap(2).ok());
  EXPECT_EQ(PoolBlocks(), 72) << "min(64 + 2 x 8, 60 + 2 x 6)";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 2);
    EXPECT_EQ(agents_.agent(r).unary_calls(), unary[r]) << "rank " << r << ": no query";
    const std::vector<vamp::v1::StepRequest> steps = agents_.agent(r).steps();
    ASSERT_EQ(steps.size(), 1u) << "rank " << r << ": one step round";
    ASSERT_EQ(steps[0].remaps_size(), 1);
    EXPECT_EQ(steps[0].remaps(0).expected_kv_blocks(), 72);
  }
  ASSERT_TRUE(engine_->ForceRemap(-2).ok());
  EXPECT_EQ(PoolBlocks(), 60);
  EXPECT_EQ(agents_.agent(0).offloaded_groups(), 0);
  EXPECT_EQ(agents_.agent(0).steps().size(), 2u);
  EXPECT_EQ(agents_.agent(1).unary_calls(), unary[1]);
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->ForceRemap(-1))) << "nothing is offloaded";
  EXPECT_TRUE(absl::IsInvalidArgument(engine_->ForceRemap(0)));
}

TEST_F(ServingEngineTest, AnOffloadOneRankFailsIsRolledBackAndServingGoesOn) {
  agents_.agent(1).FailNextRemap("cannot map the expert pages");
  absl::Status s = engine_->ForceRemap(1);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("agent rank 1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot map the expert pages"));
  EXPECT_EQ(PoolBlocks(), 60);
  // The rollback rides the next step, which the engine sends at once.
  EXPECT_TRUE(WaitUntil([&] { return agents_.agent(0).rollbacks().size() == 1; }));
  EXPECT_EQ(agents_.agent(0).offloaded_groups(), 0) << "rank 0's applied remap was undone";
  EXPECT_EQ(agents_.agent(0).kv_blocks(), 64) << "as before: its own region";
  EXPECT_EQ(agents_.agent(1).kv_blocks(), 60);
  EXPECT_TRUE(engine_->healthy());
  const absl::Status paused = engine_->ForceRemap(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(paused)) << paused;
  EXPECT_THAT(std::string(paused.message()), HasSubstr("retry later"));
  EventLog log;
  ASSERT_TRUE(engine_->Submit(Request(8, 3), log.Sink()).ok());
  ASSERT_TRUE(log.WaitFinished());
  EXPECT_EQ(log.events().back().finish_reason, FinishReason::kLength);
}

// An offload forced while a request decodes, which rank 1 refuses: every rank refuses that step,
// the next one rolls the remap back and runs the same work, and the stream never notices.
TEST_F(ServingEngineTest, ARefusedStepIsRunAgainAfterTheRollback) {
  EventLog log;
  ASSERT_TRUE(engine_->Submit(Request(20, 60), log.Sink()).ok());
  ASSERT_TRUE(log.WaitEvents(3));
  agents_.agent(1).FailNextRemap("cannot map the expert pages");
  EXPECT_FALSE(engine_->ForceRemap(1).ok());
  ASSERT_TRUE(log.WaitFinished());
  const std::vector<EngineEvent> events = log.events();
  EXPECT_EQ(events.back().finish_reason, FinishReason::kLength);
  EXPECT_TRUE(events.back().error.empty());
  EXPECT_EQ(log.tokens().size(), 60u) << "no token lost or repeated";
  EXPECT_THAT(log.tokens(), Each(7));
  // The refused step and the one after it carry the same work; the latter rolls back.
  const std::vector<vamp::v1::StepRequest> steps = agents_.agent(1).steps();
  size_t refused = 0;
  while (refused < steps.size() && steps[refused].remaps_size() == 0) ++refused;
  ASSERT_LT(refused + 1, steps.size());
  const vamp::v1::StepRequest& rerun = steps[refused + 1];
  ASSERT_EQ(rerun.rollback_remap_ids_size(), 1);
  EXPECT_EQ(rerun.rollback_remap_ids(0), steps[refused].remaps(0).remap_id());
  ASSERT_EQ(rerun.cached_requests_size(), steps[refused].cached_requests_size());
  for (int i = 0; i < rerun.cached_requests_size(); ++i) {
    EXPECT_EQ(rerun.cached_requests(i).request_id(),
              steps[refused].cached_requests(i).request_id());
    EXPECT_EQ(rerun.cached_requests(i).num_computed_tokens(),
              steps[refused].cached_requests(i).num_computed_tokens());
    EXPECT_EQ(rerun.cached_requests(i).num_scheduled_tokens(),
              steps[refused].cached_requests(i).num_scheduled_tokens());
  }
  EXPECT_LE(rerun.num_blocks(), 60) << "planned on the pool before the offload";
  EXPECT_EQ(PoolBlocks(), 60);
  EXPECT_TRUE(engine_->healthy());
}

// The reviewer's case: the agents applied a remap but one of them reports another pool than the
// controller's view. The controller must not go on with a view the agents do not share.
TEST_F(ServingEngineTest, ARankReportingAnotherPoolAfterARemapStopsTheEngineNamingIt) {
  EventLog log;
  ASSERT_TRUE(engine_->Submit(Request(8, 400), log.Sink()).ok());
  ASSERT_TRUE(log.WaitEvents(1));
  agents_.agent(1).ReportKvBlocks(1000, /*from_next_remap=*/true);
  EXPECT_FALSE(engine_->ForceRemap(1).ok());
  ASSERT_TRUE(log.WaitFinished()) << "failed, not hung";
  const EngineEvent last = log.events().back();
  EXPECT_EQ(last.finish_reason, FinishReason::kAbort);
  EXPECT_THAT(last.error, HasSubstr("agent rank 1 reported memory.kv_blocks = 1000"));
  EXPECT_TRUE(WaitUntil([&] { return !engine_->healthy(); }));
}

TEST_F(ServingEngineTest, ARankThatDiesFailsEveryLiveRequestNamingIt) {
  EventLog first, second;
  ASSERT_TRUE(engine_->Submit(Request(8, 400), first.Sink()).ok());
  ASSERT_TRUE(engine_->Submit(Request(12, 400), second.Sink()).ok());
  ASSERT_TRUE(first.WaitEvents(1));
  agents_.agent(1).BreakStreamAtNextStep();
  for (EventLog* log : {&first, &second}) {
    ASSERT_TRUE(log->WaitFinished()) << "failed, not hung";
    const EngineEvent last = log->events().back();
    EXPECT_EQ(last.finish_reason, FinishReason::kAbort);
    EXPECT_THAT(last.error, HasSubstr("agent rank 1"));
  }
  EXPECT_TRUE(WaitUntil([&] { return !engine_->healthy(); }));
  EventLog late;
  absl::StatusOr<RequestId> refused = engine_->Submit(Request(8, 2), late.Sink());
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_TRUE(absl::IsUnavailable(engine_->ForceRemap(1)));
}

namespace prompt_logprobs_test {

// The NewRequest the agents got for request `id`.
std::optional<vamp::v1::NewRequest> Announced(testing::FakeAgentService& agent, RequestId id) {
  for (const vamp::v1::StepRequest& s : agent.steps()) {
    for (const vamp::v1::NewRequest& r : s.new_requests()) {
      if (r.request_id() == id) return r;
    }
  }
  return std::nullopt;
}

}  // namespace prompt_logprobs_test

// ServingRequest::prompt_logprobs: the agents are asked for them, the request skips the prefix
// cache, and the first output event carries the log-probabilities of prompt tokens 1..P-1 with k
// alternatives, assembled from the steps of a chunked prefill, positions an agent reports again
// (as after a preemption) counted once; later events and requests that did not ask carry none.
TEST_F(ServingEngineTest, PromptLogprobsComeWithTheFirstOutputAndSkipThePrefixCache) {
  using prompt_logprobs_test::Announced;
  engine_.reset();
  ServingEngineOptions options;
  options.scheduler.max_model_len = 512;
  options.scheduler.max_num_batched_tokens = 16;  // a 40-token prompt takes three steps
  options.arbiter = "static";
  options.ranks = agents_.init_responses();
  options.model_name = "fake-model";
  absl::StatusOr<std::unique_ptr<ServingEngine>> engine =
      ServingEngine::Start(agents_.group(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  engine_ = *std::move(engine);
  agents_.agent(0).SetPromptLogprobsOverlap(5);
  constexpr int32_t kPrompt = 40, kTop = 2;

  // A plain request first: its prompt's blocks enter the prefix cache.
  EventLog plain_log;
  absl::StatusOr<RequestId> plain = engine_->Submit(Request(kPrompt, 2), plain_log.Sink());
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(plain_log.WaitFinished());
  for (const EngineEvent& e : plain_log.events()) EXPECT_FALSE(e.has_prompt_logprobs);

  ServingRequest asks = Request(kPrompt, 3);
  asks.prompt_logprobs = true;
  asks.sampling.num_top_logprobs = kTop;
  EventLog log;
  absl::StatusOr<RequestId> id = engine_->Submit(asks, log.Sink());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(log.WaitFinished());
  const std::vector<EngineEvent> events = log.events();
  ASSERT_EQ(events.size(), 3u);
  const EngineEvent& first = events[0];
  ASSERT_TRUE(first.has_prompt_logprobs);
  ASSERT_EQ(first.prompt_logprobs.size(), static_cast<size_t>(kPrompt - 1));
  ASSERT_EQ(first.prompt_top_token_ids.size(), static_cast<size_t>((kPrompt - 1) * kTop));
  ASSERT_EQ(first.prompt_top_logprobs.size(), first.prompt_top_token_ids.size());
  for (int32_t pos = 1; pos < kPrompt; ++pos) {
    EXPECT_EQ(first.prompt_logprobs[pos - 1], testing::FakePromptLogprob(pos, 0)) << pos;
    for (int32_t j = 0; j < kTop; ++j) {
      EXPECT_EQ(first.prompt_top_token_ids[(pos - 1) * kTop + j], (pos + j) % 256);
      EXPECT_EQ(first.prompt_top_logprobs[(pos - 1) * kTop + j],
                testing::FakePromptLogprob(pos, j + 1));
    }
  }
  EXPECT_FALSE(events[1].has_prompt_logprobs);
  EXPECT_FALSE(events[2].has_prompt_logprobs);
  // Asked of the agents; no prefix hit although the same prompt is cached.
  std::optional<vamp::v1::NewRequest> announced = Announced(agents_.agent(0), *id);
  ASSERT_TRUE(announced.has_value());
  EXPECT_TRUE(announced->prompt_logprobs());
  EXPECT_EQ(announced->num_computed_tokens(), 0);
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  // The same prompt without the flag hits the cache (the plain request's blocks are there).
  EventLog again_log;
  absl::StatusOr<RequestId> again = engine_->Submit(Request(kPrompt, 1), again_log.Sink());
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again_log.WaitFinished());
  std::optional<vamp::v1::NewRequest> hit = Announced(agents_.agent(0), *again);
  ASSERT_TRUE(hit.has_value());
  EXPECT_FALSE(hit->prompt_logprobs());
  EXPECT_GT(hit->num_computed_tokens(), 0);
}

}  // namespace
}  // namespace vamp
