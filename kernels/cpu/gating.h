// Sigmoid gates, CPU reference (float32, with bfloat16 twins). Conventions: see kernels/cpu/gemm.h.
//
// Qwen3-Next gates two outputs with a sigmoid: the full-attention output, elementwise by a gate
// projected together with q (HF Qwen3NextAttention: attn_output * sigmoid(gate)), and the shared
// expert's output, per token by one scalar (HF Qwen3NextSparseMoeBlock:
// sigmoid(shared_expert_gate(x)) * shared_expert(x), added to the routed experts' output).
// sigmoid(x) = 1 / (1 + exp(-x)) everywhere.
#ifndef VAMP_KERNELS_CPU_GATING_H_
#define VAMP_KERNELS_CPU_GATING_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// x[r, c] = x[r, c] * sigmoid(gate[r, c]) for r < num_rows, c < cols. gate must not overlap x.
void SigmoidGate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride,
                 int64_t num_rows, int64_t cols);

// out[r, c] = out[r, c] + sigmoid(gate[r * gate_stride]) * y[r, c]: the product first, then the
// sum (HF's order). y must not overlap out.
void AddSigmoidScaled(float* out, int64_t out_stride, const float* y, int64_t y_stride,
                      const float* gate, int64_t gate_stride, int64_t num_rows, int64_t cols);

// bfloat16 twins (gemm.h: widened inputs, the float32 kernels' arithmetic, one rounding per output
// element). SigmoidGate's x and gate are both bf16 (the attention output and the gate half of the
// q projection). AddSigmoidScaled's per-row gate logit stays float32 (one value per token, as a
// float-output GEMM gives it); out[r, c] + sigmoid(gate) * y[r, c] is evaluated in float32 in the
// order above and rounded once: the product is not rounded to bf16 before the add.
void SigmoidGate(BFloat16* x, int64_t x_stride, const BFloat16* gate, int64_t gate_stride,
                 int64_t num_rows, int64_t cols);
void AddSigmoidScaled(BFloat16* out, int64_t out_stride, const BFloat16* y, int64_t y_stride,
                      const float* gate, int64_t gate_stride, int64_t num_rows, int64_t cols);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_GATING_H_
