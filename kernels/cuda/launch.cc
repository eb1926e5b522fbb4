#include "kernels/cuda/launch.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace vamp::kernels::cuda::internal {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), absl::StrCat("launching ", kernel).c_str());
}

absl::Status MultiProcessorCount(int* count) {
  int device = 0;
  if (absl::Status s = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  return CudaStatus(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device),
                    "cudaDeviceGetAttribute(multiProcessorCount)");
}

namespace {

constexpr int kMaxCachedDevices = 64;
// Per device: 0 not yet queried, 1 no, 2 yes (a race queries twice and stores the same value).
std::atomic<int> g_wgmma_available[kMaxCachedDevices];

bool QueryWgmma(int device) {
#if defined(VAMP_CUDA_WGMMA)
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
#else
  (void)device;
  return false;
#endif
}

}  // namespace

bool WgmmaAvailable() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < 0 || device >= kMaxCachedDevices) return QueryWgmma(device);
  const int cached = g_wgmma_available[device].load(std::memory_order_relaxed);
  if (cached != 0) return cached == 2;
  const bool available = QueryWgmma(device);
  g_wgmma_available[device].store(available ? 2 : 1, std::memory_order_relaxed);
  return available;
}

}  // namespace vamp::kernels::cuda::internal
