// A CPU stand-in for the agents in scheduler tests: follows the StepPlan contract (step_plan.h),
// rebuilding each request's tokens and block table from the plans' diffs alone, checks every plan
// against its own view, and answers with deterministic "sampled" tokens.
#ifndef VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_
#define VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/core/step_plan.h"

namespace vamp::testing {

class FakeAgent {
 public:
  // sampler(request id, number of tokens the request has) → the next token.
  using Sampler = std::function<TokenId(RequestId, int32_t)>;
  explicit FakeAgent(Sampler sampler) : sampler_(std::move(sampler)) {}

  struct RequestState {
    std::vector<TokenId> tokens;
    std::vector<BlockId> table;
    bool preempted = false;
    int32_t computed = 0;
  };

  // Applies the plan; returns the tokens sampled, or an error describing a contract violation,
  // among them a request that still holds a block past the plan's pool once the plan's finished
  // and preempted ids are applied (a restore shrank the pool under it).
  absl::StatusOr<StepOutput> Execute(const StepPlan& plan, int32_t block_size);

  // Ordered so that iteration is deterministic.
  const std::map<RequestId, RequestState>& requests() const { return requests_; }

 private:
  // A plan's finished and preempted ids.
  absl::Status Release(int64_t step, const std::vector<RequestId>& finished,
                       const std::vector<RequestId>& preempted);

  Sampler sampler_;
  std::map<RequestId, RequestState> requests_;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_
