// The share of one MoE layer's experts that a step's tokens route to, for uniform top-k routing:
// each of T tokens picks k of E experts, so a given expert is missed by all of them with
// probability (1 - k/E)^T and the expected share routed to is 1 - (1 - k/E)^T. The floor model
// of the step benchmark, vamp-sim's routed staging and the agents' expected staged share (before
// any expert is offloaded to measure it) use this one formula. Real routers are skewed, which
// makes the share smaller; measured shares replace it where there are any.
#ifndef VAMP_COMMON_UNIFORM_ROUTING_H_
#define VAMP_COMMON_UNIFORM_ROUTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace vamp {

// In [0, 1]; 0 for no tokens, 1 when every token routes to every expert (top_k >= num_experts).
inline double UniformRoutedShare(int64_t tokens, int64_t top_k, int64_t num_experts) {
  if (tokens <= 0 || top_k <= 0 || num_experts <= 0) return 0;
  if (top_k >= num_experts) return 1;
  const double miss = 1.0 - static_cast<double>(top_k) / static_cast<double>(num_experts);
  return std::clamp(1.0 - std::pow(miss, static_cast<double>(tokens)), 0.0, 1.0);
}

}  // namespace vamp

#endif  // VAMP_COMMON_UNIFORM_ROUTING_H_
