// Step execution: one StepRequest's request diffs (finished, preempted, new and cached requests;
// controller/core/step_plan.h is the contract) checked against what this rank holds, turned into
// the runner's StepInput, run, and the sampled tokens packed into the StepResponse. Keeps each
// request's tokens and sampling parameters between steps: what survives a preemption (which
// removes the request from the runner).
//
// Not thread-safe: the agent engine serialises steps.
#ifndef VAMP_AGENT_STEP_EXECUTOR_H_
#define VAMP_AGENT_STEP_EXECUTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

// The runner's sampling parameters of `s`; InvalidArgument naming `field` for values out of range
// or that this agent's sampler does not support.
absl::StatusOr<RunnerSamplingParams> ToRunnerSampling(const vamp::v1::SamplingParams& s,
                                                      const std::string& field);

struct StepExecutorOptions {
  // Requests may ask for prompt log-probabilities (the agent declared
  // InitResponse.prompt_logprobs_supported); otherwise a step whose new request asks is refused.
  bool prompt_logprobs_supported = false;
  // This rank returns them in StepResponse.prompt_logprobs (rank 0: every rank computes the same
  // values, the controller reads rank 0's).
  bool return_prompt_logprobs = true;
};

class StepExecutor {
 public:
  void set_options(const StepExecutorOptions& options) { options_ = options; }

  // Runs `request`'s request diffs and forward pass on `runner`, whose KV pool has `pool` blocks,
  // for a vocabulary of `vocab` tokens, appending sampled tokens, prompt log-probabilities and
  // the forward time to `response`. Errors name the field (e.g. "cached_requests[0].request_id 7 is
  // unknown"); nothing of a rejected step is applied. A failure in the forward pass leaves the
  // runner's diffs applied, and this executor mirrors them.
  absl::Status Run(const vamp::v1::StepRequest& request, int64_t pool, int64_t vocab,
                   ModelRunner& runner, vamp::v1::StepResponse* response);
  // Forgets every request (the runner was replaced).
  void Clear() { requests_.clear(); }
  size_t size() const { return requests_.size(); }

 private:
  // One request the agent holds between steps. The runner has the live copy of its state; this is
  // what survives a preemption (which removes it from the runner).
  struct RequestState {
    // Prompt plus every token sampled so far; the first num_prompt_tokens are the prompt.
    std::vector<int32_t> tokens;
    int32_t num_prompt_tokens = 0;
    RunnerSamplingParams sampling;
    // In the runner's batch (false while preempted).
    bool in_runner = false;
  };

  StepExecutorOptions options_;
  absl::flat_hash_map<uint64_t, RequestState> requests_;
};

}  // namespace vamp

#endif  // VAMP_AGENT_STEP_EXECUTOR_H_
