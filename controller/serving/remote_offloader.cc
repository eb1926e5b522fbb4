#include "controller/serving/remote_offloader.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace vamp {

RemoteOffloader::RemoteOffloader(AgentGroup* group, std::function<int64_t()> next_step_id)
    : group_(group), next_step_id_(std::move(next_step_id)) {}

absl::Status RemoteOffloader::Refresh() {
  absl::StatusOr<std::vector<vamp::v1::CapacityResponse>> now = group_->Capacity(0);
  if (!now.ok()) return now.status();
  absl::StatusOr<std::vector<vamp::v1::CapacityResponse>> one = group_->Capacity(1);
  if (!one.ok()) return one.status();
  // The pool, and so the scheduler's block table, is sized from these: an agent's word is checked
  // before anything is allocated on it.
  for (size_t r = 0; r < now->size(); ++r) {
    for (const vamp::v1::CapacityResponse* c : {&(*now)[r], &(*one)[r]}) {
      if (r < limits_.max_kv_blocks.size()) {
        if (absl::Status s = CheckCapacityResponse(*c, static_cast<int>(r), limits_); !s.ok()) {
          return s;
        }
      } else if (c->kv_blocks_now() < 1 || c->kv_blocks_now() > kMaxAgentKvBlocks ||
                 c->kv_blocks_after() < 0 || c->kv_blocks_after() > kMaxAgentKvBlocks) {
        return absl::FailedPreconditionError(
            absl::StrCat("agent rank ", r, " reported kv_blocks_now = ", c->kv_blocks_now(),
                         " and kv_blocks_after = ", c->kv_blocks_after(), ", outside [1, ",
                         kMaxAgentKvBlocks, "]; refusing it"));
      }
    }
  }
  int64_t blocks = INT64_MAX, blocks_after_one = INT64_MAX;
  int32_t max_groups = INT32_MAX;
  int64_t staged_bytes = 0;
  for (size_t r = 0; r < now->size(); ++r) {
    blocks = std::min(blocks, (*now)[r].kv_blocks_now());
    blocks_after_one = std::min(blocks_after_one, (*one)[r].kv_blocks_after());
    max_groups = std::min(max_groups, (*now)[r].max_offload_groups());
    staged_bytes = std::max<int64_t>(staged_bytes, (*now)[r].staged_bytes_per_group());
    if ((*now)[r].offloaded_groups() != (*now)[0].offloaded_groups()) {
      return absl::InternalError(absl::StrCat("ranks disagree on offloaded groups: rank 0 has ",
                                              (*now)[0].offloaded_groups(), ", rank ", r, " has ",
                                              (*now)[r].offloaded_groups()));
    }
  }
  kv_blocks_ = blocks;
  staged_bytes_per_group_ = staged_bytes;
  max_groups_ = max_groups;
  offloaded_groups_ = (*now)[0].offloaded_groups();
  blocks_per_group_ = RemainingGroups() > 0 ? static_cast<int32_t>(blocks_after_one - blocks) : 0;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> RemoteOffloader::Remap(int32_t delta_groups,
                                               const PendingReleases* releases) {
  absl::StatusOr<std::vector<vamp::v1::CapacityResponse>> capacity = group_->Capacity(delta_groups);
  if (!capacity.ok()) return capacity.status();
  int64_t target = INT64_MAX;
  for (const auto& c : *capacity) target = std::min(target, c.kv_blocks_after());
  vamp::v1::StepRequest remap;
  remap.set_step_id(next_step_id_());
  vamp::v1::RemapCommand* command = remap.add_remaps();
  command->set_action(delta_groups > 0 ? vamp::v1::RemapCommand::ACTION_OFFLOAD
                                       : vamp::v1::RemapCommand::ACTION_RESTORE);
  command->set_num_groups(std::abs(delta_groups));
  command->set_expected_kv_blocks(target);
  command->set_remap_id(absl::StrCat("remap-", ++next_remap_));
  if (releases != nullptr) {
    // Agents drop these before remapping: they may hold blocks of the tail a restore unmaps.
    remap.mutable_finished_request_ids()->Add(releases->finished.begin(), releases->finished.end());
    remap.mutable_preempted_request_ids()->Add(releases->preempted.begin(),
                                               releases->preempted.end());
  }
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> done = group_->Step(remap);
  if (!done.ok()) {
    // Some ranks may have applied it: undo on all so they keep identical tables.
    if (group_->healthy()) {
      vamp::v1::StepRequest rollback;
      rollback.set_step_id(next_step_id_());
      rollback.add_rollback_remap_ids(command->remap_id());
      absl::StatusOr<std::vector<vamp::v1::StepResponse>> undone = group_->Step(rollback);
      if (!undone.ok())
        VAMP_LOG(ERROR) << "rolling back " << command->remap_id() << ": " << undone.status();
    }
    VAMP_LOG(ERROR) << "remap of " << delta_groups << " groups failed: " << done.status();
    if (absl::Status s = Refresh(); !s.ok()) VAMP_LOG(ERROR) << "after rollback: " << s;
    return done.status();
  }
  const int64_t before = kv_blocks_;
  if (absl::Status s = Refresh(); !s.ok()) return s;
  VAMP_LOG(INFO) << (delta_groups > 0 ? "offloaded " : "restored ") << std::abs(delta_groups)
                 << " expert group(s): KV pool " << before << " -> " << kv_blocks_ << " blocks";
  return static_cast<int32_t>(std::abs(kv_blocks_ - before));
}

absl::StatusOr<int32_t> RemoteOffloader::Offload(int32_t groups) {
  if (groups <= 0 || groups > RemainingGroups()) {
    return absl::InvalidArgumentError(absl::StrCat("offload: ", groups, " groups requested, ",
                                                   RemainingGroups(), " remain under the cap"));
  }
  return Remap(groups, nullptr);
}

int32_t RemoteOffloader::BlocksRemovedByRestore(int32_t groups) const {
  absl::StatusOr<std::vector<vamp::v1::CapacityResponse>> capacity = group_->Capacity(-groups);
  if (!capacity.ok()) {
    VAMP_LOG(WARNING) << "capacity query for a restore of " << groups
                      << " groups failed, estimating: " << capacity.status();
    return groups * blocks_per_group_;
  }
  int64_t after = INT64_MAX;
  for (const auto& c : *capacity) after = std::min(after, c.kv_blocks_after());
  return static_cast<int32_t>(std::max<int64_t>(0, kv_blocks_ - after));
}

absl::Status RemoteOffloader::Restore(int32_t groups, const PendingReleases& releases) {
  if (groups <= 0 || groups > offloaded_groups_) {
    return absl::InvalidArgumentError(absl::StrCat("restore: ", groups, " groups requested, ",
                                                   offloaded_groups_, " are offloaded"));
  }
  return Remap(-groups, &releases).status();
}

}  // namespace vamp
