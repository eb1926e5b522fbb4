// Paged KV cache write and paged causal attention, CUDA twins of kernels/cpu/attention.h (float32,
// device pointers, same arguments plus a stream). KV cache addressing, block tables and causal
// semantics are exactly the CPU twin's.
#ifndef VAMP_KERNELS_CUDA_ATTENTION_H_
#define VAMP_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"

namespace vamp::kernels::cuda {

using KvCacheStrides = cpu::KvCacheStrides;

// Largest head_dim PagedAttention supports (each lane of a warp holds head_dim / 32 elements).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// As cpu::WriteKv (a negative slot skips the token). Bit-exact copy.
absl::Status WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream);

// As cpu::PagedAttention, for decode and prefill alike: sequence i's query row r attends to
// cached positions [0, seq_lens[i] - q_len + r]. Each (query row, head) is one work item of a
// persistent grid; a block's four warps split the keys and each keeps an online (running max)
// softmax, merged at the end, so no score buffer is needed: `workspace` is not read (it is
// accepted so that the runner calls both twins alike, and may be null). The number of query rows
// is read on the device (query_start_loc[num_seqs]), so the launch needs no host copy.
// head_dim <= kMaxAttentionHeadDim; num_q_heads a multiple of num_kv_heads.
// Results agree with the CPU twin to float32 rounding (exp and sums in a different order).
absl::Status PagedAttention(const float* q, int64_t q_stride, const float* k_cache,
                            const float* v_cache, KvCacheStrides strides, int64_t block_size,
                            const int32_t* block_tables, int64_t block_table_stride,
                            const int32_t* seq_lens, const int32_t* query_start_loc,
                            int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                            int64_t head_dim, float scale, float* out, int64_t out_stride,
                            float* workspace, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_ATTENTION_H_
