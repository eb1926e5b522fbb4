#include "controller/core/request.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace vamp {

absl::string_view RequestStatusName(RequestStatus s) {
  switch (s) {
    case RequestStatus::kWaiting:
      return "waiting";
    case RequestStatus::kRunning:
      return "running";
    case RequestStatus::kPreempted:
      return "preempted";
    case RequestStatus::kFinished:
      return "finished";
  }
  return "?";
}

absl::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

Request::Request(RequestSpec spec, int64_t arrival_micros, uint64_t seq)
    : id_(spec.id),
      seq_(seq),
      sampling_params_(std::move(spec.sampling_params)),
      eos_token_id_(spec.eos_token_id),
      priority_(spec.priority),
      cache_salt_(std::move(spec.cache_salt)),
      skip_prefix_cache_reads_(spec.skip_prefix_cache_reads),
      arrival_micros_(arrival_micros),
      num_prompt_tokens_(static_cast<int32_t>(spec.prompt_token_ids.size())),
      tokens_(std::move(spec.prompt_token_ids)),
      queued_since_micros_(arrival_micros),
      block_hashes_(std::move(spec.prompt_block_hashes)) {}

int32_t Request::RemainingOutputBudget(int32_t max_model_len) const {
  int32_t limit = max_model_len - num_prompt_tokens_;
  if (sampling_params_.max_tokens.has_value())
    limit = std::min(limit, *sampling_params_.max_tokens);
  return std::max(0, limit - num_output_tokens());
}

void Request::EnsureBlockHashes(int32_t n, int32_t block_size, const BlockHasher& hasher) {
  VAMP_CHECK(static_cast<int64_t>(n) * block_size <= num_tokens())
      << "request " << id_ << ": " << n << " full blocks of " << block_size << " need more than "
      << num_tokens() << " tokens";
  if (static_cast<int32_t>(block_hashes_.size()) >= n) return;
  hasher.ExtendChain(tokens_, block_size, cache_salt_, static_cast<size_t>(n), &block_hashes_);
}

void Request::Finish(FinishReason reason, std::optional<TokenId> stop_token) {
  status_ = RequestStatus::kFinished;
  finish_reason_ = reason;
  stop_token_id_ = stop_token;
}

bool Request::AppendOutputToken(TokenId token, int32_t max_model_len) {
  VAMP_CHECK(!is_finished()) << "request " << id_ << " is finished";
  tokens_.push_back(token);
  const int32_t outputs = num_output_tokens();
  if (num_tokens() >= max_model_len ||
      (sampling_params_.max_tokens.has_value() && outputs >= *sampling_params_.max_tokens)) {
    Finish(FinishReason::kLength);
    return true;
  }
  if (outputs < sampling_params_.min_tokens) return false;
  if (!sampling_params_.ignore_eos && eos_token_id_.has_value() && token == *eos_token_id_) {
    Finish(FinishReason::kStop, token);
    return true;
  }
  const auto& stops = sampling_params_.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
    Finish(FinishReason::kStop, token);
    return true;
  }
  return false;
}

}  // namespace vamp
