// Every knob of the scheduler and the KV cache manager, with defaults (vLLM's where they exist).
// The struct is the configuration; AddSchedulerConfigFields/SchedulerConfigFromConfig expose the
// same fields to config files and flags for the controller and the simulator.
#ifndef VAMP_CONTROLLER_CORE_SCHEDULER_CONFIG_H_
#define VAMP_CONTROLLER_CORE_SCHEDULER_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "controller/core/block_hash.h"

namespace vamp {

enum class SchedulingPolicy {
  kFcfs,      // arrival order; preemption takes the most recently admitted running request
  kPriority,  // (priority, arrival) order, lower first; preemption takes the largest key
};
absl::string_view SchedulingPolicyName(SchedulingPolicy p);

struct SchedulerConfig {
  // Tokens per KV block.
  int32_t block_size = 16;
  // Initial pool size in blocks (the minimum over the agents' capacity reports). Required (> 0).
  int32_t num_blocks = 0;
  // Token budget of one step (prefill and decode tokens together).
  int32_t max_num_batched_tokens = 8192;
  // Most requests running at once.
  int32_t max_num_seqs = 256;
  // Most tokens (prompt + output) of one request. Must fit in the pool.
  int32_t max_model_len = 32768;
  bool enable_prefix_caching = true;
  // Split long prefills across steps; when off, a prompt is admitted only if it fits the budget.
  bool enable_chunked_prefill = true;
  // Most prefill tokens one request may take per step (0 = no limit), so a long prompt cannot
  // starve the others.
  int32_t long_prefill_token_threshold = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // SipHash key of the prefix cache (see block_hash.h). Reproducible by default.
  uint64_t prefix_cache_hash_key0 = BlockHasher::kDefaultKey0;
  uint64_t prefix_cache_hash_key1 = BlockHasher::kDefaultKey1;
  // Models with recurrent state (Qwen3-Next's linear attention): the KV blocks one snapshot of a
  // request's state fills, the most over the agents' ranks (from their InitResponse, not a flag);
  // 0 for attention-only models. With prefix caching, hits then end at blocks that carry a
  // snapshot (KvCacheManager).
  int32_t recurrent_state_blocks = 0;
  // With recurrent state: besides the snapshot at each prompt's last block boundary, keep one at
  // the last block boundary each request's output reaches (where the next turn of a conversation
  // continues), at recurrent_state_blocks more blocks per running request.
  bool snapshot_outputs = true;
  // While the arbiter reports that more concurrency does not pay (MemoryArbiter::ConcurrencyPays:
  // the VAMP arbiter, while recent steps left requests queued for compute), admit a waiting
  // request only while the blocks no eviction frees (with the request's new ones) fit the pool
  // without the offloaded groups' blocks, i.e. what a static split holds. The groups then keep
  // cached prefixes and let running requests grow without preemption, but do not raise
  // concurrency: on a compute-bound GPU a larger running batch slows every request's decoding
  // (TPOT) for no more tokens per second. Measured in vamp-sim
  // (bench/results/2026-12-03-admit-within-baseline/).
  bool admit_within_baseline = true;

  // InvalidArgument naming the field when a value or a combination is impossible.
  absl::Status Validate() const;
};

// Declares the fields (names as in the struct; prefix_cache_hash_key is 32 hex digits or empty for
// the default; num_blocks is "num_kv_blocks", 0 meaning "from the agents").
void AddSchedulerConfigFields(ConfigSchema& schema);
// Reads them back. Does not Validate (num_blocks may still be 0 here).
absl::StatusOr<SchedulerConfig> SchedulerConfigFromConfig(const Config& config);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SCHEDULER_CONFIG_H_
