// CUDA KV write and paged attention against their CPU twins, on a block-major cache of two layers
// (the layout of shared/DESIGN.md) with shuffled block tables.
//
// Tolerances: the KV write is a copy (exact). Attention output: |gpu - cpu| <= 1e-4 * max(1,
// |cpu|). Scores are dot products of head_dim <= 128 terms (rounding ~1e-6 relative), the softmax
// is evaluated online on the GPU and in two passes on the CPU (exp of the same arguments to within
// that rounding), and the output is a convex combination of V rows of size ~1, so the two differ
// by a few 1e-6. A causal-mask error of one key moves the output by ~1/seq_len of a V row
// (>= 2e-3 for the lengths here), a wrong block or head by O(1): both far above 1e-4.
#include <algorithm>
#include <numeric>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kAttentionTol = 1e-4;
constexpr float kSentinel = -12345.0f;
constexpr int64_t kLayers = 2;
constexpr int64_t kLayer = 1;  // the layer under test: its pointers are offsets inside block 0

struct AttnShape {
  int64_t q_heads, kv_heads, head_dim, block_size;
};

// Tiny model (4/2 heads, head_dim 16), Qwen3-30B-A3B (32/4, 128), and odd sizes (head_dim not a
// multiple of 32, block size 5, GQA group 3).
const std::vector<AttnShape> kShapes = {{4, 2, 16, 16}, {32, 4, 128, 16}, {6, 2, 40, 5}};

struct Layout {
  int64_t per_layer;  // elements of K (or V) of one layer in one block
  KvCacheStrides strides;
  int64_t k_offset, v_offset;  // of the layer under test, inside block 0
};

Layout MakeLayout(const AttnShape& s) {
  Layout l;
  l.per_layer = s.block_size * s.kv_heads * s.head_dim;
  l.strides.block_stride = kLayers * 2 * l.per_layer;
  l.strides.token_stride = s.kv_heads * s.head_dim;
  l.strides.head_stride = s.head_dim;
  l.k_offset = kLayer * 2 * l.per_layer;
  l.v_offset = l.k_offset + l.per_layer;
  return l;
}

// PagedAttention's arguments for `num_seqs` sequences of shape `s` in layout `l` (the layer under
// test's K and V at l's offsets in `cache`) over host or device buffers, scale 1/sqrt(head_dim),
// no workspace.
struct AttnBuffers {
  const float* q;
  const float* cache;
  const int32_t* tables;
  const int32_t* seq_lens;
  const int32_t* qsl;
  float* out;
};
PagedAttentionArgs<float> ArgsOf(const AttnShape& s, const Layout& l, int64_t num_seqs,
                                 int64_t q_stride, int64_t table_stride, int64_t out_stride,
                                 const AttnBuffers& b) {
  return {.q = b.q,
          .q_stride = q_stride,
          .k_cache = b.cache + l.k_offset,
          .v_cache = b.cache + l.v_offset,
          .strides = l.strides,
          .block_size = s.block_size,
          .block_tables = b.tables,
          .block_table_stride = table_stride,
          .seq_lens = b.seq_lens,
          .query_start_loc = b.qsl,
          .num_seqs = num_seqs,
          .num_q_heads = s.q_heads,
          .num_kv_heads = s.kv_heads,
          .head_dim = s.head_dim,
          .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
          .out = b.out,
          .out_stride = out_stride};
}

using KvWriteTest = CudaTest;

TEST_F(KvWriteTest, WriteKvMatchesCpuExactly) {
  for (const AttnShape& s : kShapes) {
    const Layout l = MakeLayout(s);
    const int64_t num_blocks = 7, tokens = 11;
    const int64_t kv_width = s.kv_heads * s.head_dim;
    const int64_t k_stride = kv_width + 3, v_stride = kv_width + 5;
    const auto k = RandomFloats(tokens * k_stride, 111);
    const auto v = RandomFloats(tokens * v_stride, 112);
    // Distinct slots across blocks, some padding tokens (-1).
    std::vector<int64_t> all_slots(num_blocks * s.block_size);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), std::mt19937(113));
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + tokens);
    slots[2] = -1;
    slots[tokens - 1] = -1;
    slots[0] = num_blocks * s.block_size - 1;  // last slot of the last block
    slots[1] = 0;
    std::vector<float> want(num_blocks * l.strides.block_stride, kSentinel);
    cpu::WriteKv(k.data(), k_stride, v.data(), v_stride, slots.data(), tokens, s.kv_heads,
                 s.head_dim, want.data() + l.k_offset, want.data() + l.v_offset, l.strides,
                 s.block_size);
    float* d_cache = Upload(std::vector<float>(want.size(), kSentinel));
    VAMP_ASSERT_OK(WriteKv(Upload(k), k_stride, Upload(v), v_stride, Upload(slots), tokens,
                           s.kv_heads, s.head_dim, d_cache + l.k_offset, d_cache + l.v_offset,
                           l.strides, s.block_size, stream_));
    ExpectClose(Download(d_cache, want.size()), want, 0.0,
                "WriteKv head_dim " + std::to_string(s.head_dim));
  }
}

struct Batch {
  std::vector<int32_t> q_lens, seq_lens;
  const char* name;
};

using PagedAttentionTest = CudaTest;

