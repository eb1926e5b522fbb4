// The arithmetic of expert offloading (shared/DESIGN.md, "Memory model"), once for the engine
// (engine/memory/geometry.h, which lays out real memory by it) and the simulator
// (sim/offload_geometry.h, which prices it). Both must agree on group sizes and the cap, and
// sim may not depend on engine/ (DESIGN.md's dependency rule), so the pure arithmetic lives in
// common/, below both.
#ifndef VAMP_COMMON_OFFLOAD_ARITHMETIC_H_
#define VAMP_COMMON_OFFLOAD_ARITHMETIC_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

namespace vamp {

// g: the smallest run of consecutive experts whose bytes are a multiple of the page,
// page / gcd(page, expert_bytes). Both sizes in bytes, page_bytes > 0.
inline int64_t ExpertsPerGroup(uint64_t page_bytes, uint64_t expert_bytes) {
  return static_cast<int64_t>(page_bytes / std::gcd(page_bytes, expert_bytes));
}

// Whole groups of g experts that may be offloaded from each eligible layer: the cap
// min(E_buffer, floor(r x E)) experts, rounded down to whole groups; 0 when no layer is eligible
// (all MoE layers but the first are). E_buffer = staging_buffer_experts, 0 = no limit beyond the
// ratio; max_offload_ratio r in [0, 1].
inline int64_t MaxOffloadGroups(int64_t num_experts, int64_t experts_per_group,
                                double max_offload_ratio, int64_t staging_buffer_experts,
                                int64_t eligible_layers) {
  if (eligible_layers <= 0 || experts_per_group <= 0) return 0;
  // floor(r E), computed so that e.g. 0.15 x 512 = 76.8 gives 76 despite rounding in r.
  int64_t cap =
      static_cast<int64_t>(std::floor(max_offload_ratio * static_cast<double>(num_experts) + 1e-9));
  if (staging_buffer_experts > 0) cap = std::min(cap, staging_buffer_experts);
  return cap / experts_per_group;
}

}  // namespace vamp

#endif  // VAMP_COMMON_OFFLOAD_ARITHMETIC_H_
