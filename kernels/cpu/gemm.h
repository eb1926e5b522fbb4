// Dense matrix multiplication, CPU reference (float32).
//
// Conventions shared by every kernel in kernels/cpu/ (and copied by the CUDA twins in
// kernels/cuda/, which take the same arguments followed by a stream):
//   - matrices are row-major; a stride ("ld*", "*_stride") is the number of ELEMENTS between the
//     starts of consecutive rows, so views into wider buffers need no copies;
//   - weights are stored as in HF checkpoints, [out_features, in_features];
//   - every output element is computed from its own row of inputs in an order that depends only on
//     the sizes of the reduction, never on how many rows are in the batch or where a row sits in
//     it. This is what makes chunked prefill, prefix-cache hits and any expert residency boundary
//     give bit-identical results on the CPU (shared/DESIGN.md, invariants 1 and 4);
//   - bfloat16 overloads (kernels/cpu/bfloat16.h) store weights and activations in bf16 but
//     compute in float32: every bf16 input is widened exactly, the float32 kernel's arithmetic runs
//     unchanged, and each bf16 output is rounded once (to nearest, ties to even). A bf16 twin
//     therefore equals its float32 kernel applied to the widened inputs, then rounded: the float32
//     kernels stay the single definition of the arithmetic.
#ifndef VAMP_KERNELS_CPU_GEMM_H_
#define VAMP_KERNELS_CPU_GEMM_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// c[i, j] = sum_p a[i, p] * w[j, p] for i < m, j < n: `a` is [m, k] (row stride lda), `w` is
// [n, k] (row stride ldw), `c` is [m, n] (row stride ldc). `c` must not alias `a` or `w`.
void Gemm(const float* a, int64_t lda, const float* w, int64_t ldw, float* c, int64_t ldc,
          int64_t m, int64_t n, int64_t k);

// bfloat16 a and w, float32 accumulation; c rounded to bfloat16 once per element (attention and
// expert projections) or kept in float32 (router logits, LM-head logits). Same sizes and strides
// as above. Each element equals the float32 Gemm on the widened inputs (rounded for bf16 c).
void Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, BFloat16* c, int64_t ldc,
          int64_t m, int64_t n, int64_t k);
void Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, float* c, int64_t ldc,
          int64_t m, int64_t n, int64_t k);

// The dot product of two length-k vectors with exactly the accumulation order Gemm uses; exposed
// so that other kernels (attention) and tests share one definition.
float Dot(const float* x, const float* y, int64_t k);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_GEMM_H_
