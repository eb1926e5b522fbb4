// Where the forward pass reads each expert for one pass, whatever memory the staging buffers live
// in: the staging plan over the layers that have offloaded experts, and per MoE layer a pointer
// table to each expert's [w13 | w2] — into the resident region below the residency boundary,
// into the staging buffer its layer is copied to above it.
#ifndef VAMP_ENGINE_STAGING_EXPERT_POINTER_TABLES_H_
#define VAMP_ENGINE_STAGING_EXPERT_POINTER_TABLES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/experts/expert_store.h"
#include "engine/staging/staging_plan.h"

namespace vamp {

struct ExpertPointerTables {
  std::vector<int> staged_layers;             // MoE layers with offloaded experts, ascending
  std::vector<StagingCopy> plan;              // PlanStagingPass over staged_layers
  std::vector<int> job_of_layer;              // by decoder layer: index into plan, or -1
  std::vector<std::vector<const void*>> w13;  // by decoder layer (empty for non-MoE layers)
  std::vector<std::vector<const void*>> w2;
};

// Over the store's own staging buffers (host or device addresses alike). Internal error when an
// offloaded expert has no buffer to be read from.
absl::StatusOr<ExpertPointerTables> BuildExpertPointerTables(const ExpertStore& store);

}  // namespace vamp

#endif  // VAMP_ENGINE_STAGING_EXPERT_POINTER_TABLES_H_
