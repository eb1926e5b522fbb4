// Rotary position embedding (neox / HF "rotate_half" style) with Qwen3's per-head q/k RMSNorm,
// CPU reference (float32). Conventions: see kernels/cpu/gemm.h.
#ifndef VAMP_KERNELS_CPU_ROPE_H_
#define VAMP_KERNELS_CPU_ROPE_H_

#include <cstdint>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

// Fills cos_sin_cache[pos, :] for pos < max_positions: the first rotary_dim/2 entries hold
// cos(pos * inv_freq[i]), the next rotary_dim/2 hold sin(pos * inv_freq[i]), where
// inv_freq[i] = 1 / theta^(2i / rotary_dim), evaluated in float32 as HF transformers does.
// `cos_sin_cache` is [max_positions, rotary_dim]; rotary_dim must be even.
void BuildRopeCache(float theta, int64_t rotary_dim, int64_t max_positions, float* cos_sin_cache);

// In place, for every token t < num_tokens:
//   each of the num_q_heads heads of q[t] (head h at q + t*q_stride + h*head_dim) and each of the
//   num_kv_heads heads of k[t] is RMS-normalised over head_dim with q_norm_weight / k_norm_weight
//   (skipped when the weight is null: architectures without q/k norm), then rotated by
//   positions[t] using cos_sin_cache (built for rotary_dim == head_dim).
// Every positions[t] must be in [0, max_positions).
void QkNormRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                const float* q_norm_weight, const float* k_norm_weight, float eps,
                const int64_t* positions, const float* cos_sin_cache, int64_t max_positions);

// QkNormRope with a partial rotary embedding (HF partial_rotary_factor, Qwen3-Next: a quarter of
// each head): every head is normalised over all head_dim elements as above, then only its first
// rotary_dim elements are rotated (element i with i + rotary_dim / 2, the rotate_half pairing
// within them); the rest pass through. cos_sin_cache is [max_positions, rotary_dim], built by
// BuildRopeCache for rotary_dim (even, <= head_dim). QkNormRope is this with rotary_dim ==
// head_dim.
void QkNormPartialRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                       int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       int64_t rotary_dim, const float* q_norm_weight, const float* k_norm_weight,
                       float eps, const int64_t* positions, const float* cos_sin_cache,
                       int64_t max_positions);

// bfloat16 q and k (norm weights and the cos/sin cache stay float32): each head is widened, normed
// and rotated in float32 exactly as above, and rounded to bf16 once.
void QkNormRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride, int64_t num_tokens,
                int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                const float* q_norm_weight, const float* k_norm_weight, float eps,
                const int64_t* positions, const float* cos_sin_cache, int64_t max_positions);

// bfloat16 q and k for the partial rotary embedding, as the bf16 QkNormRope relates to the float
// one: each token's heads are widened, normed and partly rotated by the float32 QkNormPartialRope
// and rounded once. The pass-through elements are therefore the rounded normed values (unchanged
// bits when the norm weight is null: widening and rounding back is exact). The bf16 QkNormRope is
// this with rotary_dim == head_dim.
void QkNormPartialRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                       int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                       int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                       const float* k_norm_weight, float eps, const int64_t* positions,
                       const float* cos_sin_cache, int64_t max_positions);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_ROPE_H_
