// Rank: everything one tensor-parallel rank holds to run its shard of a model — memory backend,
// memory plan, page pool, expert store, KV region and page remapper (AgentMemory), the device's
// expert weights and staging, the loaded model (and its device twin) and the ModelRunner — built
// in one place, BuildRank, on any Device (device.h). The agent, the engine benches and the runner
// tests all build ranks here.
//
// Assembly order (BuildRank): backend, plan, fence, memory, expert weights (on the store), host
// model (the loader writes expert shards through the expert weights), FinalizeLoad, device model,
// KV view, runner. Teardown is the reverse: members are declared in assembly order.
//
// Ownership: a Rank owns everything it lists. Not thread-safe: one thread at a time (the runner's
// contract).
#ifndef VAMP_ENGINE_RANK_RANK_H_
#define VAMP_ENGINE_RANK_RANK_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/kv/agent_memory.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/dtype.h"
#include "engine/model/model_loader.h"
#include "engine/rank/device.h"
#include "engine/runner/model_runner.h"

namespace vamp {

// Loads the rank's model, writing its expert shards through `sink`. `plan` is the rank's memory
// plan (for progress reports).
using RankModelLoader = std::function<absl::StatusOr<std::unique_ptr<CausalLm>>(
    const ModelConfig& config, const MemoryPlan& plan, ExpertWeightSink& sink)>;

// LoadModel (config.json + safetensors, or dummy weights) as a RankModelLoader.
RankModelLoader LoadWith(LoadOptions options);

struct RankSpec {
  // Required; owned by the rank.
  std::unique_ptr<Device> device;
  // Optional: a backend the caller already created on `device` (to size its plan); otherwise
  // device->CreateMemoryBackend().
  std::unique_ptr<MemoryBackend> backend;
  ModelConfig config;
  ParallelConfig parallel;
  // The element type of expert shards and KV the plan and the store use (the device's compute
  // type: float32 on the host).
  DType dtype = DType::kFloat32;
  // The memory plan's configuration. Its page_bytes is the backend's; device_memory_bytes 0 means
  // the backend's. With kv_pages > 0 the plan's baseline KV pool is exactly that many pages
  // (PlanWithKvPages) instead.
  MemoryPlanConfig plan;
  int64_t kv_pages = 0;
  // The runner's configuration (also sizes the device model's workspace).
  RunnerConfig runner;
  // Required.
  RankModelLoader load;
  // The tensor-parallel sum (null for tp_size 1): the runner's on the host, the device model's on
  // a device that reduces on the device (CUDA: NCCL). Must outlive the rank.
  Communicator* comm = nullptr;
  DeviceAllReduce* all_reduce = nullptr;
};

struct Rank {
  // The runner's KV view of the region's first `blocks` blocks (all mapped blocks when < 0).
  absl::StatusOr<KvCacheView> KvView(int64_t blocks = -1) const;
  // Hands the runner the KV view of the first `blocks` blocks (all when < 0): after every remap.
  absl::Status RefreshKv(int64_t blocks = -1);
  // A fresh runner (every request forgotten) over `blocks` blocks (all when < 0), all-reducing
  // through `comm` (may be null; must outlive the runner).
  absl::Status ResetRunner(Communicator* comm, int64_t blocks = -1);
  // What the runner runs: the device model, or the host model.
  CausalLm& model() const { return device_model != nullptr ? *device_model : *host_model; }
  ExpertWeights& expert_weights() const { return experts->weights(); }

  std::unique_ptr<Device> device;
  ModelConfig config;
  MemoryPlan plan;
  RunnerConfig runner_config;
  std::unique_ptr<MemoryBackend> backend;
  std::unique_ptr<InFlightFence> fence;
  AgentMemory memory;
  std::unique_ptr<RankExperts> experts;
  // The loaded model; on a device, the host copy the device model wraps.
  std::unique_ptr<CausalLm> host_model;
  std::unique_ptr<CausalLm> device_model;  // null on the host
  std::unique_ptr<ModelRunner> runner;
  // What the non-expert weights occupy where the forward pass reads them, bytes.
  uint64_t other_weight_bytes = 0;
};

// Builds a rank (see the assembly order above). Errors name the part that failed ("memory
// backend: ", "memory: ", "expert store: ", "device model: ", ...); the loader's errors come as it
// returns them. FailedPrecondition/InvalidArgument from the plan as PlanMemory returns them.
absl::StatusOr<std::unique_ptr<Rank>> BuildRank(RankSpec spec);

}  // namespace vamp

#endif  // VAMP_ENGINE_RANK_RANK_H_
