// RMSNorm kernels, CPU reference (float32). Conventions: see kernels/cpu/gemm.h.
//
// RMSNorm as in HF Qwen3/Llama: y = w * x / sqrt(mean(x^2) + eps), per row of `hidden` elements.
#ifndef VAMP_KERNELS_CPU_NORM_H_
#define VAMP_KERNELS_CPU_NORM_H_

#include <cstdint>

namespace vamp::kernels::cpu {

// out[i, :] = RMSNorm(x[i, :]) * weight for i < num_rows. `out` may equal `x` (same strides).
void RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps, int64_t num_rows,
             int64_t hidden, float* out, int64_t out_stride);

// The residual stream update of a pre-norm decoder layer, fused:
//   residual[i, :] += x[i, :];  x[i, :] = RMSNorm(residual[i, :]) * weight.
// Both buffers are updated in place.
void FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_NORM_H_
