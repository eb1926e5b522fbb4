// A generation request as the scheduler sees it: its tokens (prompt, then outputs), its progress
// through prefill and decode, its place in the lifecycle, and its KV block table.
//
// Lifecycle:  kWaiting ──admit──▶ kRunning ──stop/length──▶ kFinished
//                 ▲                  │  ▲
//                 │               preempt │ resume (recompute from the prefix cache)
//                 │                  ▼  │
//                 └──────────────  kPreempted
// Abort moves any live state to kFinished with FinishReason::kAbort.
//
// Mutators are for the scheduler and the KV cache manager; everyone else reads.
#ifndef VAMP_CONTROLLER_CORE_REQUEST_H_
#define VAMP_CONTROLLER_CORE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "controller/core/block_hash.h"
#include "controller/core/kv_block.h"
#include "controller/core/sampling_params.h"

namespace vamp {

// Chosen by the caller (the frontend maps its external ids onto these); unique among live requests.
using RequestId = uint64_t;

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason {
  kNone,    // not finished
  kStop,    // EOS or a stop token (stop_token_id says which)
  kLength,  // max_tokens or max_model_len reached
  kAbort,   // aborted by the client or the server
};
absl::string_view RequestStatusName(RequestStatus s);
absl::string_view FinishReasonName(FinishReason r);

// What a caller submits.
struct RequestSpec {
  RequestId id = 0;
  std::vector<TokenId> prompt_token_ids;
  SamplingParams sampling_params;
  // The model's end-of-sequence token; unset disables EOS stopping.
  std::optional<TokenId> eos_token_id;
  // Lower values are scheduled first under the priority policy (ignored by FCFS).
  int32_t priority = 0;
  // Extra prefix-cache key: requests share cached KV only when their salts are equal.
  std::string cache_salt;
  // Compute the whole prompt, finding no cached prefix (its blocks still enter the cache for
  // others): a request that needs its prompt's logits (prompt logprobs) cannot start from cached
  // KV, which has none. Such admissions are no prefix-cache lookups (PrefixCacheStats) and no
  // reuse evidence (ReuseTracker).
  bool skip_prefix_cache_reads = false;
  // Optional: the prefix-cache hashes of every full block of the prompt, computed where the prompt
  // arrives (Scheduler::HashPromptBlocks, on a frontend thread) so that the scheduling thread does
  // not spend its step on them (a 32k-token prompt is 2,048 blocks, ≈ 0.1 ms). Empty: the
  // scheduler hashes the blocks itself, as far as it needs them. The hashes must be those of
  // exactly this prompt and cache_salt under the scheduler's block size and hash key; AddRequest
  // checks their number and recomputes the first and last block's to catch a mismatch.
  std::vector<BlockHash> prompt_block_hashes;
  // When the request arrived (µs, the scheduler clock's timebase); unset means "now".
  std::optional<int64_t> arrival_micros;
};

class Request {
 public:
  // `seq` is the scheduler's admission counter: a total order that breaks ties deterministically.
  Request(RequestSpec spec, int64_t arrival_micros, uint64_t seq);

  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // ---- Identity and parameters ----
  RequestId id() const { return id_; }
  uint64_t seq() const { return seq_; }
  const SamplingParams& sampling_params() const { return sampling_params_; }
  std::optional<TokenId> eos_token_id() const { return eos_token_id_; }
  int32_t priority() const { return priority_; }
  const std::string& cache_salt() const { return cache_salt_; }
  bool skip_prefix_cache_reads() const { return skip_prefix_cache_reads_; }
  int64_t arrival_micros() const { return arrival_micros_; }

  // ---- Tokens ----
  absl::Span<const TokenId> all_token_ids() const { return tokens_; }
  absl::Span<const TokenId> prompt_token_ids() const {
    return absl::MakeConstSpan(tokens_.data(), num_prompt_tokens_);
  }
  absl::Span<const TokenId> output_token_ids() const {
    return absl::MakeConstSpan(tokens_).subspan(num_prompt_tokens_);
  }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }

