// Qwen3's per-head q/k RMSNorm fused with rotary position embedding (neox style, full or partial),
// CUDA twin of kernels/cpu/rope.h (device pointers, same arguments plus a stream). The cos/sin
// cache is the one cpu::BuildRopeCache fills, copied to the device once.
#ifndef VAMP_KERNELS_CUDA_ROPE_H_
#define VAMP_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// In place, as cpu::QkNormRope: each head of q[t] and k[t] is RMS-normalised over head_dim with
// q_norm_weight / k_norm_weight (skipped when null), then rotated by positions[t]. head_dim must
// be even (InvalidArgument otherwise, as for negative sizes or num_tokens beyond the grid; no
// launch for zero tokens). A position outside [0, max_positions) cannot be reported from the
// device: that token is left untouched (the CPU twin aborts), so callers validate positions on the
// host.
absl::Status QkNormRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                        int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                        const float* q_norm_weight, const float* k_norm_weight, float eps,
                        const int64_t* positions, const float* cos_sin_cache, int64_t max_positions,
                        cudaStream_t stream);

// bfloat16 q and k (norm weights and cache float32), as the bf16 cpu::QkNormRope: each element is
// widened, normed and rotated in float32 in registers and rounded to bf16 once.
absl::Status QkNormRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                        int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                        int64_t head_dim, const float* q_norm_weight, const float* k_norm_weight,
                        float eps, const int64_t* positions, const float* cos_sin_cache,
                        int64_t max_positions, cudaStream_t stream);

// Partial rotary embedding (Qwen3-Next: head_dim 256, rotary_dim 64), as cpu::QkNormPartialRope:
// every head is RMS-normalised over all head_dim elements (skipped when its weight is null), then
// only its first rotary_dim elements are rotated (element i with i + rotary_dim / 2); the rest are
// stored normalised, or left untouched without a weight. cos_sin_cache is [max_positions,
// rotary_dim] as cpu::BuildRopeCache fills it for rotary_dim. The same kernel as QkNormRope (which
// is rotary_dim == head_dim, and whose results this generalisation leaves unchanged).
// InvalidArgument (nothing launched) unless rotary_dim is even, positive and at most head_dim
// (head_dim itself may be odd, as on the CPU); positions as QkNormRope.
absl::Status QkNormPartialRope(float* q, int64_t q_stride, float* k, int64_t k_stride,
                               int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                               const float* k_norm_weight, float eps, const int64_t* positions,
                               const float* cos_sin_cache, int64_t max_positions,
                               cudaStream_t stream);

// bfloat16 q and k (norm weights and cache float32), as the bf16 cpu::QkNormPartialRope: widened,
// normed and partly rotated in float32 in registers, each written element rounded to bf16 once.
absl::Status QkNormPartialRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                               int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                               const float* k_norm_weight, float eps, const int64_t* positions,
                               const float* cos_sin_cache, int64_t max_positions,
                               cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_ROPE_H_
