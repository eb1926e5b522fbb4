// vamp_gpu_step_bench's command line: the schema, and the flags read and checked from it.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_FLAGS_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"

namespace vamp::gpu_step_bench {

// The bench's flags, their defaults and ranges.
ConfigSchema Schema();

// The flags as read (copy sizes in bytes).
struct Flags {
  std::string model_dir;
  int64_t batch = 0, context = 0, prefill_tokens = 0, steps = 0, warmup = 0;
  std::vector<double> ratios;
  double gpu_memory_utilization = 0;
  int64_t max_num_batched_tokens = 0, block_size = 0, device_gemm_max_rows_per_expert = 0;
  bool routed_staging = false;
  bool attention_mma_sync_only = false;
  bool grouped_gemm_decode_tile = true;
  bool cuda_profiler = false;  // cudaProfilerStart/Stop around the timed steps
  int cuda_device = 0;
  uint64_t seed = 0;
  uint64_t hbm_copy_bytes = 0, h2d_copy_bytes = 0;
  int bandwidth_reps = 0;
  std::string json;
};

// "0,0.05,0.1" -> {0, 0.05, 0.1}: sorted, deduplicated, 0 added when missing.
absl::StatusOr<std::vector<double>> ParseRatios(absl::string_view text);

// The flags of `c` (parsed with Schema()); InvalidArgument naming the flag when a step of the
// workload cannot fit max_num_batched_tokens.
absl::StatusOr<Flags> ReadFlags(const Config& c);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_FLAGS_H_
