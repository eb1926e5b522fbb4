// Init validation: an InitRequest checked and completed with the engine's defaults (ResolveInit)
// before anything of the agent's current model is torn down, so a bad request leaves a working
// agent working.
#ifndef VAMP_AGENT_INIT_REQUEST_H_
#define VAMP_AGENT_INIT_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/agent_engine.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/dtype.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/runner/model_runner.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

// ParallelSpec.nccl_unique_id's size (NCCL_UNIQUE_ID_BYTES); known without NCCL so that requests
// are checked the same way in every build.
inline constexpr int kNcclUniqueIdBytes = 128;

// An InitRequest checked and completed with defaults.
struct ResolvedInit {
  DType dtype = DType::kFloat32;
  ModelConfig config;
  LoadOptions load;
  MemoryPlanConfig plan_config;
  MemoryPlan plan;
  RunnerConfig runner;
  ParallelConfig parallel;
};

// Checks `request` (InvalidArgument naming the field; FailedPrecondition when the memory budget
// cannot hold the model) and completes it with `options`' defaults. The memory plan divides
// `device_bytes` (the GPU's, or --host_memory_bytes on CPU) in pages of `page_bytes`.
absl::StatusOr<ResolvedInit> ResolveInit(const vamp::v1::InitRequest& request,
                                         const AgentEngineOptions& options, uint64_t device_bytes,
                                         uint64_t page_bytes);

}  // namespace vamp

#endif  // VAMP_AGENT_INIT_REQUEST_H_
