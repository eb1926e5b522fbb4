// ExpertOffloader over the agents: moving n expert groups into the KV pool is a synchronized remap.
// Capacity is asked of every rank, the controller takes the minimum so that every rank keeps the
// same block table (DESIGN.md invariant 2), and one remap-only step carries the command to all
// ranks at the same step boundary. A remap that fails on any rank is rolled back on all.
#ifndef VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_
#define VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_

#include <functional>

#include "controller/core/memory_arbiter.h"
#include "controller/serving/agent_group.h"
#include "controller/serving/agent_reports.h"

namespace vamp {

class RemoteOffloader final : public ExpertOffloader {
 public:
  // `next_step_id` hands out the step id of each StepRequest the controller sends (remap-only
  // steps included), so agents see one increasing sequence.
  RemoteOffloader(AgentGroup* group, std::function<int64_t()> next_step_id);

  // Reads the ranks' current capacity (call after Init and after every remap).
  absl::Status Refresh();

  int32_t RemainingGroups() const override { return max_groups_ - offloaded_groups_; }
  int32_t BlocksPerGroup() const override { return blocks_per_group_; }
  absl::StatusOr<int32_t> Offload(int32_t groups) override;
  int32_t ExpertsPerGroup() const override { return experts_per_group_; }
  int32_t ExpertsPerLayer() const override { return experts_per_layer_; }
  int64_t StagedBytesPerGroup() const override { return staged_bytes_per_group_; }
  int32_t OffloadedGroups() const override { return offloaded_groups_; }
  // Asks the ranks (the cross-rank minimum of what remains after the restore).
  int32_t BlocksRemovedByRestore(int32_t groups) const override;
  // Takes `groups` groups back from the KV tail; the caller has withdrawn
  // BlocksRemovedByRestore(groups) blocks from the pool.
  absl::Status Restore(int32_t groups, const PendingReleases& releases) override;

  // What the agents' checked Init answers allow their capacity reports to claim (see
  // agent_reports.h); without, only the hard ceilings apply.
  void SetLimits(AgentReportLimits limits) { limits_ = std::move(limits); }

  // Rank-local geometry from the agents' Init answers.
  void SetGeometry(int32_t experts_per_group, int32_t experts_per_layer) {
    experts_per_group_ = experts_per_group;
    experts_per_layer_ = experts_per_layer;
  }
  int32_t offloaded_groups() const { return offloaded_groups_; }
  int32_t max_groups() const { return max_groups_; }
  int64_t kv_blocks() const { return kv_blocks_; }

 private:
  // One remap-only step on every rank; `releases` (restores only; may be null) ride on it and
  // are dropped by the agents before they remap.
  absl::StatusOr<int32_t> Remap(int32_t delta_groups, const PendingReleases* releases);

  AgentGroup* group_;
  std::function<int64_t()> next_step_id_;
  int32_t offloaded_groups_ = 0;
  int32_t max_groups_ = 0;
  int32_t blocks_per_group_ = 0;
  int32_t experts_per_group_ = 1;
  int32_t experts_per_layer_ = 0;
  int64_t staged_bytes_per_group_ = 0;  // the largest over ranks
  int64_t kv_blocks_ = 0;               // the pool size every rank uses (cross-rank minimum)
  int64_t next_remap_ = 0;
  AgentReportLimits limits_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_
