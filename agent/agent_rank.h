// Rank building for the agent: the device this agent runs on (the one place an agent chooses
// between the host and CUDA; CUDA builds only, agent/cuda_support.h) and the engine rank
// (engine/rank/rank.h) of a resolved InitRequest.
#ifndef VAMP_AGENT_AGENT_RANK_H_
#define VAMP_AGENT_AGENT_RANK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "agent/init_request.h"
#include "agent/tensor_parallel_group.h"
#include "engine/rank/rank.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

// The host device (host memory backend of --host_page_bytes pages, --host_memory_bytes as the
// device's memory) or the CUDA device of options.device. FailedPrecondition for a CUDA device in
// a build without the CUDA engine.
absl::StatusOr<std::unique_ptr<Device>> CreateAgentDevice(const AgentEngineOptions& options);

// Builds the rank of `request` (resolved as `resolved`, its plan sized for `backend`) on `device`
// with `backend`, all-reducing through `group` (null for tp_size 1; must outlive the rank).
// Loader errors name model_path.
absl::StatusOr<std::unique_ptr<Rank>> BuildAgentRank(const vamp::v1::InitRequest& request,
                                                     const ResolvedInit& resolved,
                                                     std::unique_ptr<Device> device,
                                                     std::unique_ptr<MemoryBackend> backend,
                                                     TensorParallelGroup* group);

}  // namespace vamp

#endif  // VAMP_AGENT_AGENT_RANK_H_
