// The arithmetic of expert offloading (shared/DESIGN.md, "Memory model"), once for the engine
// (engine/memory/geometry.h, which lays out real memory by it) and the simulator
// (sim/offload_geometry.h, which prices it). Both must agree on group sizes and the cap, and
// sim may not depend on engine/ (DESIGN.md's dependency rule), so the pure arithmetic lives in
// common/, below both.
#ifndef VAMP_COMMON_OFFLOAD_ARITHMETIC_H_
#define VAMP_COMMON_OFFLOAD_ARITHMETIC_H_

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "common/offload_cap.h"

namespace vamp {

// g: the smallest run of consecutive experts whose bytes are a multiple of the page,
// page / gcd(page, expert_bytes). Both sizes in bytes, page_bytes > 0.
inline int64_t ExpertsPerGroup(uint64_t page_bytes, uint64_t expert_bytes) {
  return static_cast<int64_t>(page_bytes / std::gcd(page_bytes, expert_bytes));
}

// Whole groups of g experts that may be offloaded from each eligible layer: the cap
// min(E_buffer, floor(r x E)) experts, rounded down to whole groups; 0 when no layer is eligible
// (all MoE layers but the first are). E_buffer = staging_buffer_experts, 0 = no limit beyond the
// cap's ratio r.
inline int64_t MaxOffloadGroups(int64_t num_experts, int64_t experts_per_group, OffloadCap cap,
                                int64_t staging_buffer_experts, int64_t eligible_layers) {
  if (eligible_layers <= 0 || experts_per_group <= 0) return 0;
  int64_t experts = cap.MaxExperts(num_experts);
  if (staging_buffer_experts > 0) experts = std::min(experts, staging_buffer_experts);
  return experts / experts_per_group;
}

}  // namespace vamp

#endif  // VAMP_COMMON_OFFLOAD_ARITHMETIC_H_
