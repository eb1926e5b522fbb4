// The double-buffered staging schedule of offloaded experts (shared/DESIGN.md, "Staging"), as
// backend-independent logic. Executed by HostStagingEngine on the CPU (a worker thread doing host
// copies) and, on GPUs, by a copy stream with events, from the same plan.
//
// A forward pass visits the staged layers (MoE layers with offloaded experts, in forward order).
// Copy i moves staged layer i's offloaded range [b, E) into buffer i % num_buffers, and may start
// only once the MoE that read that buffer before it (copy i - num_buffers) has finished. With two
// buffers this is "copy layer l+1 while layer l runs; reuse a buffer only after its reader
// finished". A layer's MoE waits for its own copy only if it is not done yet. Every copy of a pass
// is finished before the next pass starts, so plans need no dependencies across passes.
#ifndef VAMP_ENGINE_STAGING_STAGING_PLAN_H_
#define VAMP_ENGINE_STAGING_STAGING_PLAN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace vamp {

struct StagingCopy {
  int layer = -1;  // decoder layer whose offloaded experts are copied
  int buffer = 0;  // staging buffer they go to
  // The copy (index into the plan) whose reader must release `buffer` before this copy starts;
  // -1 when the buffer has no earlier reader in the pass.
  int after_release_of = -1;
};

// The copies of one pass over `staged_layers` (strictly ascending decoder layers) with
// `num_buffers` >= 1 buffers. InvalidArgument for unsorted layers or no buffers.
absl::StatusOr<std::vector<StagingCopy>> PlanStagingPass(absl::Span<const int> staged_layers,
                                                         int num_buffers);

}  // namespace vamp

#endif  // VAMP_ENGINE_STAGING_STAGING_PLAN_H_
