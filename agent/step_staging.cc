#include "agent/step_staging.h"

#include <algorithm>

#include "common/uniform_routing.h"

namespace vamp {

StepStaging DescribeStepStaging(const StagingStats& before, const StagingStats& after,
                                int64_t step_tokens, int64_t routed_max_tokens, int64_t top_k,
                                int64_t num_experts) {
  StepStaging s;
  s.routed = routed_max_tokens > 0 && step_tokens > 0 && step_tokens <= routed_max_tokens;
  const bool ran_routed = after.routed_passes > before.routed_passes;
  // A step that staged bytes without a routed pass copied the whole region (a device that cannot
  // route its copies, e.g. a host copy it could not map): that is what it will keep doing.
  if (s.routed && !ran_routed && after.bytes > before.bytes) s.routed = false;
  if (!s.routed) return s;
  const uint64_t region = after.routed_region_bytes - before.routed_region_bytes;
  if (ran_routed && region > 0) {
    const uint64_t copied = after.routed_bytes - before.routed_bytes;
    s.share = std::clamp(static_cast<double>(copied) / static_cast<double>(region), 0.0, 1.0);
  } else {
    s.share = UniformRoutedShare(step_tokens, top_k, num_experts);
  }
  return s;
}

}  // namespace vamp
