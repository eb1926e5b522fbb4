// VAMP-r, the offload cap: the largest share of each eligible layer's experts that may be
// offloaded, as a fraction r of the layer's experts (shared/DESIGN.md, "Offloadable part").
//
// The one type that holds it and the one place its range is checked. Everything that takes a cap
// from outside builds it with FromRatio: the controller's configuration (--max_offload_ratio),
// Admin's SetPolicy, the agents' Init (MemorySpec.max_offload_ratio), the engine's memory plan and
// vamp-sim's policies ("vamp-<percent>"). The range is [0, 1]: 0 disables offloading, 1 lets every
// expert of an eligible layer go (its staging buffer then holds the whole layer).
#ifndef VAMP_COMMON_OFFLOAD_CAP_H_
#define VAMP_COMMON_OFFLOAD_CAP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

class OffloadCap {
 public:
  static constexpr double kMinRatio = 0.0;
  static constexpr double kMaxRatio = 1.0;

  // No offloading (r = 0).
  constexpr OffloadCap() = default;
  // InvalidArgument naming `field` for a ratio outside [kMinRatio, kMaxRatio] (NaN included).
  static absl::StatusOr<OffloadCap> FromRatio(double ratio, absl::string_view field);
  // A cap written in code (defaults); a ratio out of range does not compile.
  static consteval OffloadCap Constant(double ratio) {
    if (!(ratio >= kMinRatio && ratio <= kMaxRatio)) OutOfRange();
    return OffloadCap(ratio);
  }

  constexpr double ratio() const { return ratio_; }
  // floor(r x E) experts of a layer of `num_experts`, exact for ratios written in decimal
  // (0.15 x 512 = 76.8 gives 76 despite 0.15's binary rounding).
  int64_t MaxExperts(int64_t num_experts) const;

  friend constexpr bool operator==(OffloadCap a, OffloadCap b) { return a.ratio_ == b.ratio_; }

 private:
  constexpr explicit OffloadCap(double ratio) : ratio_(ratio) {}
  // Not constexpr: calling it in Constant() makes an out-of-range constant fail to compile.
  static void OutOfRange();

  double ratio_ = 0;
};

}  // namespace vamp

#endif  // VAMP_COMMON_OFFLOAD_CAP_H_
