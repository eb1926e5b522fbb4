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

// Gated RMSNorm (Qwen3-Next's Gated DeltaNet output norm), as cpu::RmsNormGated: each row holds
// num_groups contiguous groups of group_dim elements, each normalised on its own with the same
// weight[group_dim], then multiplied by silu(z):
//   out[i, g, :] = (weight * RMSNorm(x[i, g, :])) * silu(z[i, g, :]),
// element (i, g, d) at x[i * x_stride + g * group_dim + d], likewise z and out. One warp per group,
// so any group_dim works (Qwen3-Next: 128; each lane takes every 32nd element). Besides the sum of
// squares' order, the gate's expf differs from the CPU's by at most 2 ulp. `out` may equal `x`
// (same strides); z must not overlap out. InvalidArgument (nothing launched) for a negative
// num_rows or num_groups, group_dim < 1, or more groups than the grid holds (num_rows * num_groups
// above 8 * (2^31 - 1)); no launch when num_rows or num_groups is zero.
absl::Status RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                          const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                          int64_t group_dim, float* out, int64_t out_stride, cudaStream_t stream);

// bfloat16 output, as cpu::RmsNormGated's bf16 overload: the float32 value above rounded once
// (x, z and the weight float32). out must not overlap x or z.
absl::Status RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                          const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                          int64_t group_dim, BFloat16* out, int64_t out_stride,
                          cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_NORM_H_
