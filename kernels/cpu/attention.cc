#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/lanes.h"

namespace vamp::kernels::cpu {

namespace {

// WriteKv for either element type: a plain copy of each token's heads into its slot.
template <typename T>
void WriteKvT(const T* k, int64_t k_stride, const T* v, int64_t v_stride,
              const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
              int64_t head_dim, T* k_cache, T* v_cache, KvCacheStrides strides,
              int64_t block_size) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t offset =
        (slot / block_size) * strides.block_stride + (slot % block_size) * strides.token_stride;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t dst = offset + h * strides.head_stride;
      std::memcpy(k_cache + dst, k + t * k_stride + h * head_dim, head_dim * sizeof(T));
      std::memcpy(v_cache + dst, v + t * v_stride + h * head_dim, head_dim * sizeof(T));
    }
  }
}

}  // namespace

void WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
             const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
             int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
             int64_t block_size) {
  WriteKvT(k, k_stride, v, v_stride, slot_mapping, num_tokens, num_kv_heads, head_dim, k_cache,
           v_cache, strides, block_size);
}

// Compiled for AVX2 and for the baseline (same results: see lanes.h).
__attribute__((target_clones("avx2", "default"))) void PagedAttention(
    const PagedAttentionArgs<float>& a) {
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int32_t* table = a.block_tables + s * a.block_table_stride;
    const int64_t row_begin = a.query_start_loc[s];
    const int64_t q_len = a.query_start_loc[s + 1] - row_begin;
    const int64_t first_pos = a.seq_lens[s] - q_len;
    for (int64_t r = 0; r < q_len; ++r) {
      const int64_t num_keys = first_pos + r + 1;  // causal: positions [0, first_pos + r]
      const int64_t row = row_begin + r;
      for (int64_t h = 0; h < a.num_q_heads; ++h) {
        const float* qh = a.q + row * a.q_stride + h * a.head_dim;
        const int64_t kv_head_offset = (h / group) * a.strides.head_stride;
        float* scores = a.workspace;
        // Scores, one block of keys at a time; positions in order.
        float max_score = -INFINITY;
        for (int64_t p0 = 0; p0 < num_keys; p0 += a.block_size) {
          const float* kb =
              a.k_cache + table[p0 / a.block_size] * a.strides.block_stride + kv_head_offset;
          const int64_t n = num_keys - p0 < a.block_size ? num_keys - p0 : a.block_size;
          for (int64_t t = 0; t < n; ++t) {
            const float score =
                internal::InlineDot(qh, kb + t * a.strides.token_stride, a.head_dim) * a.scale;
            scores[p0 + t] = score;
            max_score = score > max_score ? score : max_score;
          }
        }
        float denom = 0.0f;
        for (int64_t p = 0; p < num_keys; ++p) {
          scores[p] = std::exp(scores[p] - max_score);
          denom += scores[p];
        }
        const float inv_denom = 1.0f / denom;
        float* o = a.out + row * a.out_stride + h * a.head_dim;
        for (int64_t d = 0; d < a.head_dim; ++d) o[d] = 0.0f;
        for (int64_t p0 = 0; p0 < num_keys; p0 += a.block_size) {
          const float* vb =
              a.v_cache + table[p0 / a.block_size] * a.strides.block_stride + kv_head_offset;
          const int64_t n = num_keys - p0 < a.block_size ? num_keys - p0 : a.block_size;
          for (int64_t t = 0; t < n; ++t) {
            const float weight = scores[p0 + t] * inv_denom;
            const float* vp = vb + t * a.strides.token_stride;
            for (int64_t d = 0; d < a.head_dim; ++d) o[d] += weight * vp[d];
          }
        }
      }
    }
  }
}

void WriteKv(const BFloat16* k, int64_t k_stride, const BFloat16* v, int64_t v_stride,
             const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
             int64_t head_dim, BFloat16* k_cache, BFloat16* v_cache, KvCacheStrides strides,
             int64_t block_size) {
  WriteKvT(k, k_stride, v, v_stride, slot_mapping, num_tokens, num_kv_heads, head_dim, k_cache,
           v_cache, strides, block_size);
}

int64_t PagedAttentionWorkspaceFloats(int64_t /*max_num_tokens*/, int64_t /*max_num_seqs*/,
                                      int64_t /*num_q_heads*/, int64_t head_dim,
                                      int64_t max_seq_len) {
  return max_seq_len + 3 * head_dim;
}

