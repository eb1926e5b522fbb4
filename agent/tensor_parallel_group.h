// The tensor-parallel group of one agent rank, for one Init. CPU agents all-reduce through a
// TcpCommunicator (rank 0 listens on parallel.host_transport_address, the others connect); CUDA
// agents on the device through NCCL, joined from parallel.nccl_unique_id and checked with one
// all-reduce of GroupFingerprint (every rank must get the same request; it also connects the
// peers), in CUDA builds only (agent/cuda_support.h).
//
// Thread-safety: Abort() and Check() may be called from any thread at any time (a step stuck in a
// collective on a dead peer is ended by Abort from another thread); the rest is used by one
// thread.
#ifndef VAMP_AGENT_TENSOR_PARALLEL_GROUP_H_
#define VAMP_AGENT_TENSOR_PARALLEL_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/agent_engine.h"
#include "engine/model/parallel.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

class DeviceAllReduce;  // engine/runner/cuda/device_all_reduce.h (CUDA builds)

// Identifies what every rank of a group must agree on: the InitRequest without the rank.
uint64_t GroupFingerprint(const vamp::v1::InitRequest& request);

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  // The runner's all-reduce on the host (TCP groups), else null.
  virtual Communicator* host_communicator() { return nullptr; }
  // The device model's all-reduce (NCCL groups), else null.
  virtual DeviceAllReduce* device_all_reduce() { return nullptr; }
  // Fails a collective or connection in progress.
  virtual void Abort(const absl::Status& reason) = 0;
  // OK while the group is healthy; the error of a failed peer (or Abort) of an NCCL group.
  virtual absl::Status Check() { return absl::OkStatus(); }
  // Whether `ok` holds on every rank: one all-reduce of a flag, which every rank must call at the
  // same point of its sequence of collectives (the agent engine does, for every step that has
  // rollbacks or remaps, before that step's forward pass). An error when the collective fails (a
  // peer died, a timeout, Abort).
  virtual absl::StatusOr<bool> AllRanksOk(bool ok) = 0;
};

// Joins the group of `request` (tp_size > 1) as its rank: over TCP on the host, through NCCL on
// `options.device` when it is a CUDA device. Waits at most options.tp_connect_timeout_ms for the
// other ranks; `cancel` (set by Abort while the group forms) ends the wait. Errors are prefixed
// "parallel: ": DeadlineExceeded when the ranks do not join, FailedPrecondition when their
// requests differ or the build has no CUDA engine.
absl::StatusOr<std::unique_ptr<TensorParallelGroup>> JoinTensorParallelGroup(
    const vamp::v1::InitRequest& request, const AgentEngineOptions& options,
    const std::atomic<bool>& cancel);

// A fresh NCCL unique id for the next Init of a CUDA group (AgentEngine::CreateCollectiveId).
absl::StatusOr<std::string> CreateCollectiveId(const DeviceSpec& device);

}  // namespace vamp

#endif  // VAMP_AGENT_TENSOR_PARALLEL_GROUP_H_
