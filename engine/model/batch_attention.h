// Causal paged attention of one layer over a whole ForwardBatch, on the CPU kernels: the call
// every CPU model with full-attention layers makes once the layer's K and V of this step are in
// the cache (kernels/cpu/attention.h holds the kernel's contract).
#ifndef VAMP_ENGINE_MODEL_BATCH_ATTENTION_H_
#define VAMP_ENGINE_MODEL_BATCH_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "engine/model/causal_lm.h"

namespace vamp {

// Rank-local head counts and the head width (elements) of one attention layer.
struct BatchAttentionShape {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// out[t, h*head_dim + d] for every token row t of `batch`: softmax(q k^T / sqrt(head_dim)) v over
// the sequence's context in `k_cache`/`v_cache` (float32, laid out as `kv` says). q rows are
// `q_stride` floats apart, out rows `out_stride`; `workspace` grows to batch.max_seq_len floats.
void BatchPagedAttention(const float* q, int64_t q_stride, const float* k_cache,
                         const float* v_cache, const KvCacheView& kv, const ForwardBatch& batch,
                         const BatchAttentionShape& shape, float* out, int64_t out_stride,
                         std::vector<float>& workspace);

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_BATCH_ATTENTION_H_
