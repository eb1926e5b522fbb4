// Mixture-of-Experts kernels, CPU reference (float32). Conventions: see kernels/cpu/gemm.h.
//
// One MoE layer runs as:
//   RouterTopK        router logits -> top-k expert ids and weights per token
//   MoePermute        (token, choice) pairs sorted by expert: expert_offsets, row_token, pair_row
//   GatherRows        hidden states copied into that order (one row per pair; copy.h)
//   ExpertGemm (w13)  per expert: rows x [gate | up]^T through the expert pointer table
//   SiluAndMul        silu(gate) * up
//   ExpertGemm (w2)   per expert: rows x down^T
//   MoeUnpermute      out[token] = sum over its choices of weight * row, in choice order
//
// Expert weights are reached only through a per-layer pointer table: expert_weights[e] points at
// expert e's rank-local shard [w13 | w2] wherever it lives (the resident expert region below the
// residency boundary, a staging buffer above it), so where an expert is stored never changes what
// is computed.
#ifndef VAMP_KERNELS_CPU_MOE_H_
#define VAMP_KERNELS_CPU_MOE_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// Softmax over each row of router_logits ([num_tokens, num_experts], row stride logits_stride),
// then the top_k largest probabilities in descending order (ties: lower expert id first), divided
// by their sum when `renormalize` (HF norm_topk_prob). Writes topk_ids and topk_weights,
// [num_tokens, top_k] each, contiguous.
void RouterTopK(const float* router_logits, int64_t logits_stride, int64_t num_tokens,
                int64_t num_experts, int64_t top_k, bool renormalize, int32_t* topk_ids,
                float* topk_weights);

// Counting sort of the num_tokens * top_k (token, choice) pairs by expert, stable in
// (token, choice) order. Outputs:
//   expert_offsets [num_experts + 1]: expert e owns permuted rows [offsets[e], offsets[e+1]);
//   row_token [num_tokens * top_k]: the token of each permuted row;
//   pair_row [num_tokens * top_k]: the permuted row of pair (t, j) at index t * top_k + j.
// Every topk_ids entry must be in [0, num_experts).
void MoePermute(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k, int64_t num_experts,
                int32_t* expert_offsets, int32_t* row_token, int32_t* pair_row);

// For every expert e with rows (expert_offsets[e] < expert_offsets[e+1]):
//   c[r, :] = a[r, :] x W_e^T for r in its rows, W_e = expert_weights[e] + weight_offset, [n, k]
//   with row stride ldw.
// Experts without rows are not read (their pointer may be null). Same arithmetic as Gemm.
void ExpertGemm(const float* a, int64_t lda, const float* const* expert_weights,
                int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                int64_t num_experts, float* c, int64_t ldc, int64_t n, int64_t k);

// out[r, j] = silu(x[r, j]) * x[r, inter + j] for j < inter: x holds [gate | up] per row.
void SiluAndMul(const float* x, int64_t x_stride, int64_t num_rows, int64_t inter, float* out,
                int64_t out_stride);

// out[t, :] = sum_{j < top_k} topk_weights[t*top_k + j] * expert_out[pair_row[t*top_k + j], :],
// accumulated in choice order j = 0, 1, ...
void MoeUnpermute(const float* expert_out, int64_t expert_out_stride, const int32_t* pair_row,
                  const float* topk_weights, int64_t num_tokens, int64_t top_k, int64_t hidden,
                  float* out, int64_t out_stride);

// bfloat16 twins of the three activation kernels (see gemm.h: widened inputs, float32 arithmetic
// exactly as the float32 kernels, one rounding per output element). Router logits, top-k weights
// and the permutation stay float32 / int32.
void ExpertGemm(const BFloat16* a, int64_t lda, const BFloat16* const* expert_weights,
                int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                int64_t num_experts, BFloat16* c, int64_t ldc, int64_t n, int64_t k);
void SiluAndMul(const BFloat16* x, int64_t x_stride, int64_t num_rows, int64_t inter, BFloat16* out,
                int64_t out_stride);
// The sum over a token's choices is accumulated in float32 in choice order and rounded once.
void MoeUnpermute(const BFloat16* expert_out, int64_t expert_out_stride, const int32_t* pair_row,
                  const float* topk_weights, int64_t num_tokens, int64_t top_k, int64_t hidden,
                  BFloat16* out, int64_t out_stride);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_MOE_H_
