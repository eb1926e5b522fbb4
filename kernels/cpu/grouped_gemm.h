// Grouped expert GEMM in bfloat16, CPU reference of kernels/cuda/grouped_gemm.h (same arguments,
// no stream). Conventions: see kernels/cpu/gemm.h.
//
// The CUDA twin reads the expert pointer table and the per-expert row offsets from device memory,
// so an MoE layer needs no host synchronisation; here both are host arrays. Arithmetic: inputs are
// widened to float32, every output element is a float32 sum of k products (cpu::Gemm's order,
// independent of the batch), and the result is rounded to bfloat16 once.
#ifndef VAMP_KERNELS_CPU_GROUPED_GEMM_H_
#define VAMP_KERNELS_CPU_GROUPED_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// For every expert e with rows: c[r, :] = a[r, :] x W_e^T for r in [expert_offsets[e],
// expert_offsets[e+1]), W_e = expert_weights[e] + weight_offset, [n, k] row-major with row stride
// ldw (elements). `a` is [max_rows, k] (row stride lda), `c` is [max_rows, n] (row stride ldc);
// rows owned by no expert are not written. `max_rows` bounds expert_offsets[num_experts] (the
// CUDA twin sizes its launch from it).
// InvalidArgument when: a size is negative; lda or ldw < k, or ldc < n; expert_offsets is not
// non-decreasing from >= 0 up to <= max_rows; an expert with rows has a null pointer (experts
// without rows are not read, so theirs may be null).
absl::Status GroupedExpertGemm(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               int64_t max_rows, BFloat16* c, int64_t ldc, int64_t n, int64_t k);

// The w13 GEMM fused with SiLU-and-mul: W_e is [2 * inter, k] (gate rows, then up rows), and
//   out[r, j] = silu(g) * u,  g = a[r, :] . W_e[j, :],  u = a[r, :] . W_e[inter + j, :]
// for j < inter, with g and u kept in float32 and the product rounded to bfloat16 once (the unfused
// path rounds g and u to bfloat16 before SiluAndMul, so the two differ by about one bf16 ulp).
// `out` is [max_rows, inter] with row stride ldo >= inter. Errors as GroupedExpertGemm.
absl::Status GroupedExpertGemmSiluMul(const BFloat16* a, int64_t lda,
                                      const BFloat16* const* expert_weights, int64_t weight_offset,
                                      int64_t ldw, const int32_t* expert_offsets,
                                      int64_t num_experts, int64_t max_rows, BFloat16* out,
                                      int64_t ldo, int64_t inter, int64_t k);

// The size and stride checks both twins make before touching memory (the CUDA twin cannot read
// the device offsets, so these are all it can check): InvalidArgument naming `name` for a negative
// size or a stride shorter than the row it holds (lda, ldw < k; ldc < out_cols, the output width:
// n, or inter when SiLU-and-mul is fused).
absl::Status CheckGroupedGemmShape(const char* name, int64_t lda, int64_t weight_offset,
                                   int64_t ldw, int64_t num_experts, int64_t max_rows, int64_t ldc,
                                   int64_t out_cols, int64_t k);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_GROUPED_GEMM_H_
