// Paged KV cache write and paged causal attention, CPU reference (float32). Conventions: see
// kernels/cpu/gemm.h.
//
// KV cache addressing. The cache of one attention layer is described by two base pointers (K and V)
// and three strides in elements, shared by K and V:
//   element (block b, token-in-block s, kv head h, dim d) of K is at
//   k_cache[b * block_stride + s * token_stride + h * head_stride + d]   (likewise V).
// A cache slot is block * block_size + token-in-block. This covers the block-major KV region of
// shared/DESIGN.md (block i holds K and V of every attention layer; the per-layer pointers are
// offsets inside the first block) as well as a plain per-layer tensor.
#ifndef VAMP_KERNELS_CPU_ATTENTION_H_
#define VAMP_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {

struct KvCacheStrides {
  int64_t block_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// Writes K and V of num_tokens tokens into their cache slots: token t's num_kv_heads heads of
// head_dim elements (k + t*k_stride, v + t*v_stride) go to slot slot_mapping[t]; a negative slot
// skips the token (padding).
void WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
             const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
             int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
             int64_t block_size);

// The arguments of PagedAttention (below, and the CUDA twins'), T the element type of the query,
// the caches and the output. Pointers are not owned. max_query_len, max_seq_len and
// workspace_floats are read by the bfloat16 functions only.
template <typename T>
struct PagedAttentionArgs {
  const T* q = nullptr;
  int64_t q_stride = 0;
  const T* k_cache = nullptr;
  const T* v_cache = nullptr;
  KvCacheStrides strides;
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* query_start_loc = nullptr;
  int64_t num_seqs = 0;
  int64_t max_query_len = 0;
  int64_t max_seq_len = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  T* out = nullptr;
  int64_t out_stride = 0;
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

// `a` over other buffers of element type U, every other argument kept: the same problem for a twin
// of another precision (tests compare a bfloat16 kernel with the float32 one on converted copies).
template <typename U, typename T>
PagedAttentionArgs<U> WithBuffers(const PagedAttentionArgs<T>& a, const U* q, const U* k_cache,
                                  const U* v_cache, U* out) {
  return {.q = q,
          .q_stride = a.q_stride,
          .k_cache = k_cache,
          .v_cache = v_cache,
          .strides = a.strides,
          .block_size = a.block_size,
          .block_tables = a.block_tables,
          .block_table_stride = a.block_table_stride,
          .seq_lens = a.seq_lens,
          .query_start_loc = a.query_start_loc,
          .num_seqs = a.num_seqs,
          .max_query_len = a.max_query_len,
          .max_seq_len = a.max_seq_len,
          .num_q_heads = a.num_q_heads,
          .num_kv_heads = a.num_kv_heads,
          .head_dim = a.head_dim,
          .scale = a.scale,
          .out = out,
          .out_stride = a.out_stride,
          .workspace = a.workspace,
          .workspace_floats = a.workspace_floats};
}

// Causal attention for a batch of num_seqs sequences whose new tokens are packed back to back.
// Sequence i owns query rows [query_start_loc[i], query_start_loc[i+1]) and has seq_lens[i] tokens
// of context in the cache, its new tokens included (so their K/V must already be written). Its
// query row r (0-based among its q_len rows) sits at position seq_lens[i] - q_len + r and attends
// to cached positions [0, that position]. Logical block j of sequence i is physical block
// block_tables[i * block_table_stride + j].
// Query row t's head h is at q + t*q_stride + h*head_dim; its output goes to
// out + t*out_stride + h*head_dim. Query heads map to KV heads in groups of
// num_q_heads / num_kv_heads (GQA). Scores are scaled by `scale`; softmax is in float32.
// `workspace` holds at least max(seq_lens) floats. Each output row depends only on its own query
// row and the cache, never on the rest of the batch.
void PagedAttention(const PagedAttentionArgs<float>& a);

// ---- bfloat16 (the engine's storage type; the float32 functions above are the reference) ----

// As the float32 WriteKv: a bit-exact copy of bfloat16 K and V rows into their slots.
void WriteKv(const BFloat16* k, int64_t k_stride, const BFloat16* v, int64_t v_stride,
             const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
             int64_t head_dim, BFloat16* k_cache, BFloat16* v_cache, KvCacheStrides strides,
             int64_t block_size);

// Float32 elements of `workspace` the bfloat16 PagedAttention below needs for a step of at most
// max_num_tokens query rows, max_num_seqs sequences and max_seq_len tokens of context. The CPU twin
// needs max_seq_len scores plus three head_dim rows (query, key and output in float32); the other
// arguments are those of the CUDA twin's function of the same name, so a runner sizes both alike.
int64_t PagedAttentionWorkspaceFloats(int64_t max_num_tokens, int64_t max_num_seqs,
                                      int64_t num_q_heads, int64_t head_dim, int64_t max_seq_len);

// bfloat16 paged attention with the semantics of the float32 PagedAttention above. max_query_len
// and max_seq_len are upper bounds of the batch's query lengths and seq_lens (the CUDA twin sizes
// its launch from them without reading the device); here they are checked. Every element is
// converted to float32 and the float32 kernel's arithmetic is performed in the same order, the
// output rounded to bfloat16 once: the result equals ToBFloat16 of the float32 PagedAttention on
// the same (bfloat16-valued) inputs, bit for bit.
// Errors (InvalidArgument, nothing written): head_dim < 1, num_kv_heads < 1 or not dividing
// num_q_heads, block_size < 1, workspace_floats below PagedAttentionWorkspaceFloats(..,
// max_seq_len), a sequence whose query length exceeds max_query_len or its seq_len, or whose
// seq_len exceeds max_seq_len.
absl::Status PagedAttention(const PagedAttentionArgs<BFloat16>& a);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_ATTENTION_H_
