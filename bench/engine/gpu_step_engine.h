// vamp_gpu_step_bench's engine: one rank built by BuildRank on the CUDA device (bfloat16, dummy
// weights of the model's shapes, VAMP-r up to the largest ratio measured), with its CUDA parts
// typed for the bench's counters.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_ENGINE_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_ENGINE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "bench/engine/gpu_step_flags.h"
#include "engine/memory/geometry.h"
#include "engine/model/model_config.h"
#include "engine/rank/cuda_device.h"
#include "engine/rank/rank.h"

namespace vamp::gpu_step_bench {

// The rank the bench drives, with its CUDA parts typed (both owned by the rank) and the time its
// weights took to load.
struct GpuEngine {
  std::unique_ptr<Rank> rank;
  CudaQwen3MoeModel* model = nullptr;         // the rank's device model
  CudaExpertStoreWeights* experts = nullptr;  // the rank's expert weights
  double load_seconds = 0;
};

// Builds the engine for `config` (loading logs progress); errors name the memory flags.
absl::StatusOr<std::unique_ptr<GpuEngine>> MakeEngine(const Flags& f, const ModelConfig& config);

// Groups to offload for VAMP-r: floor(r E) experts per eligible layer, whole groups.
int64_t GroupsFor(double ratio, const ExpertGeometry& g);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_ENGINE_H_
