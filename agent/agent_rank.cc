#include "agent/agent_rank.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/cuda_support.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<Device>> CreateAgentDevice(const AgentEngineOptions& options) {
  if (options.device.kind == DeviceSpec::Kind::kCuda) return CreateCudaAgentDevice(options);
  HostDeviceOptions host;
  host.page_bytes = options.host_page_bytes;
  host.memory_bytes = options.host_memory_bytes;
  host.populate = options.host_populate;
  return CreateHostDevice(host);
}

absl::StatusOr<std::unique_ptr<Rank>> BuildAgentRank(const vamp::v1::InitRequest& request,
                                                     const ResolvedInit& resolved,
                                                     std::unique_ptr<Device> device,
                                                     std::unique_ptr<MemoryBackend> backend,
                                                     TensorParallelGroup* group) {
  RankSpec spec;
  spec.device = std::move(device);
  spec.backend = std::move(backend);
  spec.config = resolved.config;
  spec.parallel = resolved.parallel;
  spec.dtype = resolved.dtype;
  spec.plan = resolved.plan_config;
  spec.runner = resolved.runner;
  const LoadOptions load = resolved.load;
  const std::string prefix = absl::StrCat("model_path '", request.model_path(), "': ");
  spec.load = [&load, &prefix](
                  const ModelConfig& config, const MemoryPlan&,
                  ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    absl::StatusOr<std::unique_ptr<CausalLm>> model = LoadModel(config, load, sink);
    if (!model.ok()) return WithPrefix(model.status(), prefix);
    return model;
  };
  if (group != nullptr) {
    spec.comm = group->host_communicator();
    spec.all_reduce = group->device_all_reduce();
  }
  return BuildRank(std::move(spec));
}

}  // namespace vamp
