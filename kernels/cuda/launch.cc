#include "kernels/cuda/launch.h"

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

}  // namespace vamp::kernels::cuda::internal
