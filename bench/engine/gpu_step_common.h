// vamp_gpu_step_bench (bench/engine/gpu_step_bench.cc): what its parts share — units, wall-clock
// seconds and the summary of a series of timings.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_COMMON_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_COMMON_H_

#include <chrono>
#include <vector>

namespace vamp::gpu_step_bench {

inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

// Seconds of wall clock since `since`.
double Seconds(std::chrono::steady_clock::time_point since);

struct Summary {
  double p50 = 0, p90 = 0, mean = 0, min = 0;
};

// Median, 90th percentile, mean and minimum of `v` (all 0 when empty).
Summary Summarise(std::vector<double> v);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_COMMON_H_
