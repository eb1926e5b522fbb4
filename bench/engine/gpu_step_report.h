// vamp_gpu_step_bench's report: the human table (stdout) and the --json file
// run_gpu_step_bench.sh turns into the report next to the HF transformers baseline.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_REPORT_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/engine/gpu_step_bandwidth.h"
#include "bench/engine/gpu_step_engine.h"
#include "bench/engine/gpu_step_flags.h"
#include "bench/engine/gpu_step_floors.h"
#include "bench/engine/gpu_step_workload.h"

namespace vamp::gpu_step_bench {

// The table of `points` (the first is the resident decode point) with the floors.
std::string FormatReport(const Flags& f, const Bandwidths& bw, const DecodeFloor& floor,
                         const ExpertGeometry& g, const std::vector<PointResult>& points);

// Writes everything as JSON to f.json (nothing when empty); Internal when it cannot be written.
absl::Status WriteJsonReport(const Flags& f, const Bandwidths& bw, const GpuEngine& e,
                             const DecodeFloor& floor, const std::vector<PointResult>& points);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_REPORT_H_
