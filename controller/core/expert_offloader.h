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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/core/request.h"

namespace vamp {

// Requests the scheduler finished or preempted since its last plan. Their KV blocks are free in
// the controller's pool, but the agents still hold them until a step request names them, so a
// restore must deliver them before the agents give the withdrawn tail's pages back.
struct PendingReleases {
  std::vector<RequestId> finished;
  std::vector<RequestId> preempted;
  bool empty() const { return finished.empty() && preempted.empty(); }
};

// Offloads expert groups into the KV pool and restores them. Called at a step boundary, between
// steps.
class ExpertOffloader {
 public:
  virtual ~ExpertOffloader() = default;
  // Groups that can still be moved (0 at the offload limit).
  virtual int32_t RemainingGroups() const = 0;
  // KV blocks one group adds (for sizing plans; the real count comes from Offload).
  virtual int32_t BlocksPerGroup() const = 0;
  // Moves `groups` groups (<= RemainingGroups()) and returns how many KV blocks were added: the
  // minimum over all ranks, the same on every rank.
  virtual absl::StatusOr<int32_t> Offload(int32_t groups) = 0;

  // ---- Geometry for cost models (defaults: unknown) ----
  // g: rank-local expert shards per group.
  virtual int32_t ExpertsPerGroup() const { return 1; }
  // E: rank-local expert shards per MoE layer (0 = unknown; the cost model then does not cap).
  virtual int32_t ExpertsPerLayer() const { return 0; }
  // Host→device bytes one offloaded group adds to every step on a rank (all eligible layers; the
  // largest over ranks), or 0 when unknown. The offload tax is priced from it.
  virtual int64_t StagedBytesPerGroup() const { return 0; }

  // ---- Restore (the reverse move; optional, default: not supported) ----
  // Groups moved into the pool so far and not given back.
  virtual int32_t OffloadedGroups() const { return 0; }
  // KV blocks (the pool's highest ids) that must leave the pool before the last `groups` groups
  // (<= OffloadedGroups()) can go back to the experts.
  virtual int32_t BlocksRemovedByRestore(int32_t groups) const { return groups * BlocksPerGroup(); }
  // Moves the last `groups` groups back to the experts. Called after the pool dropped
  // BlocksRemovedByRestore(groups) blocks, so none of their pages is in use once the agents have
  // dropped `releases` (which they must do first; on success the releases count as delivered).
  virtual absl::Status Restore(int32_t groups, const PendingReleases& releases) {
    return absl::UnimplementedError("this offloader cannot restore");
  }
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_EXPERT_OFFLOADER_H_
