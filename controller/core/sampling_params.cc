#include "controller/core/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace vamp {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("sampling_params.", field, ": ", what));
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (max_tokens.has_value() && *max_tokens < 1) {
    return Bad("max_tokens", absl::StrCat("must be >= 1, got ", *max_tokens));
  }
  if (min_tokens < 0) return Bad("min_tokens", absl::StrCat("must be >= 0, got ", min_tokens));
  if (max_tokens.has_value() && min_tokens > *max_tokens) {
    return Bad("min_tokens",
               absl::StrCat("must be <= max_tokens (", *max_tokens, "), got ", min_tokens));
  }
  for (TokenId t : stop_token_ids) {
    if (t < 0) return Bad("stop_token_ids", absl::StrCat("token ids must be >= 0, got ", t));
  }
  if (!std::isfinite(temperature) || temperature < 0) {
    return Bad("temperature", absl::StrCat("must be >= 0, got ", temperature));
  }
  if (!(top_p > 0 && top_p <= 1))
    return Bad("top_p", absl::StrCat("must be in (0, 1], got ", top_p));
  if (top_k < 0) return Bad("top_k", absl::StrCat("must be >= 0 (0 disables), got ", top_k));
  if (!(min_p >= 0 && min_p <= 1))
    return Bad("min_p", absl::StrCat("must be in [0, 1], got ", min_p));
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    return Bad("presence_penalty", absl::StrCat("must be in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return Bad("frequency_penalty", absl::StrCat("must be in [-2, 2], got ", frequency_penalty));
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0)) {
    return Bad("repetition_penalty", absl::StrCat("must be > 0, got ", repetition_penalty));
  }
  if (num_top_logprobs < 0 || num_top_logprobs > 20) {
    return Bad("num_top_logprobs", absl::StrCat("must be in [0, 20], got ", num_top_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace vamp
