// Sigmoid gates of Qwen3-Next, CUDA twins of kernels/cpu/gating.h (same arguments plus a stream;
// all pointers are device pointers). Asynchronous on `stream`.
//
// Each output element is computed as in the CPU twin, in the same order and with no fused
// multiply-add (the product and the sum of AddSigmoidScaled are rounded separately, as on the
// CPU), so float32 results differ only by CUDA's expf inside the sigmoid (at most 2 ulp): a few
// 1e-7 relative. bfloat16 outputs round such nearly equal floats once, so they equal the CPU's or
// are one bf16 ulp away.
//
// Sizes: InvalidArgument (nothing launched) for a negative num_rows or cols, or num_rows beyond
// the grid (2^31 - 1); no launch when either is zero.
#ifndef VAMP_KERNELS_CUDA_GATING_H_
#define VAMP_KERNELS_CUDA_GATING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// x[r, c] = x[r, c] * sigmoid(gate[r, c]) for r < num_rows, c < cols. gate must not overlap x.
absl::Status SigmoidGate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride,
                         int64_t num_rows, int64_t cols, cudaStream_t stream);

// out[r, c] = out[r, c] + sigmoid(gate[r * gate_stride]) * y[r, c]: the product first, then the
// sum. y must not overlap out.
absl::Status AddSigmoidScaled(float* out, int64_t out_stride, const float* y, int64_t y_stride,
                              const float* gate, int64_t gate_stride, int64_t num_rows,
                              int64_t cols, cudaStream_t stream);

// bfloat16 twins, as cpu::SigmoidGate / cpu::AddSigmoidScaled's bf16 overloads: inputs widened,
// the float32 arithmetic above in registers, each output rounded to bf16 once (AddSigmoidScaled's
// gate logit stays float32).
absl::Status SigmoidGate(BFloat16* x, int64_t x_stride, const BFloat16* gate, int64_t gate_stride,
                         int64_t num_rows, int64_t cols, cudaStream_t stream);
absl::Status AddSigmoidScaled(BFloat16* out, int64_t out_stride, const BFloat16* y,
                              int64_t y_stride, const float* gate, int64_t gate_stride,
                              int64_t num_rows, int64_t cols, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_GATING_H_
