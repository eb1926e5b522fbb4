#include "engine/staging/staging_plan.h"

#include "absl/strings/str_cat.h"

namespace vamp {

absl::StatusOr<std::vector<StagingCopy>> PlanStagingPass(absl::Span<const int> staged_layers,
                                                         int num_buffers) {
  if (num_buffers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging needs at least one buffer, got ", num_buffers));
  }
  std::vector<StagingCopy> plan;
  plan.reserve(staged_layers.size());
  for (size_t i = 0; i < staged_layers.size(); ++i) {
    if (i > 0 && staged_layers[i] <= staged_layers[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("staged layers must be strictly ascending; layer ", staged_layers[i],
                       " follows ", staged_layers[i - 1]));
    }
    const int index = static_cast<int>(i);
    plan.push_back(
        {staged_layers[i], index % num_buffers, index >= num_buffers ? index - num_buffers : -1});
  }
  return plan;
}

}  // namespace vamp
