// What the ModelRunner receives each step and what it returns. Modelled on vLLM v1's scheduler
// output: a request's static data (prompt, sampling parameters) travels once, when it is new; after
// that only deltas do (new KV blocks, progress, finished ids). The runner keeps the rest in its
// persistent batch, including the tokens it sampled itself. The agent translates the controller's
// StepPlan into this struct.
//
// Units: tokens and KV block ids (indices into the rank's KV pool).
#ifndef VAMP_ENGINE_RUNNER_STEP_INPUT_H_
#define VAMP_ENGINE_RUNNER_STEP_INPUT_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace vamp {

using RunnerRequestId = uint64_t;

struct RunnerSamplingParams {
  float temperature = 1.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: disabled
  float top_p = 1.0f;        // (0, 1]; 1: disabled
  // Per-request seed: the same seed gives the same tokens however the request is batched. Unset:
  // derived from the runner's seed and the request id (identical on every tensor-parallel rank).
  std::optional<uint64_t> seed;
  // vLLM's semantics (kernels::cpu::ProcessLogits): repetition over prompt and output tokens
  // (1 = off, > 0), frequency and presence over output tokens (0 = off), min_p relative to the
  // most likely token after temperature (0 = off, [0, 1]).
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float min_p = 0.0f;
  // Until min_tokens outputs exist, these tokens (EOS and stop_token_ids) cannot be sampled.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_banned_ids;  // distinct, in [0, vocab)
  // Alternatives returned with each sampled token: 0..kernels::cpu::kMaxTopLogprobs.
  int32_t num_top_logprobs = 0;
  // Return the log-probability of every prompt token after the first (StepOutput::
  // prompt_logprobs), with num_top_logprobs alternatives each, from the steps that compute the
  // prompt's positions: their logits rows are computed too, so the step samples on the host.
  bool prompt_logprobs = false;

  // Whether the logits need ProcessLogits before sampling (at some step).
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
  bool needs_processing() const {
    return has_penalties() || min_p > 0.0f || (min_tokens > 0 && !min_tokens_banned_ids.empty());
  }
};

// A copy of a request's whole recurrent state (models with recurrent state: Qwen3-Next's linear
// attention) kept in KV blocks that no request's table holds: where a prefix-cache hit on such a
// model resumes (ModelRunner keeps them).
struct StateSnapshotBlocks {
  // The state after this many of the request's tokens; 0 = no snapshot.
  int32_t num_tokens = 0;
  // The blocks holding it, in order: at least ModelRunner::snapshot_blocks() of them.
  std::vector<int32_t> block_ids;

  bool empty() const { return num_tokens == 0; }
};

// A request the runner has not seen (or has forgotten, e.g. after an agent restart).
struct NewRequestData {
  RunnerRequestId id = 0;
  // Every token known so far: the prompt, plus earlier outputs when a request is re-sent.
  std::vector<int32_t> prompt_token_ids;
  // Its KV block table; blocks covering num_computed_tokens already hold their K/V.
  std::vector<int32_t> block_ids;
  // Tokens whose KV is already cached (a prefix-cache hit): computation starts after them.
  int32_t num_computed_tokens = 0;
  RunnerSamplingParams sampling;
  // How many of prompt_token_ids are the request's prompt (the rest are outputs, which the
  // penalties and min_tokens count); 0 means all of them.
  int32_t num_prompt_tokens = 0;
  // A prefix-cache hit on a model with recurrent state (num_computed_tokens > 0): the snapshot
  // taken after exactly num_computed_tokens of these tokens, which the runner restores into the
  // request's slot. Empty otherwise.
  StateSnapshotBlocks restore_state;
};

// Changes to a request the runner already holds.
struct CachedRequestData {
  RunnerRequestId id = 0;
  // Appended to the block table, or replacing it when resumed_from_preemption.
  std::vector<int32_t> new_block_ids;
  // Tokens computed before this step, as the scheduler sees it. A running request's value equals
  // the runner's own count; a resumed request may restart lower (recompute after preemption, less
  // any prefix-cache hit).
  int32_t num_computed_tokens = 0;
  bool resumed_from_preemption = false;
  // Resumed with num_computed_tokens > 0 on a model with recurrent state: as NewRequestData's.
  StateSnapshotBlocks restore_state;
};

struct ScheduledRequest {
  RunnerRequestId id = 0;
  int32_t num_tokens = 0;  // tokens to compute this step (a prefill chunk, or 1 to decode)
  // Copy the request's recurrent state after capture_state.num_tokens of its tokens (a point in
  // this step's range) into capture_state.block_ids, for later prefix-cache hits to restore.
  // Empty: no copy.
  StateSnapshotBlocks capture_state;
};

struct StepInput {
  std::vector<NewRequestData> new_requests;
  std::vector<CachedRequestData> cached_requests;
  // Requests to forget (finished or aborted); applied first.
  std::vector<RunnerRequestId> finished_ids;
  // The batch, in order. Requests not listed stay in the persistent batch untouched.
  std::vector<ScheduledRequest> scheduled;
  // Return the logits of every computed position, not only the sampled ones (tests, scoring).
  bool return_all_logits = false;
};

struct SampledToken {
  RunnerRequestId id = 0;
  int32_t token = 0;
  // Log-probability under the model's raw logits: log_softmax before the request's penalties,
  // min_tokens bans, temperature, min_p, top-k and top-p (vLLM's default logprobs mode), which
  // only shape what is sampled.
  float logprob = 0.0f;
  // The request's num_top_logprobs most likely tokens under the same raw logits, descending
  // (ties: lower id first), with their log-probabilities computed as `logprob` is (the sampled
  // token's entry, when it is among them, equals `logprob`); empty when it asked for none.
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
};

// Prompt tokens [first_position, first_position + logprobs.size()) of a request that asked
// (RunnerSamplingParams::prompt_logprobs): each one's log-probability under the raw logits of the
// position before it, and num_top_logprobs alternatives each ([count, k], most likely first,
// ties to the lower id), computed as SampledToken's are.
struct PromptLogprobs {
  RunnerRequestId id = 0;
  int32_t first_position = 0;  // >= 1: position 0 follows no logits
  std::vector<float> logprobs;
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
};

struct StepOutput {
  // One token per scheduled request that consumed all of its known tokens this step (decodes and
  // final prefill chunks), in batch order. The runner has appended it to the request's tokens.
  std::vector<SampledToken> sampled;
  // With return_all_logits: per scheduled request, in batch order, [num_tokens, vocab] floats.
  std::vector<std::vector<float>> logits;
  // Per scheduled request that asked for prompt log-probabilities and computed prompt positions
  // with a successor in the prompt this step, in batch order: the successors' log-probabilities.
  // A recomputed request (resumed after preemption) reports its positions again.
  std::vector<PromptLogprobs> prompt_logprobs;
  int64_t num_tokens = 0;
  // Wall time of the forward pass (including device-side sampling when the model samples on its
  // device) and of host-side sampling (bookkeeping only when the device sampled).
  double forward_us = 0;
  double sample_us = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_STEP_INPUT_H_