TEST_F(PagedAttentionTest, MatchesCpuForDecodeAndPrefill) {
  const std::vector<Batch> batches = {
      // Decode: one query row per sequence, lengths around block boundaries.
      {{1, 1, 1, 1, 1}, {1, 17, 50, 33, 16}, "decode"},
      // Prefill chunks attending to cached prefixes, a decode row, and an empty sequence (0 rows).
      {{5, 1, 0, 20, 3}, {5, 40, 7, 52, 200}, "mixed prefill"},
  };
  for (const AttnShape& s : kShapes) {
    const Layout l = MakeLayout(s);
    for (const Batch& b : batches) {
      const int64_t num_seqs = b.q_lens.size();
      std::vector<int32_t> qsl(num_seqs + 1, 0);
      for (int64_t i = 0; i < num_seqs; ++i) qsl[i + 1] = qsl[i] + b.q_lens[i];
      const int64_t rows = qsl[num_seqs];
      const int32_t max_len = *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
      const int64_t max_blocks = (max_len + s.block_size - 1) / s.block_size;
      const int64_t table_stride = max_blocks + 2;
      // Physical blocks: every sequence's blocks, shuffled, plus spares never referenced.
      int64_t total_blocks = 3;
      for (int32_t len : b.seq_lens) total_blocks += (len + s.block_size - 1) / s.block_size;
      std::vector<int32_t> physical(total_blocks);
      std::iota(physical.begin(), physical.end(), 0);
      std::shuffle(physical.begin(), physical.end(), std::mt19937(121));
      std::vector<int32_t> tables(num_seqs * table_stride, -1);
      int64_t next = 0;
      for (int64_t i = 0; i < num_seqs; ++i) {
        for (int64_t j = 0; j < (b.seq_lens[i] + s.block_size - 1) / s.block_size; ++j)
          tables[i * table_stride + j] = physical[next++];
      }
      const auto cache = RandomFloats(total_blocks * l.strides.block_stride, 122);
      const int64_t q_width = s.q_heads * s.head_dim;
      const int64_t q_stride = q_width + 7, out_stride = q_width + 3;
      const auto q = RandomFloats(std::max<int64_t>(rows, 1) * q_stride, 123);
      std::vector<float> want(rows * out_stride, kSentinel), workspace(max_len);
      PagedAttentionArgs<float> host = ArgsOf(
          s, l, num_seqs, q_stride, table_stride, out_stride,
          {q.data(), cache.data(), tables.data(), b.seq_lens.data(), qsl.data(), want.data()});
      host.workspace = workspace.data();
      cpu::PagedAttention(host);
      float* d_out = Upload(std::vector<float>(want.size(), kSentinel));
      VAMP_ASSERT_OK(PagedAttention(ArgsOf(s, l, num_seqs, q_stride, table_stride, out_stride,
                                           {Upload(q), Upload(cache), Upload(tables),
                                            Upload(b.seq_lens), Upload(qsl), d_out}),
                                    stream_));
      ExpectClose(Download(d_out, want.size()), want, kAttentionTol,
                  std::string(b.name) + " heads " + std::to_string(s.q_heads) + "/" +
                      std::to_string(s.kv_heads) + " dim " + std::to_string(s.head_dim));
    }
  }
}

TEST_F(PagedAttentionTest, LongContextDecodeMatchesCpu) {
  // Qwen3-30B-A3B heads, 4 sequences of 2k-5k tokens: many keys per warp.
  const AttnShape s{32, 4, 128, 16};
  const Layout l = MakeLayout(s);
  const std::vector<int32_t> seq_lens = {2048, 4097, 3001, 5000};
  const int64_t num_seqs = seq_lens.size();
  std::vector<int32_t> qsl = {0, 1, 2, 3, 4};
  const int64_t table_stride = (5000 + s.block_size - 1) / s.block_size;
  const int64_t total_blocks = num_seqs * table_stride;
  std::vector<int32_t> tables(total_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(131));
  // Block-major, two layers per block as above; the layer under test is layer 1.
  const auto cache = RandomFloats(total_blocks * l.strides.block_stride, 132);
  const int64_t q_stride = s.q_heads * s.head_dim;
  const auto q = RandomFloats(num_seqs * q_stride, 133, 3.0f);  // peakier softmax
  std::vector<float> want(num_seqs * q_stride), workspace(5000);
  PagedAttentionArgs<float> host =
      ArgsOf(s, l, num_seqs, q_stride, table_stride, q_stride,
             {q.data(), cache.data(), tables.data(), seq_lens.data(), qsl.data(), want.data()});
  host.workspace = workspace.data();
  cpu::PagedAttention(host);
  float* d_out = Alloc<float>(want.size());
  VAMP_ASSERT_OK(PagedAttention(
      ArgsOf(s, l, num_seqs, q_stride, table_stride, q_stride,
             {Upload(q), Upload(cache), Upload(tables), Upload(seq_lens), Upload(qsl), d_out}),
      stream_));
  ExpectClose(Download(d_out, want.size()), want, kAttentionTol, "long-context decode");
}

TEST_F(PagedAttentionTest, RejectsUnsupportedShapes) {
  PagedAttentionArgs<float> args{.strides = {},
                                 .block_size = 16,
                                 .num_seqs = 1,
                                 .num_q_heads = 4,
                                 .num_kv_heads = 2,
                                 .head_dim = 512};
  EXPECT_TRUE(absl::IsInvalidArgument(PagedAttention(args, stream_)));  // head_dim too large
  args.num_q_heads = 5;
  args.head_dim = 64;
  EXPECT_TRUE(absl::IsInvalidArgument(PagedAttention(args, stream_)));  // 5 % 2 != 0
}

}  // namespace
}  // namespace vamp::kernels::cuda
