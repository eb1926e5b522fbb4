#include "engine/memory/geometry.h"

#include "absl/strings/str_cat.h"
#include "common/offload_arithmetic.h"
#include "common/offload_cap.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<ExpertGeometry> ComputeExpertGeometry(const ModelShape& shape, int tp_size,
                                                     uint64_t page_bytes,
                                                     const OffloadConfig& offload) {
  VAMP_RETURN_IF_ERROR(shape.Validate());
  if (tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size (", tp_size, ") must be at least 1"));
  }
  if (shape.moe_intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moe_intermediate_size (", shape.moe_intermediate_size, ") is not divisible by tp_size (",
        tp_size, "): experts cannot be split evenly"));
  }
  if (page_bytes == 0) return absl::InvalidArgumentError("page_bytes must be positive");
  VAMP_ASSIGN_OR_RETURN(const OffloadCap cap, OffloadCap::FromRatio(offload.max_offload_ratio,
                                                                    "offload.max_offload_ratio"));
  if (offload.staging_buffers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("offload.staging_buffers (",
                                                   offload.staging_buffers,
                                                   ") must be at least 1"));
  }
  if (offload.staging_buffer_experts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("offload.staging_buffer_experts (",
                                                   offload.staging_buffer_experts,
                                                   ") must not be negative"));
  }

  ExpertGeometry g;
  g.tp_size = tp_size;
  g.page_bytes = page_bytes;
  g.num_experts = shape.num_experts;
  g.w13_bytes = static_cast<uint64_t>(shape.ExpertW13BytesPerRank(tp_size));
  g.w2_bytes = static_cast<uint64_t>(shape.ExpertW2BytesPerRank(tp_size));
  g.expert_bytes = g.w13_bytes + g.w2_bytes;
  g.moe_layers = shape.moe_layers;
  g.eligible_layers.assign(shape.moe_layers.begin() + 1, shape.moe_layers.end());

  const uint64_t all_experts = static_cast<uint64_t>(g.num_experts) * g.expert_bytes;
  g.region_pages = static_cast<int64_t>((all_experts + page_bytes - 1) / page_bytes);
  g.lead_bytes = g.region_bytes() - all_experts;

  g.group_experts = ExpertsPerGroup(page_bytes, g.expert_bytes);
  g.group_bytes = static_cast<uint64_t>(g.group_experts) * g.expert_bytes;
  g.group_pages = static_cast<int64_t>(g.group_bytes / page_bytes);

  g.max_groups =
      MaxOffloadGroups(g.num_experts, g.group_experts, cap, offload.staging_buffer_experts,
                       static_cast<int64_t>(g.eligible_layers.size()));
  g.max_offload_experts = g.max_groups * g.group_experts;
  g.staging_buffer_experts =
      offload.staging_buffer_experts > 0 ? offload.staging_buffer_experts : g.max_offload_experts;
  if (g.max_groups > 0) {
    g.num_staging_buffers = offload.staging_buffers;
    g.staging_carved = static_cast<int64_t>(g.eligible_layers.size()) > g.num_staging_buffers;
  }
  return g;
}

absl::StatusOr<KvBlockGeometry> ComputeKvBlockGeometry(const ModelShape& shape, int tp_size,
                                                       int64_t block_size) {
  VAMP_RETURN_IF_ERROR(shape.Validate());
  if (tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size (", tp_size, ") must be at least 1"));
  }
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv block_size (", block_size, ") must be at least 1 token"));
  }
  if (shape.attention_layers.empty()) {
    return absl::InvalidArgumentError("model shape has no attention layers, so no KV cache");
  }
  KvBlockGeometry kv;
  kv.block_size = block_size;
  kv.kv_heads_per_rank = shape.KvHeadsPerRank(tp_size);
  kv.head_dim = shape.head_dim;
  kv.dtype_bytes = shape.dtype_bytes;
  kv.attention_layers = shape.attention_layers;
  kv.attention_index.assign(static_cast<size_t>(shape.num_layers), -1);
  for (size_t i = 0; i < shape.attention_layers.size(); ++i) {
    kv.attention_index[static_cast<size_t>(shape.attention_layers[i])] = static_cast<int>(i);
  }
  kv.layer_part_bytes =
      static_cast<uint64_t>(block_size * kv.kv_heads_per_rank * kv.head_dim * kv.dtype_bytes);
  kv.block_bytes = 2 * kv.attention_layers.size() * kv.layer_part_bytes;
  return kv;
}

}  // namespace vamp
