// Per-request generation parameters. The controller uses the length and stop fields to decide when
// a request finishes; agents use the sampling fields to pick tokens (they travel in StepPlan).
#ifndef VAMP_CONTROLLER_CORE_SAMPLING_PARAMS_H_
#define VAMP_CONTROLLER_CORE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "controller/core/block_hash.h"

namespace vamp {

struct SamplingParams {
  // ---- Length and stop conditions (controller) ----
  // Most output tokens; unset means "until max_model_len".
  std::optional<int32_t> max_tokens;
  // Stop tokens (EOS and stop_token_ids) are ignored until this many outputs exist.
  int32_t min_tokens = 0;
  // Generation stops after any of these tokens (which is kept in the output).
  std::vector<TokenId> stop_token_ids;
  // Keep generating past the model's EOS token.
  bool ignore_eos = false;

  // ---- Sampling (agents) ----
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = disabled
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  // Alternatives the agents return with each sampled token (most likely first), 0..20.
  int32_t num_top_logprobs = 0;

  // InvalidArgument naming the offending field ("sampling_params.top_p: ...").
  absl::Status Validate() const;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SAMPLING_PARAMS_H_
