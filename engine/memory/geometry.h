// Byte geometry of the two things that share device memory: expert regions (and the groups they
// are remapped in) and KV blocks. Pure arithmetic from the model shape, tensor-parallel size and
// page size, shared by the memory plan, the ExpertStore and the KvRegion.
//
// Layer indices are decoder-layer indices (model.layers.{i}); sizes are bytes unless named pages,
// experts or tokens.
#ifndef VAMP_ENGINE_MEMORY_GEOMETRY_H_
#define VAMP_ENGINE_MEMORY_GEOMETRY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/memory/model_shape.h"

namespace vamp {

// How much of each layer's experts may leave the GPU (shared/DESIGN.md, "Offloadable part").
struct OffloadConfig {
  // VAMP-r as a fraction: at most floor(r x E) experts of each eligible layer are offloaded.
  // 0 disables offloading; the range is OffloadCap's (common/offload_cap.h), checked by
  // ComputeExpertGeometry.
  double max_offload_ratio = 0.15;
  // E_buffer: experts one staging buffer holds, which also bounds the offloaded experts per layer.
  // 0 sizes the staging buffer to exactly what the cap needs.
  int64_t staging_buffer_experts = 0;
  // Staging buffers: 2 overlaps each layer's copy with the layer before it (shared/DESIGN.md,
  // "Staging"); 1 serialises copies and compute.
  int staging_buffers = 2;
};

// Per-rank geometry of the expert regions.
//
// Each MoE layer has one region of `region_pages` pages holding all E rank-local expert shards,
// expert-major: expert e at region base + ExpertOffset(e), each shard [w13 | w2]. `lead_bytes` of
// padding come first so that the region ends exactly at a page boundary: the offloaded experts are
// the top ones, [E - n*g, E), and their bytes then always start and end on page boundaries.
//
// A group is the smallest run of g consecutive experts whose bytes are a multiple of the page
// (g = page / gcd(page, expert_bytes)). Offloading "n groups" moves the residency boundary
// b = E - offloaded_experts down by n*g experts in every eligible layer (all MoE layers but the
// first), freeing n * group_pages pages in each of them.
struct ExpertGeometry {
  int tp_size = 1;
  uint64_t page_bytes = 0;
  int64_t num_experts = 0;
  uint64_t w13_bytes = 0;     // gate and up, fused: [2 * I/tp, hidden]
  uint64_t w2_bytes = 0;      // down: [hidden, I/tp]
  uint64_t expert_bytes = 0;  // w13_bytes + w2_bytes
  std::vector<int> moe_layers;
  std::vector<int> eligible_layers;  // moe_layers without the first
  int64_t region_pages = 0;          // pages of one layer's region
  uint64_t lead_bytes = 0;           // padding before expert 0
  int64_t group_experts = 0;         // g
  uint64_t group_bytes = 0;          // g * expert_bytes, a multiple of the page
  int64_t group_pages = 0;
  int64_t staging_buffer_experts = 0;  // E_buffer
  int64_t max_offload_experts = 0;  // per eligible layer: min(E_buffer, floor(r E)), whole groups
  int64_t max_groups = 0;           // max_offload_experts / g (0 when nothing is eligible)
  int num_staging_buffers = 0;      // 0 when nothing can be offloaded
  // Where the staging buffers' pages come from. Carved (the default wherever it works): each
  // group step maps num_staging_buffers x group_pages of the pages it frees into the buffers and
  // the rest into the KV cache, so nothing is set aside before the first offload and a rank that
  // never offloads has static's KV pool. A group step frees group_pages in every eligible layer,
  // so carving needs more eligible layers than buffers; smaller models reserve the buffers' pages
  // at start-up instead (at the cap both give the KV cache the same pages).
  bool staging_carved = false;

