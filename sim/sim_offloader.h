// The simulated agents' side of offloading: moving n groups lowers the residency boundary by
// n·g experts in every eligible layer and maps their pages at the end of the KV region, so the
// pool gains BlocksWithGroups(k + n) − BlocksWithGroups(k) blocks (the same on every simulated
// rank); later steps stage the offloaded experts (StepTimeModel). Restore is the reverse.
// Every remap costs virtual time (pages unmapped and mapped per group and layer, plus the
// host→device copy of the restored experts), which the simulator charges to the next step. The
// simulated agents never refuse a remap.
#ifndef VAMP_SIM_SIM_OFFLOADER_H_
#define VAMP_SIM_SIM_OFFLOADER_H_

#include <cstdint>

#include "controller/core/expert_offloader.h"
#include "sim/offload_geometry.h"

namespace vamp::sim {

struct RemapCosts {
  // Unmapping one group's pages in one layer and mapping them in the other region, with access
  // set (shared/DESIGN.md: 111 µs map + access while a kernel runs, 57 µs unmap, per 6 MiB group).
  double per_group_layer_micros = 168;
  // Host→device bandwidth for copying restored experts back from their pinned copies.
  double h2d_bytes_per_s = 55.5e9;
};

class SimOffloader final : public ExpertOffloader {
 public:
  SimOffloader(const OffloadGeometry& geometry, const RemapCosts& costs)
      : g_(geometry), costs_(costs) {}

  int32_t RemainingGroups() const override { return g_.max_groups - groups_; }
  int32_t BlocksPerGroup() const override;
  absl::StatusOr<int32_t> Offload(int32_t groups) override;
  int32_t ExpertsPerGroup() const override { return g_.experts_per_group; }
  int32_t ExpertsPerLayer() const override { return g_.experts_per_layer; }
  int64_t StagedBytesPerGroup() const override { return g_.bytes_per_group(); }
  int32_t OffloadedGroups() const override { return groups_; }
  int32_t BlocksRemovedByRestore(int32_t groups) const override;
  absl::Status Restore(int32_t groups) override;

  // Experts above the residency boundary in each eligible layer.
  int32_t offloaded_experts_per_layer() const { return groups_ * g_.experts_per_group; }
  // Remap time accumulated since the last call (µs), which the caller adds to the next step.
  double TakeRemapMicros();
  int32_t max_groups_reached() const { return max_groups_reached_; }
  const OffloadGeometry& geometry() const { return g_; }

 private:
  OffloadGeometry g_;
  RemapCosts costs_;
  int32_t groups_ = 0;
  int32_t max_groups_reached_ = 0;
  double pending_remap_micros_ = 0;
};

}  // namespace vamp::sim

#endif  // VAMP_SIM_SIM_OFFLOADER_H_
