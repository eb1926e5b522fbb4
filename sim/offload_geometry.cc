#include "sim/offload_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/offload_arithmetic.h"

namespace vamp::sim {

absl::StatusOr<OffloadGeometry> ComputeOffloadGeometry(const SimModelShape& model,
                                                       const OffloadOptions& o) {
  if (o.page_bytes <= 0) return absl::InvalidArgumentError("offload: page_bytes must be > 0");
  if (o.staging_buffer_experts < 0) {
    return absl::InvalidArgumentError("offload: staging_buffer_experts must be >= 0");
  }
  if (o.block_size < 1) return absl::InvalidArgumentError("offload: block_size must be >= 1");
  OffloadGeometry g;
  g.page_bytes = o.page_bytes;
  g.expert_bytes = model.ExpertBytes();
  g.experts_per_layer = model.num_experts;
  g.experts_per_group = static_cast<int32_t>(
      ExpertsPerGroup(static_cast<uint64_t>(o.page_bytes), static_cast<uint64_t>(g.expert_bytes)));
  g.group_bytes = g.experts_per_group * g.expert_bytes;
  g.eligible_layers = std::max(0, model.num_layers - 1);
  g.kv_block_bytes = model.KvBytesPerToken() * o.block_size;
  g.base_kv_bytes = o.base_kv_bytes;
  if (o.base_kv_bytes < g.kv_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("offload: base_kv_bytes (", o.base_kv_bytes,
                                                   ") holds no ", g.kv_block_bytes,
                                                   "-byte KV block"));
  }
  g.max_groups = static_cast<int32_t>(MaxOffloadGroups(
      model.num_experts, g.experts_per_group, o.cap, o.staging_buffer_experts, g.eligible_layers));
  g.max_offload_experts = g.max_groups * g.experts_per_group;
  return g;
}

}  // namespace vamp::sim
