// Per-rank geometry of expert offloading as the simulator needs it: how big a group is, how many
// groups the cap allows, and how many KV blocks the pool has after moving n groups into it.
//
// Group size and cap come from common/offload_arithmetic.h, the arithmetic engine/memory/geometry.h
// lays out real memory by (sim/ must not link engine/: it depends only on the controller and the
// workload library). What the simulator adds, from shared/DESIGN.md "Memory model":
//   eligible layers  every MoE layer but the first (all layers of the Qwen3 models are MoE);
//   pool   num_blocks = floor(mapped_bytes / block_bytes), where mapped_bytes is the baseline KV
//          pool plus n·g·expert_bytes in every eligible layer.
// Qwen3-Next TP2: 3 MiB shards, groups of 2 (6 MiB), 47 eligible layers → 282 MiB per group; KV
// 12 KiB per token per rank, 192 KiB per 16-token block → 1,504 blocks per group.
#ifndef VAMP_SIM_OFFLOAD_GEOMETRY_H_
#define VAMP_SIM_OFFLOAD_GEOMETRY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/offload_cap.h"
#include "sim/calibration.h"

namespace vamp::sim {

struct OffloadOptions {
  // VMM allocation granularity (bytes).
  int64_t page_bytes = 2 << 20;
  // VAMP-r (the default: no offloading).
  OffloadCap cap;
  // E_buffer: experts one staging buffer holds; 0 = exactly what the cap needs.
  int32_t staging_buffer_experts = 0;
  // Baseline KV pool per rank (bytes), before any offload.
  int64_t base_kv_bytes = 8LL << 30;
  // Tokens per KV block.
  int32_t block_size = 16;
};

struct OffloadGeometry {
  int64_t page_bytes = 0;
  int64_t expert_bytes = 0;       // one rank-local shard
  int32_t experts_per_layer = 0;  // E
  int32_t experts_per_group = 0;  // g
  int64_t group_bytes = 0;        // g · expert_bytes
  int32_t eligible_layers = 0;
  int32_t max_offload_experts = 0;  // per eligible layer, whole groups
  int32_t max_groups = 0;
  int64_t kv_block_bytes = 0;  // per rank
  int64_t base_kv_bytes = 0;

  // Bytes one group moves: one group in every eligible layer.
  int64_t bytes_per_group() const { return group_bytes * eligible_layers; }
  // KV blocks with `groups` groups moved into the pool.
  int32_t BlocksWithGroups(int32_t groups) const {
    return static_cast<int32_t>((base_kv_bytes + groups * bytes_per_group()) / kv_block_bytes);
  }
  int32_t base_blocks() const { return BlocksWithGroups(0); }
};

// InvalidArgument naming the option for impossible values (non-positive page or pool, a pool
// smaller than one block).
absl::StatusOr<OffloadGeometry> ComputeOffloadGeometry(const SimModelShape& model,
                                                       const OffloadOptions& options);

}  // namespace vamp::sim

#endif  // VAMP_SIM_OFFLOAD_GEOMETRY_H_
