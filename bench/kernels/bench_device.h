// What the GPU kernel benchmarks (vamp_attention_bench, vamp_moe_bench, vamp_delta_rule_bench)
// share: a CUDA-call check that returns a Status, their start-up, the CUDA-event timing of a run
// and the device buffers a benchmark owns.
#ifndef VAMP_BENCH_KERNELS_BENCH_DEVICE_H_
#define VAMP_BENCH_KERNELS_BENCH_DEVICE_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// Returns InternalError naming the call and CUDA's message when `expr` fails.
#define VAMP_BENCH_CUDA(expr)                                                          \
  do {                                                                                 \
    const cudaError_t _err = (expr);                                                   \
    if (_err != cudaSuccess) {                                                         \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorString(_err))); \
    }                                                                                  \
  } while (0)

namespace vamp::bench {

// Select the device, make a non-blocking stream, run the benchmark on it and destroy the stream.
// The exit codes are the benchmarks' contract with their Python drivers: 0 done, 1 the benchmark
// failed (its error printed after the benchmark's name), 2 the device cannot be selected, 3 no
// CUDA device.
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

// The median device time of `fn` over `iters` runs after `warmup` untimed ones, in milliseconds:
// CUDA events recorded on `stream` around each run. The first error (of `fn`, of an event call or
// of the work itself, seen at the event's synchronisation) ends the timing and is returned.
inline absl::StatusOr<double> MedianEventMs(const std::function<absl::Status()>& fn, int64_t warmup,
                                            int64_t iters, cudaStream_t stream) {
  if (iters < 1) return absl::InvalidArgumentError("timing needs at least one timed run");
  cudaEvent_t start = nullptr, stop = nullptr;
  VAMP_BENCH_CUDA(cudaEventCreate(&start));
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return absl::InternalError("cudaEventCreate failed");
  }
  std::vector<double> times;
  absl::Status status;
  for (int64_t i = 0; i < warmup + iters && status.ok(); ++i) {
    cudaError_t err = cudaEventRecord(start, stream);
    if (err == cudaSuccess) {
      status = fn();
      if (!status.ok()) break;
      err = cudaEventRecord(stop, stream);
    }
    if (err == cudaSuccess) err = cudaEventSynchronize(stop);
    float ms = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
    if (err != cudaSuccess) {
      status = absl::InternalError(absl::StrCat("timing: ", cudaGetErrorString(err)));
      break;
    }
    if (i >= warmup) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Device buffers a benchmark allocates and fills, freed with it. Copies run on `stream` and are
// waited for.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(cudaStream_t stream) : stream_(stream) {}
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : allocations_) cudaFree(p);
  }

  // n elements of T (at least one, so that empty cases still get a valid pointer).
  template <typename T>
  absl::StatusOr<T*> Alloc(int64_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", n * sizeof(T), " bytes failed"));
    }
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  template <typename T>
  absl::Status Upload(T* dev, const std::vector<T>& host) {
    VAMP_BENCH_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(T),
                                    cudaMemcpyHostToDevice, stream_));
    VAMP_BENCH_CUDA(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // `pattern` copied over the n elements at `dev`, again and again (random inputs only need to be
  // finite and varied; generating gigabytes of them on the host would dominate the run).
  template <typename T>
  absl::Status Tile(T* dev, int64_t n, const std::vector<T>& pattern) {
    const int64_t size = static_cast<int64_t>(pattern.size());
    for (int64_t off = 0; off < n && size > 0; off += size) {
      const int64_t count = std::min(size, n - off);
      VAMP_BENCH_CUDA(cudaMemcpyAsync(dev + off, pattern.data(), count * sizeof(T),
                                      cudaMemcpyHostToDevice, stream_));
    }
    VAMP_BENCH_CUDA(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> allocations_;
};

}  // namespace vamp::bench

#endif  // VAMP_BENCH_KERNELS_BENCH_DEVICE_H_
