#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

constexpr int kWriteKvThreads = 256;
constexpr int kAttentionWarps = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / 32;
// Work items per multiprocessor of the persistent attention grid.
constexpr int kAttentionBlocksPerSm = 16;

// One block per token.
__global__ void WriteKvKernel(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                              const int64_t* slot_mapping, int64_t num_kv_heads, int64_t head_dim,
                              float* k_cache, float* v_cache, KvCacheStrides strides,
                              int64_t block_size) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int64_t offset =
      (slot / block_size) * strides.block_stride + (slot % block_size) * strides.token_stride;
  for (int64_t i = threadIdx.x; i < num_kv_heads * head_dim; i += blockDim.x) {
    const int64_t h = i / head_dim;
    const int64_t d = i % head_dim;
    const int64_t dst = offset + h * strides.head_stride + d;
    k_cache[dst] = k[t * k_stride + i];
    v_cache[dst] = v[t * v_stride + i];
  }
}

__global__ void __launch_bounds__(kAttentionWarps * 32)
    PagedAttentionKernel(const float* q, int64_t q_stride, const float* k_cache,
                         const float* v_cache, KvCacheStrides strides, int64_t block_size,
                         const int32_t* block_tables, int64_t block_table_stride,
                         const int32_t* seq_lens, const int32_t* query_start_loc, int64_t num_seqs,
                         int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                         float* out, int64_t out_stride) {
  __shared__ float warp_max[kAttentionWarps];
  __shared__ float warp_sum[kAttentionWarps];
  __shared__ float warp_acc[kAttentionWarps][kMaxAttentionHeadDim];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t num_items = static_cast<int64_t>(query_start_loc[num_seqs]) * num_q_heads;
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int64_t row = item / num_q_heads;
    const int64_t h = item % num_q_heads;
    // The sequence owning `row`: the last s with query_start_loc[s] <= row (skips empty ones).
    int64_t lo = 0, hi = num_seqs;  // answer in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (query_start_loc[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    const int64_t s = lo;
    const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
    const int64_t num_keys = seq_lens[s] - q_len + (row - query_start_loc[s]) + 1;
    const int32_t* table = block_tables + s * block_table_stride;
    const int64_t kv_head_offset = (h / group) * strides.head_stride;

    float qr[kDimsPerLane];
    float acc[kDimsPerLane];
    const float* qh = q + row * q_stride + h * head_dim;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      qr[i] = d < head_dim ? qh[d] : 0.0f;
      acc[i] = 0.0f;
    }
    float m = -INFINITY;  // running max of this warp's scores
    float l = 0.0f;       // running sum of exp(score - m)
    for (int64_t p = warp; p < num_keys; p += kAttentionWarps) {
      const int64_t token_offset =
          static_cast<int64_t>(table[p / block_size]) * strides.block_stride +
          (p % block_size) * strides.token_stride + kv_head_offset;
      const float* kp = k_cache + token_offset;
      const float* vp = v_cache + token_offset;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < head_dim) dot += qr[i] * kp[d];
      }
      const float score = internal::WarpSum(dot) * scale;
      const float m_new = fmaxf(m, score);
      const float correction = expf(m - m_new);
      const float weight = expf(score - m_new);
      l = l * correction + weight;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < head_dim) acc[i] = acc[i] * correction + weight * vp[d];
      }
      m = m_new;
    }
    if (lane == 0) {
      warp_max[warp] = m;
      warp_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) warp_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float max_all = -INFINITY;
    for (int w = 0; w < kAttentionWarps; ++w) max_all = fmaxf(max_all, warp_max[w]);
    float total = 0.0f;
    float factor[kAttentionWarps];
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w) {
      // A warp that saw no key has max -inf and sum 0: its factor is 0.
      factor[w] = warp_sum[w] > 0.0f ? expf(warp_max[w] - max_all) : 0.0f;
      total += warp_sum[w] * factor[w];
    }
    const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
    float* o = out + row * out_stride + h * head_dim;
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float value = 0.0f;
#pragma unroll
      for (int w = 0; w < kAttentionWarps; ++w) value += warp_acc[w][d] * factor[w];
      o[d] = value * inv_total;
    }
    __syncthreads();  // shared partials are reused by the next work item
  }
}

}  // namespace

absl::Status WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  WriteKvKernel<<<num_tokens, kWriteKvThreads, 0, stream>>>(k, k_stride, v, v_stride, slot_mapping,
                                                            num_kv_heads, head_dim, k_cache,
                                                            v_cache, strides, block_size);
  return internal::LaunchStatus("WriteKvKernel");
}

absl::Status PagedAttention(const float* q, int64_t q_stride, const float* k_cache,
                            const float* v_cache, KvCacheStrides strides, int64_t block_size,
                            const int32_t* block_tables, int64_t block_table_stride,
                            const int32_t* seq_lens, const int32_t* query_start_loc,
                            int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                            int64_t head_dim, float scale, float* out, int64_t out_stride,
                            float* workspace, cudaStream_t stream) {
  if (head_dim < 1 || head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: head_dim ", head_dim,
                                                   " outside [1, ", kMaxAttentionHeadDim, "]"));
  }
  if (num_kv_heads < 1 || num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", num_q_heads,
                                                   " query heads are not a multiple of ",
                                                   num_kv_heads, " kv heads"));
  }
  if (num_seqs == 0) return absl::OkStatus();
  int sms = 0;
  if (absl::Status s = internal::MultiProcessorCount(&sms); !s.ok()) return s;
  PagedAttentionKernel<<<sms * kAttentionBlocksPerSm, kAttentionWarps * 32, 0, stream>>>(
      q, q_stride, k_cache, v_cache, strides, block_size, block_tables, block_table_stride,
      seq_lens, query_start_loc, num_seqs, num_q_heads, num_kv_heads, head_dim, scale, out,
      out_stride);
  return internal::LaunchStatus("PagedAttentionKernel");
}

}  // namespace vamp::kernels::cuda
