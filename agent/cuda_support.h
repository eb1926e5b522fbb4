// What only a CUDA build of the agent has: the CUDA device its ranks are built on and the NCCL
// tensor-parallel group. The build chooses the implementation (agent/CMakeLists.txt):
// cuda_support.cc with the CUDA engine (VAMP_AGENT_CUDA), cuda_support_none.cc without it, whose
// functions fail with FailedPrecondition naming what needs a CUDA build.
#ifndef VAMP_AGENT_CUDA_SUPPORT_H_
#define VAMP_AGENT_CUDA_SUPPORT_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/init_request.h"
#include "agent/tensor_parallel_group.h"
#include "engine/rank/device.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

// The CUDA device of options.device (cuda:N) with the forward pass knobs of `options`.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaAgentDevice(const AgentEngineOptions& options);

// A fresh NCCL unique id (kNcclUniqueIdBytes); this process hosts its bootstrap root until the
// ranks have joined.
absl::StatusOr<std::string> CreateNcclUniqueId(const DeviceSpec& device);

// Joins the NCCL group of request.parallel().nccl_unique_id on options.device and checks it
// (JoinTensorParallelGroup's CUDA half; errors without its "parallel: " prefix).
absl::StatusOr<std::unique_ptr<TensorParallelGroup>> JoinNcclGroup(
    const vamp::v1::InitRequest& request, const AgentEngineOptions& options,
    const std::atomic<bool>& cancel);

}  // namespace vamp

#endif  // VAMP_AGENT_CUDA_SUPPORT_H_
