// The GPU kernel benchmarks' shared start-up (vamp_attention_bench, vamp_moe_bench,
// vamp_delta_rule_bench): select the device, make a non-blocking stream, run the benchmark on it
// and destroy the stream. The exit codes are the benchmarks' contract with their Python drivers:
// 0 done, 1 the benchmark failed (its error printed after the benchmark's name), 2 the device
// cannot be selected, 3 no CUDA device.
#ifndef VAMP_BENCH_KERNELS_BENCH_DEVICE_H_
#define VAMP_BENCH_KERNELS_BENCH_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace vamp::bench {

inline int RunOnCudaDevice(const char* name, int64_t device,
                           absl::FunctionRef<absl::Status(cudaStream_t)> run) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", name);
    return 3;
  }
  if (cudaSetDevice(static_cast<int>(device)) != cudaSuccess) {
    std::fprintf(stderr, "cuda_device: cannot select device %lld\n",
                 static_cast<long long>(device));
    return 2;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "%s: cudaStreamCreate failed\n", name);
    return 1;
  }
  int rc = 0;
  if (absl::Status s = run(stream); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
    rc = 1;
  }
  cudaStreamDestroy(stream);
  return rc;
}

}  // namespace vamp::bench

#endif  // VAMP_BENCH_KERNELS_BENCH_DEVICE_H_
