// vamp_gpu_step_bench's hardware probes: HBM bandwidth (a device-to-device copy), pinned
// host-to-device bandwidth by copy size, the logits copy host-side sampling would need, and the
// staging copies of one pass replayed alone. Timed with CUDA events on a private stream.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_BANDWIDTH_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_BANDWIDTH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/engine/gpu_step_flags.h"
#include "engine/experts/expert_store.h"
#include "engine/memory/cuda_buffers.h"

namespace vamp::gpu_step_bench {

struct Bandwidths {
  std::string device_name;
  uint64_t device_memory_bytes = 0;
  uint64_t hbm_copy_bytes = 0;
  double hbm_gbps = 0;  // 2 x bytes / time of a device-to-device copy (read + write)
  // Pinned host->device, by copy size.
  std::vector<std::pair<uint64_t, double>> h2d_gbps;
  double h2d_peak_gbps = 0;  // at --h2d_copy_mib
  // What host-side sampling would cost in transfers: B x vocab float32 logits to pageable host
  // memory (the runner samples on the GPU and copies only tokens).
  uint64_t logits_bytes = 0;
  double logits_d2h_ms = 0;
};

// Runs before the engine exists, so the copies have the device to themselves.
// Device `f.cuda_device` must be current; `vocab` sizes the logits copy.
absl::StatusOr<Bandwidths> MeasureBandwidths(const Flags& f, int64_t vocab);

// The staging copies of one pass (every staged layer's pinned range [b, E)) replayed back to back
// on `stream` into `scratch`: what the copies cost with nothing else running. Milliseconds.
absl::StatusOr<double> ReplayStagingCopies(const ExpertStore& store, const DeviceBuffer& scratch,
                                           cudaStream_t stream, int reps);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_BANDWIDTH_H_
