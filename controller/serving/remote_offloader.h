// ExpertOffloader over the agents, which never asks them what a remap would give. Every rank
// declared at Init how its KV pool follows offloads and restores (InitResponse.offload with
// memory.page_bytes and memory.kv_pool_bytes): offloading n groups maps n x kv_pages_per_group
// pages at the end of its KV region, which then holds floor(mapped bytes / kv_block_bytes)
// blocks; restoring unmaps as many. The block count of any offload or restore on every rank is
// therefore arithmetic here, and every rank uses the cross-rank minimum (DESIGN.md invariant 2).
//
// Offload and Restore change this view at once and queue the remap (a RemapCommand carrying the
// expected block count); AttachTo puts what is queued on the next StepRequest, the step whose plan
// may already use the new blocks, so an offload costs no round trip of its own (it cost four
// blocking rounds to every rank before: a capacity query for the target, a remap-only step and
// two capacity refreshes). The agents apply the remap before anything else of that step, agree
// across ranks, and all refuse the step when any rank could not reach exactly the expected count
// (proto/vamp/v1/agent.proto, StepRequest). Then the engine calls Refused(): the view goes back to
// what it was before the step's remaps, their rollback is queued for the next step (a rank that
// applied one undoes it before anything else; one that did not has nothing to undo), and the
// returned block delta is what the scheduler gives back (Scheduler::RevertStep) before planning
// the step again. Offloads and restores then wait (Ready() is false) until the rollback step was
// answered and Options::retry_after_micros have passed (a rank that just failed to map pages is
// not asked again at once; time, not steps, so that an idle server, which runs no steps, accepts
// an operator's offload again too). A refused rollback is not recoverable here: the ranks may
// then differ.
//
// Confirm() checks every answered step: each rank must report the KV blocks, offloaded groups
// and mapped KV bytes this view expects (before its first remap a rank may use more blocks than
// the pool, all its region holds; the view knows how many). A rank that reports anything else (a
// broken or lying agent, for instance one claiming a remap it did not make) fails it, naming the
// rank and the field; the engine then stops serving with the group, which the controller
// initialises again, and the new view is built from the agents' own Init answers: the controller
// never goes on with a view the agents do not share.
//
// Not thread-safe: the engine thread owns it.
#ifndef VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_
#define VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/core/expert_offloader.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

class RemoteOffloader final : public ExpertOffloader {
 public:
  struct Options {
    // How long offloads and restores wait after a refused remap (µs, from the refusal; at least
    // until its rollback was answered).
    int64_t retry_after_micros = 1000000;
    // The clock of that wait; must outlive the offloader.
    const Clock* clock = &SteadyClock::Get();
  };

  // From the ranks' Init answers in rank order, checked by CheckInitResponses (agent_reports.h).
  // InvalidArgument when there are none or the ranks disagree on the groups offloaded.
  static absl::StatusOr<std::unique_ptr<RemoteOffloader>> Create(
      const std::vector<vamp::v1::InitResponse>& ranks, Options options);

  // ---- ExpertOffloader (this view; the agents follow on the next step) ----
  int32_t RemainingGroups() const override { return max_groups_ - view_.offloaded_groups; }
  int32_t BlocksPerGroup() const override;
  absl::StatusOr<int32_t> Offload(int32_t groups) override;
  bool Ready() const override;
  int32_t ExpertsPerGroup() const override { return experts_per_group_; }
  int32_t ExpertsPerLayer() const override { return experts_per_layer_; }
  int64_t StagedBytesPerGroup() const override { return staged_bytes_per_group_; }
  int32_t OffloadedGroups() const override { return view_.offloaded_groups; }
  int32_t BlocksRemovedByRestore(int32_t groups) const override;
  absl::Status Restore(int32_t groups) override;

  // ---- The steps that carry the remaps ----
  // Remaps or rollbacks wait for a step (the engine then sends one even when its plan is empty).
  bool has_queued() const { return !queued_.empty() || !rollbacks_.empty(); }
  // Moves what is queued onto `request` (remaps, rollback_remap_ids newest first); it is then in
  // flight until Confirm or Refused.
  void AttachTo(vamp::v1::StepRequest* request);
  // Every rank answered the step (`responses` in rank order): what it carried took effect.
  // Internal naming the rank and the field when a rank's reported memory is not this view.
  absl::Status Confirm(const std::vector<vamp::v1::StepResponse>& responses);
  // Every rank refused the step (`reason`): puts the view back as before its remaps, queues their
  // rollback and returns the blocks those remaps added to the pool (negative: removed).
  // FailedPrecondition when the step carried a rollback (the ranks may differ now) or no remap.
  absl::StatusOr<int32_t> Refused(const absl::Status& reason);

  // The id of the latest remap queued ("" before any), and what became of a remap: OK once the
  // step that carried it was confirmed, the refusal when it was refused, nullopt while it waits
  // or is in flight, or for an id this offloader does not remember (the last 64 are kept).
  const std::string& last_remap_id() const { return last_remap_id_; }
  std::optional<absl::Status> Outcome(const std::string& remap_id) const;

  // The pool every rank uses now (the cross-rank minimum) and the cap, in groups.
  int64_t kv_blocks() const { return view_.kv_blocks; }
  int32_t max_groups() const { return max_groups_; }

 private:
  // What one rank declared at Init.
  struct RankGeometry {
    uint64_t page_bytes = 0;
    uint64_t kv_block_bytes = 0;
    int64_t kv_pages_per_group = 0;
    uint64_t KvBytesPerGroup() const {
      return static_cast<uint64_t>(kv_pages_per_group) * page_bytes;
    }
  };
  // The offload state every rank has (or will have once the queued remaps ran).
  struct View {
    std::vector<uint64_t> kv_mapped_bytes;  // by rank
    // By rank: the blocks it lets its runner use. Until the first remap each rank uses all its
    // region holds; a remap sets every rank to the remap's expected count.
    std::vector<int64_t> rank_kv_blocks;
    int32_t offloaded_groups = 0;
    int64_t kv_blocks = 0;  // the pool: the cross-rank minimum, all the scheduler hands out
  };

  explicit RemoteOffloader(Options options) : options_(options) {}
  // The view after offloading (delta > 0) or restoring (delta < 0) |delta| groups from `view`.
  View After(const View& view, int32_t delta_groups) const;
  void Queue(vamp::v1::RemapCommand::Action action, int32_t groups, const View& after);
  void Remember(const std::string& remap_id, absl::Status outcome);

  const Options options_;
  std::vector<RankGeometry> ranks_;
  int32_t max_groups_ = 0;  // the smallest cap over ranks
  int32_t experts_per_group_ = 1;
  int32_t experts_per_layer_ = 0;
  int64_t staged_bytes_per_group_ = 0;  // the largest over ranks
  // Remap ids are unique per offloader: agents keep their history across controllers.
  std::string remap_id_prefix_;
  int64_t next_remap_ = 0;

  View view_;
  std::vector<vamp::v1::RemapCommand> queued_;
  std::optional<View> before_queued_;  // the view before the first queued remap
  std::vector<vamp::v1::RemapCommand> in_flight_;
  View before_in_flight_;
  std::vector<std::string> rollbacks_;  // queued, newest remap first
  std::vector<std::string> rollbacks_in_flight_;
  int64_t retry_at_micros_ = 0;  // offloads and restores wait until then (Options::clock)
  std::string last_remap_id_;
  std::deque<std::pair<std::string, absl::Status>> outcomes_;  // oldest first
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_REMOTE_OFFLOADER_H_
