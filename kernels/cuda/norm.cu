#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::AsFloat;
using internal::FromFloat;

// One block per row: hidden sizes of interest (64 .. 8192) fit a few elements per thread.
constexpr int kNormThreads = 256;

// T is the storage type of x and out (float or __nv_bfloat16); the residual, the weight and all
// arithmetic are float32. When `residual` is non-null: residual += x first, and the norm is of the
// updated residual.
template <typename T>
__global__ void RmsNormKernel(const T* x, int64_t x_stride, float* residual,
                              int64_t residual_stride, const float* weight, float eps,
                              int64_t hidden, T* out, int64_t out_stride) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_stride;
  float* rr = residual != nullptr ? residual + row * residual_stride : nullptr;
  if (rr != nullptr) {
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) rr[j] += AsFloat(xr[j]);
    // each thread re-reads only the residual elements it wrote: no barrier needed
  }
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = rr != nullptr ? rr[j] : AsFloat(xr[j]);
    sum_sq += v * v;
  }
  sum_sq = internal::BlockSum(sum_sq, scratch);  // barrier: all of x read before out is written
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  T* o = out + row * out_stride;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = rr != nullptr ? rr[j] : AsFloat(xr[j]);
    o[j] = FromFloat<T>(weight[j] * (v * inv_rms));
  }
}

}  // namespace

absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps,
                     int64_t num_rows, int64_t hidden, float* out, int64_t out_stride,
                     cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  RmsNormKernel<float><<<num_rows, kNormThreads, 0, stream>>>(x, x_stride, nullptr, 0, weight, eps,
                                                              hidden, out, out_stride);
  return internal::LaunchStatus("RmsNormKernel");
}

absl::Status FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                             const float* weight, float eps, int64_t num_rows, int64_t hidden,
                             cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  RmsNormKernel<float><<<num_rows, kNormThreads, 0, stream>>>(
      x, x_stride, residual, residual_stride, weight, eps, hidden, x, x_stride);
  return internal::LaunchStatus("FusedAddRmsNormKernel");
}

absl::Status FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual,
                             int64_t residual_stride, const float* weight, float eps,
                             int64_t num_rows, int64_t hidden, cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  __nv_bfloat16* xd = internal::AsDevice(x);
  RmsNormKernel<__nv_bfloat16><<<num_rows, kNormThreads, 0, stream>>>(
      xd, x_stride, residual, residual_stride, weight, eps, hidden, xd, x_stride);
  return internal::LaunchStatus("FusedAddRmsNormKernel<bf16>");
}

}  // namespace vamp::kernels::cuda