  // ---- Progress ----
  RequestStatus status() const { return status_; }
  bool is_finished() const { return status_ == RequestStatus::kFinished; }
  FinishReason finish_reason() const { return finish_reason_; }
  // The stop token that ended the request (kStop only).
  std::optional<TokenId> stop_token_id() const { return stop_token_id_; }
  // Tokens whose KV is (or, within the step in flight, will be) in the cache.
  int32_t num_computed_tokens() const { return num_computed_tokens_; }
  // Tokens whose KV is not computed yet: 1 for a decoding request (its latest sampled token), more
  // while a prefill (first or after preemption) is under way.
  int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }
  // Prefix-cache hit of the first admission in tokens, -1 before it.
  int32_t num_cached_tokens() const { return num_cached_tokens_; }
  int32_t num_preemptions() const { return num_preemptions_; }
  // When the request last entered the waiting queue (arrival, or its latest preemption), µs.
  int64_t queued_since_micros() const { return queued_since_micros_; }
  // Whether agents know this request (it appeared in a StepPlan as new). A preempted request that
  // agents know resumes as a cached request instead of being announced again.
  bool known_to_agents() const { return known_to_agents_; }
  // Output tokens the request may still produce under max_tokens and `max_model_len`.
  int32_t RemainingOutputBudget(int32_t max_model_len) const;

  // ---- KV state ----
  const std::vector<BlockId>& block_ids() const { return block_ids_; }
  // Leading blocks already offered to the prefix cache.
  int32_t num_cached_blocks() const { return num_cached_blocks_; }
  // Chained hashes of the leading full blocks computed so far: the spec's prompt_block_hashes,
  // extended lazily (BlockHasher::ExtendChain, so the same tokens give the same chain however
  // they arrived).
  const std::vector<BlockHash>& block_hashes() const { return block_hashes_; }
  // Extends block_hashes() to the first `n` full blocks; requires n * block_size <= num_tokens().
  void EnsureBlockHashes(int32_t n, int32_t block_size, const BlockHasher& hasher);

  // ---- Recurrent-state snapshot (models with recurrent state; KvCacheManager) ----
  // The snapshot the request holds while its steps capture into it, or kNoSnapshot.
  SnapshotId snapshot() const { return snapshot_; }
  // Tokens whose state it holds: the latest capture whose step's output was applied (0: none).
  int32_t snapshot_tokens() const { return snapshot_tokens_; }
  // Tokens of the capture into it that the step in flight makes (0: none).
  int32_t capture_in_flight() const { return capture_in_flight_; }

  // ---- Mutators (scheduler and KV cache manager) ----
  void set_status(RequestStatus s) { status_ = s; }
  void set_num_computed_tokens(int32_t n) { num_computed_tokens_ = n; }
  void set_num_cached_tokens(int32_t n) { num_cached_tokens_ = n; }
  void set_queued_since_micros(int64_t t) { queued_since_micros_ = t; }
  void set_known_to_agents(bool known = true) { known_to_agents_ = known; }
  void count_preemption() { ++num_preemptions_; }
  void Finish(FinishReason reason, std::optional<TokenId> stop_token = std::nullopt);
  // Appends one sampled token and applies the stop conditions in vLLM's order: length (max_tokens,
  // max_model_len), then nothing before min_tokens, then EOS (unless ignore_eos), then stop tokens.
  // Returns true when the request is finished by this token.
  bool AppendOutputToken(TokenId token, int32_t max_model_len);
  std::vector<BlockId>& mutable_block_ids() { return block_ids_; }
  void set_num_cached_blocks(int32_t n) { num_cached_blocks_ = n; }
  void set_snapshot(SnapshotId id, int32_t tokens) {
    snapshot_ = id;
    snapshot_tokens_ = tokens;
  }
  void set_capture_in_flight(int32_t tokens) { capture_in_flight_ = tokens; }

 private:
  const RequestId id_;
  const uint64_t seq_;
  const SamplingParams sampling_params_;
  const std::optional<TokenId> eos_token_id_;
  const int32_t priority_;
  const std::string cache_salt_;
  const bool skip_prefix_cache_reads_;
  const int64_t arrival_micros_;
  const int32_t num_prompt_tokens_;

  std::vector<TokenId> tokens_;
  RequestStatus status_ = RequestStatus::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::optional<TokenId> stop_token_id_;
  int32_t num_computed_tokens_ = 0;
  int32_t num_cached_tokens_ = -1;
  int32_t num_preemptions_ = 0;
  int64_t queued_since_micros_;
  bool known_to_agents_ = false;

  std::vector<BlockId> block_ids_;
  int32_t num_cached_blocks_ = 0;
  std::vector<BlockHash> block_hashes_;
  SnapshotId snapshot_ = kNoSnapshot;
  int32_t snapshot_tokens_ = 0;
  int32_t capture_in_flight_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_REQUEST_H_
