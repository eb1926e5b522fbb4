#include "engine/model/batch_attention.h"

#include <algorithm>
#include <cmath>

#include "engine/model/scratch.h"
#include "kernels/cpu/attention.h"

namespace vamp {

void BatchPagedAttention(const float* q, int64_t q_stride, const float* k_cache,
                         const float* v_cache, const KvCacheView& kv, const ForwardBatch& batch,
                         const BatchAttentionShape& shape, float* out, int64_t out_stride,
                         std::vector<float>& workspace) {
  float* ws = GrowScratch(workspace, std::max<int64_t>(1, batch.max_seq_len));
  kernels::cpu::PagedAttention(kernels::cpu::PagedAttentionArgs<float>{
      .q = q,
      .q_stride = q_stride,
      .k_cache = k_cache,
      .v_cache = v_cache,
      .strides = kv.strides,
      .block_size = kv.block_size,
      .block_tables = batch.block_tables.data(),
      .block_table_stride = batch.block_table_stride,
      .seq_lens = batch.seq_lens.data(),
      .query_start_loc = batch.query_start_loc.data(),
      .num_seqs = batch.num_seqs(),
      .num_q_heads = shape.num_q_heads,
      .num_kv_heads = shape.num_kv_heads,
      .head_dim = shape.head_dim,
      .scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim)),
      .out = out,
      .out_stride = out_stride,
      .workspace = ws});
}

}  // namespace vamp
