// vamp_gpu_step_bench's floor models (see gpu_step_bench.cc): the decode floor (the bytes a decode
// step must read over HBM bandwidth) and, per point, the staging floor max(resident forward,
// staged bytes / pinned H2D bandwidth) with the overheads against the resident point.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_FLOORS_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_FLOORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/engine/gpu_step_bandwidth.h"
#include "bench/engine/gpu_step_engine.h"
#include "bench/engine/gpu_step_flags.h"
#include "bench/engine/gpu_step_workload.h"

namespace vamp::gpu_step_bench {

struct DecodeFloor {
  std::string model_type;  // the config's, for the report
  int64_t tokens = 0;
  double expected_experts_per_layer = 0;
  double non_expert_bytes = 0;
  double expert_bytes = 0;
  double kv_bytes = 0;
  // Recurrent state (Qwen3-Next's linear-attention layers): every sequence's state is read and
  // written once per step.
  double state_bytes = 0;
  double total_bytes = 0;
  double ms = 0;
  std::string estimate;
};

// The decode floor of f.batch sequences at the timed steps' mean context on `e`, at `hbm_gbps`.
DecodeFloor ComputeDecodeFloor(const Flags& f, const GpuEngine& e, double hbm_gbps);

// Fills each point's floor and overhead fields against the resident point of its mode (Internal
// when there is none).
absl::Status ApplyStagingFloors(const Bandwidths& bw, std::vector<PointResult>* points);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_FLOORS_H_
