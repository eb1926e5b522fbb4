#include "sim/sim_offloader.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vamp::sim {

int32_t SimOffloader::BlocksPerGroup() const {
  // The next group's blocks (floor effects make groups differ by at most one block).
  const int32_t next = std::min(groups_ + 1, std::max(1, g_.max_groups));
  return g_.BlocksWithGroups(next) - g_.BlocksWithGroups(next - 1);
}

absl::StatusOr<int32_t> SimOffloader::Offload(int32_t groups) {
  if (groups <= 0 || groups > RemainingGroups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Offload: ", groups, " groups, ", RemainingGroups(), " remain"));
  }
  const int32_t before = g_.BlocksWithGroups(groups_);
  groups_ += groups;
  max_groups_reached_ = std::max(max_groups_reached_, groups_);
  pending_remap_micros_ +=
      static_cast<double>(groups) * g_.eligible_layers * costs_.per_group_layer_micros;
  return g_.BlocksWithGroups(groups_) - before;
}

int32_t SimOffloader::BlocksRemovedByRestore(int32_t groups) const {
  groups = std::clamp(groups, 0, groups_);
  return g_.BlocksWithGroups(groups_) - g_.BlocksWithGroups(groups_ - groups);
}

absl::Status SimOffloader::Restore(int32_t groups) {
  if (groups <= 0 || groups > groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Restore: ", groups, " groups, ", groups_, " offloaded"));
  }
  groups_ -= groups;
  pending_remap_micros_ += static_cast<double>(groups) * g_.eligible_layers *
                           (costs_.per_group_layer_micros +
                            1e6 * static_cast<double>(g_.group_bytes) / costs_.h2d_bytes_per_s);
  return absl::OkStatus();
}

double SimOffloader::TakeRemapMicros() {
  const double t = pending_remap_micros_;
  pending_remap_micros_ = 0;
  return t;
}

}  // namespace vamp::sim