namespace internal {

// The float32 PagedAttention's loops with every bfloat16 operand converted to float32 just before
// use (the query row once per head, each key row into `key`), so every float32 operation is the
// same, in the same order; only the output is rounded. Arguments are validated by the caller.
// Compiled for AVX2 and for the baseline (same results: see lanes.h).
__attribute__((target_clones("avx2", "default"))) void PagedAttentionBf16(
    const PagedAttentionArgs<BFloat16>& a) {
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  float* scores = a.workspace;
  float* query = scores + a.max_seq_len;
  float* key = query + a.head_dim;
  float* acc = key + a.head_dim;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int32_t* table = a.block_tables + s * a.block_table_stride;
    const int64_t row_begin = a.query_start_loc[s];
    const int64_t q_len = a.query_start_loc[s + 1] - row_begin;
    const int64_t first_pos = a.seq_lens[s] - q_len;
    for (int64_t r = 0; r < q_len; ++r) {
      const int64_t num_keys = first_pos + r + 1;  // causal: positions [0, first_pos + r]
      const int64_t row = row_begin + r;
      for (int64_t h = 0; h < a.num_q_heads; ++h) {
        const BFloat16* qh = a.q + row * a.q_stride + h * a.head_dim;
        for (int64_t d = 0; d < a.head_dim; ++d) query[d] = ToFloat(qh[d]);
        const int64_t kv_head_offset = (h / group) * a.strides.head_stride;
        float max_score = -INFINITY;
        for (int64_t p0 = 0; p0 < num_keys; p0 += a.block_size) {
          const BFloat16* kb =
              a.k_cache + table[p0 / a.block_size] * a.strides.block_stride + kv_head_offset;
          const int64_t n = num_keys - p0 < a.block_size ? num_keys - p0 : a.block_size;
          for (int64_t t = 0; t < n; ++t) {
            const BFloat16* kp = kb + t * a.strides.token_stride;
            for (int64_t d = 0; d < a.head_dim; ++d) key[d] = ToFloat(kp[d]);
            const float score = internal::InlineDot(query, key, a.head_dim) * a.scale;
            scores[p0 + t] = score;
            max_score = score > max_score ? score : max_score;
          }
        }
        float denom = 0.0f;
        for (int64_t p = 0; p < num_keys; ++p) {
          scores[p] = std::exp(scores[p] - max_score);
          denom += scores[p];
        }
        const float inv_denom = 1.0f / denom;
        for (int64_t d = 0; d < a.head_dim; ++d) acc[d] = 0.0f;
        for (int64_t p0 = 0; p0 < num_keys; p0 += a.block_size) {
          const BFloat16* vb =
              a.v_cache + table[p0 / a.block_size] * a.strides.block_stride + kv_head_offset;
          const int64_t n = num_keys - p0 < a.block_size ? num_keys - p0 : a.block_size;
          for (int64_t t = 0; t < n; ++t) {
            const float weight = scores[p0 + t] * inv_denom;
            const BFloat16* vp = vb + t * a.strides.token_stride;
            for (int64_t d = 0; d < a.head_dim; ++d) acc[d] += weight * ToFloat(vp[d]);
          }
        }
        BFloat16* o = a.out + row * a.out_stride + h * a.head_dim;
        for (int64_t d = 0; d < a.head_dim; ++d) o[d] = ToBFloat16(acc[d]);
      }
    }
  }
}

}  // namespace internal

absl::Status PagedAttention(const PagedAttentionArgs<BFloat16>& a) {
  if (a.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: head_dim ", a.head_dim, " < 1"));
  }
  if (a.num_kv_heads < 1 || a.num_q_heads < 1 || a.num_q_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", a.num_q_heads,
                                                   " query heads are not a positive multiple of ",
                                                   a.num_kv_heads, " kv heads"));
  }
  if (a.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: block_size ", a.block_size, " < 1"));
  }
  if (a.num_seqs < 0 || a.max_query_len < 0 || a.max_seq_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: negative num_seqs ", a.num_seqs,
                                                   ", max_query_len ", a.max_query_len,
                                                   " or max_seq_len ", a.max_seq_len));
  }
  const int64_t needed =
      PagedAttentionWorkspaceFloats(0, a.num_seqs, a.num_q_heads, a.head_dim, a.max_seq_len);
  if (a.workspace_floats < needed) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: workspace of ",
                                                   a.workspace_floats, " floats; ", needed,
                                                   " needed for max_seq_len ", a.max_seq_len));
  }
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    if (q_len < 0 || q_len > a.max_query_len || q_len > a.seq_lens[s] ||
        a.seq_lens[s] > a.max_seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedAttention: sequence ", s, " has ", q_len, " query rows and seq_len ",
                       a.seq_lens[s], " (bounds: max_query_len ", a.max_query_len, ", max_seq_len ",
                       a.max_seq_len, "; query rows may not exceed seq_len)"));
    }
  }
  internal::PagedAttentionBf16(a);
  return absl::OkStatus();
}

}  // namespace vamp::kernels::cpu
