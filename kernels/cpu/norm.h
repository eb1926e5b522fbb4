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

// Gated RMSNorm (HF Qwen3NextRMSNormGated, the output norm of Gated DeltaNet). Each of the
// num_rows rows holds num_groups contiguous groups of group_dim elements (one token's value heads,
// group_dim = the value head size), and every group is normalised on its own with the same
// weight[group_dim]:
//   out[i, g, :] = (weight * RMSNorm(x[i, g, :])) * silu(z[i, g, :]),  silu(z) = z / (1 + exp(-z)),
// where element (i, g, d) is x[i * x_stride + g * group_dim + d], likewise z and out. Each group
// is normalised exactly as RmsNorm above normalises a row of group_dim elements, then multiplied
// by the gate: the result of a group depends only on its own x, z and weight. `out` may equal `x`
// (same strides); z must not overlap out.
void RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                  const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                  int64_t group_dim, float* out, int64_t out_stride);

// bfloat16 output: the float32 value above, rounded once (x, z and the weight stay float32; only
// the result is stored narrow, e.g. as the input of a bf16 out_proj GEMM). out must not overlap x
// or z.
void RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                  const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                  int64_t group_dim, BFloat16* out, int64_t out_stride);

// bfloat16 activations around a float32 residual stream (the bf16 model keeps the residual, the
// norm weights and the reduction in float32):
//   residual[i, :] += float(x[i, :]);  x[i, :] = bf16(RMSNorm(residual[i, :]) * weight).
// Equals the float32 FusedAddRmsNorm on float(x), with x rounded once at the end. The bf16 model
// zeroes the residual before layer 0 and gathers the embedding into x, so layer 0 uses this too.
void FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_NORM_H_
