#include "controller/core/scheduler_config.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vamp {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("scheduler config ", field, ": ", what));
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

}  // namespace

absl::string_view SchedulingPolicyName(SchedulingPolicy p) {
  return p == SchedulingPolicy::kFcfs ? "fcfs" : "priority";
}

absl::Status SchedulerConfig::Validate() const {
  if (block_size < 1) return Bad("block_size", absl::StrCat("must be >= 1, got ", block_size));
  if (num_blocks < 1) {
    return Bad("num_blocks",
               absl::StrCat("must be >= 1 (the agents' KV capacity), got ", num_blocks));
  }
  if (max_num_batched_tokens < 1) {
    return Bad("max_num_batched_tokens",
               absl::StrCat("must be >= 1, got ", max_num_batched_tokens));
  }
  if (max_num_seqs < 1)
    return Bad("max_num_seqs", absl::StrCat("must be >= 1, got ", max_num_seqs));
  if (max_model_len < 2) {
    return Bad("max_model_len", absl::StrCat("must be >= 2, got ", max_model_len));
  }
  if (long_prefill_token_threshold < 0) {
    return Bad("long_prefill_token_threshold",
               absl::StrCat("must be >= 0 (0 disables), got ", long_prefill_token_threshold));
  }
  const int64_t blocks_per_seq =
      (static_cast<int64_t>(max_model_len) + block_size - 1) / block_size;
  if (blocks_per_seq > num_blocks) {
    return Bad("max_model_len",
               absl::StrCat(max_model_len, " tokens need ", blocks_per_seq, " blocks of ",
                            block_size, " but the pool has ", num_blocks));
  }
  if (recurrent_state_blocks < 0) {
    return Bad("recurrent_state_blocks",
               absl::StrCat("must be >= 0, got ", recurrent_state_blocks));
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    return Bad("max_num_batched_tokens",
               absl::StrCat("must be >= max_model_len (", max_model_len,
                            ") when chunked prefill is off, got ", max_num_batched_tokens));
  }
  return absl::OkStatus();
}

void AddSchedulerConfigFields(ConfigSchema& schema) {
  const SchedulerConfig d;
  schema.Int("block_size", d.block_size, 1, 4096, "Tokens per KV block")
      .Int("num_kv_blocks", 0, 0, kInt32Max,
           "Initial KV pool size in blocks; 0 takes the agents' capacity report")
      .Int("max_num_batched_tokens", d.max_num_batched_tokens, 1, kInt32Max,
           "Token budget of one step (prefill and decode)")
      .Int("max_num_seqs", d.max_num_seqs, 1, kInt32Max, "Most requests running at once")
      .Int("max_model_len", d.max_model_len, 2, kInt32Max,
           "Most tokens (prompt + output) of one request")
      .Bool("enable_prefix_caching", d.enable_prefix_caching, "Reuse KV of shared prefixes")
      .Bool("enable_chunked_prefill", d.enable_chunked_prefill,
            "Split long prefills across steps under the token budget")
      .Bool("snapshot_outputs", d.snapshot_outputs,
            "Models with recurrent state (Qwen3-Next): keep a state snapshot at the last block "
            "boundary each request's output reaches, where the next turn of a conversation "
            "hits, besides the one at each prompt's; costs one snapshot per running request")
      .Bool("admit_within_baseline", d.admit_within_baseline,
            "While the arbiter finds the GPU compute-bound, admit new requests only while the "
            "running requests' KV fits the pool a static split would have: the offloaded "
            "groups' KV then serves cached prefixes and running requests' growth, not more "
            "concurrency (which would only slow decoding)")
      .Int("long_prefill_token_threshold", d.long_prefill_token_threshold, 0, kInt32Max,
           "Most prefill tokens one request takes per step (0 = no limit)")
      .Enum("scheduling_policy", "fcfs", {"fcfs", "priority"},
            "Order of admission and choice of preemption victims")
      .String("prefix_cache_hash_key", "",
              "SipHash key of the prefix cache, 32 hex digits; empty = the reproducible default. "
              "Set a secret one when tenants must not be able to craft hash collisions");
}

absl::StatusOr<SchedulerConfig> SchedulerConfigFromConfig(const Config& config) {
  SchedulerConfig c;
  c.block_size = static_cast<int32_t>(config.GetInt("block_size"));
  c.num_blocks = static_cast<int32_t>(config.GetInt("num_kv_blocks"));
  c.max_num_batched_tokens = static_cast<int32_t>(config.GetInt("max_num_batched_tokens"));
  c.max_num_seqs = static_cast<int32_t>(config.GetInt("max_num_seqs"));
  c.max_model_len = static_cast<int32_t>(config.GetInt("max_model_len"));
  c.enable_prefix_caching = config.GetBool("enable_prefix_caching");
  c.enable_chunked_prefill = config.GetBool("enable_chunked_prefill");
  c.snapshot_outputs = config.GetBool("snapshot_outputs");
  c.admit_within_baseline = config.GetBool("admit_within_baseline");
  c.long_prefill_token_threshold =
      static_cast<int32_t>(config.GetInt("long_prefill_token_threshold"));
  c.policy = config.GetString("scheduling_policy") == "priority" ? SchedulingPolicy::kPriority
                                                                 : SchedulingPolicy::kFcfs;
  const std::string& key = config.GetString("prefix_cache_hash_key");
  if (!key.empty()) {
    uint64_t hi = 0, lo = 0;
    if (key.size() != 32 || !absl::SimpleHexAtoi(absl::string_view(key).substr(0, 16), &hi) ||
        !absl::SimpleHexAtoi(absl::string_view(key).substr(16), &lo)) {
      return absl::InvalidArgumentError(
          "config field 'prefix_cache_hash_key': expected 32 hex digits or empty");
    }
    c.prefix_cache_hash_key0 = hi;
    c.prefix_cache_hash_key1 = lo;
  }
  return c;
}

}  // namespace vamp
