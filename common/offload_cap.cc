#include "common/offload_cap.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace vamp {

absl::StatusOr<OffloadCap> OffloadCap::FromRatio(double ratio, absl::string_view field) {
  if (!(ratio >= kMinRatio && ratio <= kMaxRatio)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " (VAMP-r, the offload cap) must be in [",
                                                   kMinRatio, ", ", kMaxRatio, "], got ", ratio));
  }
  return OffloadCap(ratio);
}

int64_t OffloadCap::MaxExperts(int64_t num_experts) const {
  return static_cast<int64_t>(std::floor(ratio_ * static_cast<double>(num_experts) + 1e-9));
}

void OffloadCap::OutOfRange() {}

}  // namespace vamp
