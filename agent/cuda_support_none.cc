// agent/cuda_support.h in builds without the CUDA engine (VAMP_AGENT_CUDA off or no CUDA).
#include "absl/strings/str_cat.h"
#include "agent/cuda_support.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaAgentDevice(const AgentEngineOptions& options) {
  return absl::FailedPreconditionError(
      absl::StrCat("device ", options.device.ToString(), " needs a CUDA build of vamp-agent"));
}

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> JoinNcclGroup(const vamp::v1::InitRequest&,
                                                                   const AgentEngineOptions&,
                                                                   const std::atomic<bool>&) {
  return absl::FailedPreconditionError("a CUDA tensor-parallel group needs a CUDA build");
}

absl::StatusOr<std::string> CreateNcclUniqueId(const DeviceSpec& device) {
  return absl::FailedPreconditionError(
      absl::StrCat(device.ToString(), " needs a CUDA build of vamp-agent (VAMP_AGENT_CUDA)"));
}

}  // namespace vamp
