#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

// One block per row: hidden sizes of interest (64 .. 8192) fit a few elements per thread.
constexpr int kNormThreads = 256;

// When `residual` is non-null: residual += x first, and the norm is of the updated residual.
__global__ void RmsNormKernel(const float* x, int64_t x_stride, float* residual,
                              int64_t residual_stride, const float* weight, float eps,
                              int64_t hidden, float* out, int64_t out_stride) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * x_stride;
  const float* src = xr;
  if (residual != nullptr) {
    float* rr = residual + row * residual_stride;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) rr[j] += xr[j];
    src = rr;  // each thread re-reads only the elements it wrote: no barrier needed
  }
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) sum_sq += src[j] * src[j];
  sum_sq = internal::BlockSum(sum_sq, scratch);  // barrier: all of x read before out is written
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  float* o = out + row * out_stride;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = weight[j] * (src[j] * inv_rms);
}

}  // namespace

absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps,
                     int64_t num_rows, int64_t hidden, float* out, int64_t out_stride,
                     cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  RmsNormKernel<<<num_rows, kNormThreads, 0, stream>>>(x, x_stride, nullptr, 0, weight, eps, hidden,
                                                       out, out_stride);
  return internal::LaunchStatus("RmsNormKernel");
}

absl::Status FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                             const float* weight, float eps, int64_t num_rows, int64_t hidden,
                             cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  RmsNormKernel<<<num_rows, kNormThreads, 0, stream>>>(x, x_stride, residual, residual_stride,
                                                       weight, eps, hidden, x, x_stride);
  return internal::LaunchStatus("FusedAddRmsNormKernel");
}

}  // namespace vamp::kernels::cuda