  uint64_t ExpertOffset(int64_t expert) const {
    return lead_bytes + static_cast<uint64_t>(expert) * expert_bytes;
  }
  uint64_t region_bytes() const { return static_cast<uint64_t>(region_pages) * page_bytes; }
  // Pages one group step moves: one group in every eligible layer.
  int64_t pages_per_group() const {
    return group_pages * static_cast<int64_t>(eligible_layers.size());
  }
  // Pages of all expert regions, and the most that can be offloaded.
  int64_t total_pages() const { return region_pages * static_cast<int64_t>(moe_layers.size()); }
  int64_t max_offload_pages() const { return max_groups * pages_per_group(); }
  uint64_t staging_buffer_bytes() const {
    return static_cast<uint64_t>(staging_buffer_experts) * expert_bytes;
  }
  // Address space of one staging buffer, whole pages.
  int64_t staging_buffer_pages() const {
    return static_cast<int64_t>((staging_buffer_bytes() + page_bytes - 1) / page_bytes);
  }
  // Of the pages one group step frees, those the staging buffers take and those the KV cache gets.
  int64_t staging_pages_per_group() const {
    return staging_carved ? num_staging_buffers * group_pages : 0;
  }
  int64_t kv_pages_per_group() const { return pages_per_group() - staging_pages_per_group(); }
  // Pages the KV cache can gain: every group offloaded.
  int64_t max_kv_offload_pages() const { return max_groups * kv_pages_per_group(); }
  // Staging pages mapped from start-up on (reserved buffers; 0 when carved).
  int64_t reserved_staging_pages() const {
    return staging_carved ? 0 : num_staging_buffers * staging_buffer_pages();
  }
};

// InvalidArgument (naming the field) for a shape that fails Validate, tp_size < 1, a
// moe_intermediate_size not divisible by tp_size, a page that is not positive, or a ratio outside
// [0, 1].
absl::StatusOr<ExpertGeometry> ComputeExpertGeometry(const ModelShape& shape, int tp_size,
                                                     uint64_t page_bytes,
                                                     const OffloadConfig& offload);

// Per-rank geometry of one KV block. Block-major: block i starts at KV region base + i *
// block_bytes and holds, for every attention layer in order, K then V of `block_size` tokens:
//   [K(layer a0) | V(layer a0) | K(layer a1) | V(layer a1) | ...].
// Within each K or V part the elements are [block_size tokens][kv_heads_per_rank][head_dim],
// row-major, dtype_bytes each: the contract between the KV writer and the attention kernels.
struct KvBlockGeometry {
  int64_t block_size = 0;  // tokens
  int64_t kv_heads_per_rank = 0;
  int64_t head_dim = 0;
  int64_t dtype_bytes = 0;
  std::vector<int> attention_layers;
  // Per decoder layer: its position among the attention layers, or -1.
  std::vector<int> attention_index;
  uint64_t layer_part_bytes = 0;  // K (or V) of one layer: block_size * heads * head_dim * dtype
  uint64_t block_bytes = 0;       // 2 * attention layers * layer_part_bytes

  bool HasKv(int layer) const {
    return layer >= 0 && layer < static_cast<int>(attention_index.size()) &&
           attention_index[static_cast<size_t>(layer)] >= 0;
  }
  // Byte offsets of a layer's K and V within a block. The layer must have KV (HasKv).
  uint64_t KOffset(int layer) const {
    return 2 * static_cast<uint64_t>(attention_index[static_cast<size_t>(layer)]) *
           layer_part_bytes;
  }
  uint64_t VOffset(int layer) const { return KOffset(layer) + layer_part_bytes; }
  // Blocks that fit whole in `bytes`.
  int64_t BlocksIn(uint64_t bytes) const { return static_cast<int64_t>(bytes / block_bytes); }
};

// InvalidArgument for a shape that fails Validate, no attention layers, tp_size < 1 or a block
// size < 1.
absl::StatusOr<KvBlockGeometry> ComputeKvBlockGeometry(const ModelShape& shape, int tp_size,
                                                       int64_t block_size);

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_GEOMETRY_H_
