// RMSNorm kernels, CUDA twins of kernels/cpu/norm.h (same arguments plus a stream; all pointers
// are device pointers). Results match the CPU twin up to float32 rounding (the sum of squares is
// reduced in a different order); bfloat16 outputs therefore within one bf16 ulp.
#ifndef VAMP_KERNELS_CUDA_NORM_H_
#define VAMP_KERNELS_CUDA_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// out[i, :] = RMSNorm(x[i, :]) * weight for i < num_rows. `out` may equal `x` (same strides).
absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps,
                     int64_t num_rows, int64_t hidden, float* out, int64_t out_stride,
                     cudaStream_t stream);

// residual[i, :] += x[i, :];  x[i, :] = RMSNorm(residual[i, :]) * weight. Both in place.
absl::Status FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                             const float* weight, float eps, int64_t num_rows, int64_t hidden,
                             cudaStream_t stream);

// bfloat16 x around a float32 residual, as cpu::FusedAddRmsNorm's bf16 overload:
//   residual[i, :] += float(x[i, :]);  x[i, :] = bf16(RMSNorm(residual[i, :]) * weight).
absl::Status FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual,
                             int64_t residual_stride, const float* weight, float eps,
                             int64_t num_rows, int64_t hidden, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_NORM_H_
