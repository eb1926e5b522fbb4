// RMSNorm kernels, CPU reference (float32). Conventions: see kernels/cpu/gemm.h.
//
// RMSNorm as in HF Qwen3/Llama: y = w * x / sqrt(mean(x^2) + eps), per row of `hidden` elements.
#ifndef VAMP_KERNELS_CPU_NORM_H_
#define VAMP_KERNELS_CPU_NORM_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// out[i, :] = RMSNorm(x[i, :]) * weight for i < num_rows. `out` may equal `x` (same strides).
void RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps, int64_t num_rows,
             int64_t hidden, float* out, int64_t out_stride);

// The residual stream update of a pre-norm decoder layer, fused:
//   residual[i, :] += x[i, :];  x[i, :] = RMSNorm(residual[i, :]) * weight.
// Both buffers are updated in place.
void FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden);

// Gated RMSNorm (HF Qwen3NextRMSNormGated, the output norm of Gated DeltaNet), per row of `dim`
// elements (one value head of one token):
//   out[i, :] = (weight * RMSNorm(x[i, :])) * silu(z[i, :]),  silu(z) = z / (1 + exp(-z)),
// normalised exactly as RmsNorm above, then multiplied by the gate. `out` may equal `x` (same
// strides); z must not overlap out.
void RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                  const float* weight, float eps, int64_t num_rows, int64_t dim, float* out,
                  int64_t out_stride);

// bfloat16 activations around a float32 residual stream (the bf16 model keeps the residual, the
// norm weights and the reduction in float32):
//   residual[i, :] += float(x[i, :]);  x[i, :] = bf16(RMSNorm(residual[i, :]) * weight).
// Equals the float32 FusedAddRmsNorm on float(x), with x rounded once at the end. The bf16 model
// zeroes the residual before layer 0 and gathers the embedding into x, so layer 0 uses this too.
void FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_NORM_H_
