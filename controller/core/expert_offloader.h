// The vocabulary of VAMP's one idea, used the same way in the controller, the agents, the
// protocol, the metrics and vamp-sim:
//   offload  expert groups leave the expert region (their weights are then staged from pinned host
//            copies every step) and their pages join the KV pool, which grows at its tail;
//   restore  the reverse: the pool gives its tail back and the experts return;
//   remap    the page-level operation an agent performs to carry out one offload or restore
//            (RemapCommand in proto/vamp/v1/agent.proto, agent/rank_remapper.h,
//            engine/kv/page_remapper.h).
// ExpertOffloader is the controller core's handle on that move; the agents' (RemoteOffloader,
// controller/serving/remote_offloader.h) and the simulator's (SimOffloader, sim/sim_offloader.h)
// implement it.
#ifndef VAMP_CONTROLLER_CORE_EXPERT_OFFLOADER_H_
#define VAMP_CONTROLLER_CORE_EXPERT_OFFLOADER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vamp {

// Offloads expert groups into the KV pool and restores them, for the scheduler, at a step
// boundary. Both take effect in the scheduler's view at once: Offload returns the blocks the pool
// gains, which the very step being planned may hand out, and Restore is called once the blocks
// BlocksRemovedByRestore named have left the pool. The agents carry the remap out before they
// run the next step, which is the plan being built (or, between steps, the next one): its
// finished and preempted ids reach them first, so a restore never unmaps a block an agent still
// holds for a request the scheduler already released. An implementation that drives agents
// learns only when that step is answered whether they could; if they refused it, the scheduler
// undoes the plan (Scheduler::RevertStep) and plans it again while Ready() says no.
class ExpertOffloader {
 public:
  virtual ~ExpertOffloader() = default;
  // Groups that can still be offloaded (0 at the cap).
  virtual int32_t RemainingGroups() const = 0;
  // KV blocks the next group adds (for sizing plans; Offload returns the real count).
  virtual int32_t BlocksPerGroup() const = 0;
  // Offloads `groups` groups (<= RemainingGroups()) and returns how many KV blocks the pool
  // gains: the minimum over all ranks, the same on every rank.
  virtual absl::StatusOr<int32_t> Offload(int32_t groups) = 0;
  // False while offloads and restores must wait (a refused remap is being rolled back).
  virtual bool Ready() const { return true; }

  // ---- Geometry for cost models (defaults: unknown) ----
  // g: rank-local expert shards per group.
  virtual int32_t ExpertsPerGroup() const { return 1; }
  // E: rank-local expert shards per MoE layer (0 = unknown; the cost model then does not cap).
  virtual int32_t ExpertsPerLayer() const { return 0; }
  // Host→device bytes one offloaded group adds to every step on a rank (all eligible layers; the
  // largest over ranks), or 0 when unknown. The offload tax is priced from it.
  virtual int64_t StagedBytesPerGroup() const { return 0; }

  // ---- Restore (the reverse move; optional, default: not supported) ----
  // Groups offloaded so far and not restored.
  virtual int32_t OffloadedGroups() const { return 0; }
  // KV blocks (the pool's highest ids) that must leave the pool before the last `groups` groups
  // (<= OffloadedGroups()) can be restored.
  virtual int32_t BlocksRemovedByRestore(int32_t groups) const { return groups * BlocksPerGroup(); }
  // Restores the last `groups` groups. Called after the pool dropped
  // BlocksRemovedByRestore(groups) blocks.
  virtual absl::Status Restore(int32_t groups) {
    return absl::UnimplementedError("this offloader cannot restore");
  }
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_EXPERT_OFFLOADER_H_
