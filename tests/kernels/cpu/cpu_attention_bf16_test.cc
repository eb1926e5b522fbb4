// The bfloat16 CPU attention twin against the float32 reference kernel: on bfloat16-valued inputs
// the bfloat16 kernel must give exactly ToBFloat16 of the float32 kernel's output (it converts and
// then performs the same float32 operations in the same order), never touch padding, and reject
// arguments that break its contract.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cpu {
namespace {

constexpr uint16_t kSentinelBits = 0x7fa5;  // a NaN pattern no kernel output produces

// Normal(0, scale) values rounded to bfloat16: the same numbers as float and as bfloat16.
std::vector<BFloat16> RandomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = ToBFloat16(dist(rng));
  return v;
}

std::vector<float> ToFloats(const std::vector<BFloat16>& v) {
  std::vector<float> f(v.size());
  ToFloat(absl::MakeConstSpan(v), f.data());
  return f;
}

struct Shape {
  int64_t q_heads, kv_heads, head_dim, block_size;
};

struct Batch {
  std::vector<int32_t> q_lens, seq_lens;
  const char* name;
};

// A block-major cache of two layers (the layer under test is layer 1, its pointers offsets inside
// block 0), shuffled block tables with unused entries -1, padded query and output rows.
struct Problem {
  Shape shape;
  KvCacheStrides strides;
  int64_t k_offset = 0, v_offset = 0, table_stride = 0, q_stride = 0, out_stride = 0;
  int64_t rows = 0, max_query_len = 0, max_seq_len = 0;
  std::vector<int32_t> tables, seq_lens, qsl;
  std::vector<BFloat16> cache, q;
};

Problem MakeProblem(const Shape& s, const Batch& b, uint32_t seed) {
  Problem p;
  p.shape = s;
  const int64_t per_layer = s.block_size * s.kv_heads * s.head_dim;
  p.strides = {2 * 2 * per_layer, s.kv_heads * s.head_dim, s.head_dim};
  p.k_offset = 2 * per_layer;
  p.v_offset = 3 * per_layer;
  const int64_t num_seqs = b.q_lens.size();
  p.seq_lens = b.seq_lens;
  p.qsl.assign(num_seqs + 1, 0);
  for (int64_t i = 0; i < num_seqs; ++i) {
    p.qsl[i + 1] = p.qsl[i] + b.q_lens[i];
    p.max_query_len = std::max<int64_t>(p.max_query_len, b.q_lens[i]);
    p.max_seq_len = std::max<int64_t>(p.max_seq_len, b.seq_lens[i]);
  }
  p.rows = p.qsl[num_seqs];
  const int64_t max_blocks = (p.max_seq_len + s.block_size - 1) / s.block_size;
  p.table_stride = max_blocks + 1;
  int64_t total_blocks = 2;
  for (int32_t len : b.seq_lens) total_blocks += (len + s.block_size - 1) / s.block_size;
  std::vector<int32_t> physical(total_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(seed));
  p.tables.assign(num_seqs * p.table_stride, -1);
  int64_t next = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    for (int64_t j = 0; j < (b.seq_lens[i] + s.block_size - 1) / s.block_size; ++j)
      p.tables[i * p.table_stride + j] = physical[next++];
  }
  p.cache = RandomBf16(total_blocks * p.strides.block_stride, seed + 1);
  const int64_t q_width = s.q_heads * s.head_dim;
  p.q_stride = q_width + 5;
  p.out_stride = q_width + 3;
  p.q = RandomBf16(std::max<int64_t>(p.rows, 1) * p.q_stride, seed + 2, 2.0f);
  return p;
}

// PagedAttention's arguments for the whole of `p` (scale 1/sqrt(head_dim)), writing `out` with
// workspace `ws`.
PagedAttentionArgs<BFloat16> ArgsFor(const Problem& p, BFloat16* out, std::vector<float>& ws) {
  const Shape& s = p.shape;
  return {.q = p.q.data(),
          .q_stride = p.q_stride,
          .k_cache = p.cache.data() + p.k_offset,
          .v_cache = p.cache.data() + p.v_offset,
          .strides = p.strides,
          .block_size = s.block_size,
          .block_tables = p.tables.data(),
          .block_table_stride = p.table_stride,
          .seq_lens = p.seq_lens.data(),
          .query_start_loc = p.qsl.data(),
          .num_seqs = static_cast<int64_t>(p.seq_lens.size()),
          .max_query_len = p.max_query_len,
          .max_seq_len = p.max_seq_len,
          .num_q_heads = s.q_heads,
          .num_kv_heads = s.kv_heads,
          .head_dim = s.head_dim,
          .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
          .out = out,
          .out_stride = p.out_stride,
          .workspace = ws.data(),
          .workspace_floats = static_cast<int64_t>(ws.size())};
}

const std::vector<Shape> kShapes = {
    {4, 2, 16, 16}, {32, 4, 128, 16}, {8, 8, 64, 32}, {6, 2, 40, 5}, {3, 1, 7, 3}};

const std::vector<Batch> kBatches = {
    {{1, 1, 1, 1, 1, 1}, {1, 15, 16, 17, 100, 300}, "decode"},
    {{40, 9}, {40, 9}, "prefill"},
    {{7, 16}, {50, 70}, "prefill with cached prefix"},
    {{3, 1, 0, 12, 1}, {3, 33, 9, 44, 17}, "mixed with an empty sequence"},
};

TEST(CpuAttentionBf16Test, EqualsRoundedFloatKernelBitForBit) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    for (const Batch& b : kBatches) {
      const Problem p = MakeProblem(s, b, seed += 10);
      const std::string what = std::string(b.name) + " heads " + std::to_string(s.q_heads) + "/" +
                               std::to_string(s.kv_heads) + " dim " + std::to_string(s.head_dim);
      const int64_t num_seqs = b.q_lens.size();
      // Reference: the float32 kernel on the same values.
      const std::vector<float> cache_f = ToFloats(p.cache), q_f = ToFloats(p.q);
      std::vector<float> want_f(p.rows * p.out_stride, 0.0f), ws_f(p.max_seq_len);
      const int64_t ws_floats =
          PagedAttentionWorkspaceFloats(p.rows, num_seqs, s.q_heads, s.head_dim, p.max_seq_len);
      std::vector<float> ws(ws_floats, NAN);
      std::vector<BFloat16> got(p.rows * p.out_stride, BFloat16{kSentinelBits});
      const PagedAttentionArgs<BFloat16> args = ArgsFor(p, got.data(), ws);
      PagedAttentionArgs<float> ref = WithBuffers(args, q_f.data(), cache_f.data() + p.k_offset,
                                                  cache_f.data() + p.v_offset, want_f.data());
      ref.workspace = ws_f.data();
      PagedAttention(ref);
      const absl::Status st = PagedAttention(args);
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      const int64_t width = s.q_heads * s.head_dim;
      for (int64_t r = 0; r < p.rows; ++r) {
        for (int64_t c = 0; c < p.out_stride; ++c) {
          const uint16_t g = got[r * p.out_stride + c].bits;
          if (c >= width) {
            ASSERT_EQ(g, kSentinelBits) << what << ": padding written at row " << r;
            continue;
          }
          const float w = want_f[r * p.out_stride + c];
          ASSERT_TRUE(std::isfinite(w)) << what;
          ASSERT_EQ(g, ToBFloat16(w).bits) << what << ": row " << r << " col " << c << ": got "
                                           << ToFloat(BFloat16{g}) << ", want " << w;
        }
      }
    }
  }
}

TEST(CpuAttentionBf16Test, OutputRowDependsOnlyOnItsSequence) {
  // A decode row computed alone equals the same row inside a mixed batch.
  const Shape s{8, 2, 32, 16};
  const Batch mixed{{5, 1, 3}, {20, 37, 3}, "mixed"};
  const Problem p = MakeProblem(s, mixed, 77);
  const float scale = 0.125f;
  auto run = [&](int64_t first_seq, int64_t num_seqs) {
    std::vector<int32_t> qsl(num_seqs + 1);
    for (int64_t i = 0; i <= num_seqs; ++i) qsl[i] = p.qsl[first_seq + i] - p.qsl[first_seq];
    const int64_t rows = qsl[num_seqs];
    std::vector<BFloat16> out(rows * p.out_stride);
    std::vector<float> ws(
        PagedAttentionWorkspaceFloats(rows, num_seqs, s.q_heads, s.head_dim, p.max_seq_len));
    PagedAttentionArgs<BFloat16> args = ArgsFor(p, out.data(), ws);
    args.q += p.qsl[first_seq] * p.q_stride;
    args.block_tables += first_seq * p.table_stride;
    args.seq_lens += first_seq;
    args.query_start_loc = qsl.data();
    args.num_seqs = num_seqs;
    args.scale = scale;
    EXPECT_TRUE(PagedAttention(args).ok());
    return out;
  };
  const std::vector<BFloat16> all = run(0, 3);
  const std::vector<BFloat16> alone = run(1, 1);
  ASSERT_EQ(alone.size(), static_cast<size_t>(p.out_stride));
  for (int64_t c = 0; c < s.q_heads * s.head_dim; ++c) {
    ASSERT_EQ(alone[c].bits, all[5 * p.out_stride + c].bits) << c;
  }
}

TEST(CpuAttentionBf16Test, WriteKvCopiesBitsAndSkipsNegativeSlots) {
  const int64_t kv_heads = 2, head_dim = 8, block_size = 4, tokens = 5, num_blocks = 3;
  const KvCacheStrides strides{block_size * kv_heads * head_dim, kv_heads * head_dim, head_dim};
  const int64_t stride = kv_heads * head_dim + 2;
  const std::vector<BFloat16> k = RandomBf16(tokens * stride, 5),
                              v = RandomBf16(tokens * stride, 6);
  const std::vector<int64_t> slots = {11, -1, 0, 5, 6};
  std::vector<BFloat16> kc(num_blocks * strides.block_stride, BFloat16{kSentinelBits});
  std::vector<BFloat16> vc = kc;
  WriteKv(k.data(), stride, v.data(), stride, slots.data(), tokens, kv_heads, head_dim, kc.data(),
          vc.data(), strides, block_size);
  // The float32 kernel on the same values gives the same cache.
  const std::vector<float> kf = ToFloats(k), vf = ToFloats(v);
  std::vector<float> kcf(kc.size(), NAN), vcf(kc.size(), NAN);
  WriteKv(kf.data(), stride, vf.data(), stride, slots.data(), tokens, kv_heads, head_dim,
          kcf.data(), vcf.data(), strides, block_size);
  int64_t written = 0;
  for (size_t i = 0; i < kc.size(); ++i) {
    if (std::isnan(kcf[i])) {
      EXPECT_EQ(kc[i].bits, kSentinelBits) << i;
      EXPECT_EQ(vc[i].bits, kSentinelBits) << i;
    } else {
      ++written;
      EXPECT_EQ(kc[i].bits, ToBFloat16(kcf[i]).bits) << i;
      EXPECT_EQ(vc[i].bits, ToBFloat16(vcf[i]).bits) << i;
    }
  }
  EXPECT_EQ(written, 4 * kv_heads * head_dim);  // four tokens have a slot
  // Token 3 (slot 5 = block 1, position 1), head 1, dim 2.
  EXPECT_EQ(kc[strides.block_stride + strides.token_stride + head_dim + 2].bits,
            k[3 * stride + head_dim + 2].bits);
}

TEST(CpuAttentionBf16Test, WorkspaceSizingIsEnforced) {
  const Shape s{4, 2, 16, 16};
  const Batch b{{1, 3}, {30, 8}, "sizing"};
  const Problem p = MakeProblem(s, b, 9);
  const int64_t needed = PagedAttentionWorkspaceFloats(p.rows, 2, s.q_heads, s.head_dim, 30);
  EXPECT_EQ(needed, 30 + 3 * s.head_dim);
  // Monotone in max_seq_len and head_dim (a runner sizes once for its largest step).
  EXPECT_LT(needed, PagedAttentionWorkspaceFloats(p.rows, 2, s.q_heads, s.head_dim, 31));
  EXPECT_LT(needed, PagedAttentionWorkspaceFloats(p.rows, 2, s.q_heads, s.head_dim + 1, 30));
  std::vector<BFloat16> out(p.rows * p.out_stride, BFloat16{kSentinelBits});
  auto run = [&](int64_t ws_floats) {
    std::vector<float> ws(std::max<int64_t>(ws_floats, 1));
    PagedAttentionArgs<BFloat16> args = ArgsFor(p, out.data(), ws);
    args.num_seqs = 2;
    args.max_query_len = 3;
    args.max_seq_len = 30;
    args.scale = 0.25f;
    args.workspace_floats = ws_floats;
    return PagedAttention(args);
  };
  const absl::Status small = run(needed - 1);
  EXPECT_TRUE(absl::IsInvalidArgument(small)) << small;
  EXPECT_NE(small.message().find("workspace"), absl::string_view::npos) << small;
  for (const BFloat16& x : out) ASSERT_EQ(x.bits, kSentinelBits) << "written despite the error";
  EXPECT_TRUE(run(needed).ok());
  EXPECT_NE(out[0].bits, kSentinelBits);
}

TEST(CpuAttentionBf16Test, RejectsBrokenContracts) {
  const Shape s{4, 2, 16, 16};
  const Batch b{{2, 1}, {10, 5}, "contract"};
  const Problem p = MakeProblem(s, b, 13);
  std::vector<BFloat16> out(p.rows * p.out_stride, BFloat16{kSentinelBits});
  std::vector<float> ws(1000);
  auto run = [&](int64_t max_query_len, int64_t max_seq_len, int64_t q_heads, int64_t kv_heads,
                 int64_t head_dim, const std::vector<int32_t>& seq_lens) {
    PagedAttentionArgs<BFloat16> args = ArgsFor(p, out.data(), ws);
    args.seq_lens = seq_lens.data();
    args.num_seqs = 2;
    args.max_query_len = max_query_len;
    args.max_seq_len = max_seq_len;
    args.num_q_heads = q_heads;
    args.num_kv_heads = kv_heads;
    args.head_dim = head_dim;
    args.scale = 0.25f;
    return PagedAttention(args);
  };
  EXPECT_TRUE(run(2, 10, 4, 2, 16, p.seq_lens).ok());
  for (BFloat16& x : out) x = BFloat16{kSentinelBits};
  EXPECT_TRUE(absl::IsInvalidArgument(run(1, 10, 4, 2, 16, p.seq_lens)));  // q_len 2 > 1
  EXPECT_TRUE(absl::IsInvalidArgument(run(2, 9, 4, 2, 16, p.seq_lens)));   // seq_len 10 > 9
  EXPECT_TRUE(absl::IsInvalidArgument(run(2, 10, 4, 2, 16, {1, 5})));      // q_len 2 > seq_len 1
  EXPECT_TRUE(absl::IsInvalidArgument(run(2, 10, 5, 2, 16, p.seq_lens)));  // 5 % 2 != 0
  EXPECT_TRUE(absl::IsInvalidArgument(run(2, 10, 4, 0, 16, p.seq_lens)));  // no kv heads
  EXPECT_TRUE(absl::IsInvalidArgument(run(2, 10, 4, 2, 0, p.seq_lens)));   // head_dim 0
  for (const BFloat16& x : out) ASSERT_EQ(x.bits, kSentinelBits) << "written despite an error";
}

TEST(CpuAttentionBf16Test, NoSequencesIsANoOp) {
  std::vector<int32_t> qsl = {0};
  std::vector<float> ws(PagedAttentionWorkspaceFloats(0, 0, 4, 16, 0));
  EXPECT_TRUE(PagedAttention(
                  PagedAttentionArgs<BFloat16>{.q = nullptr,
                                               .q_stride = 64,
                                               .k_cache = nullptr,
                                               .v_cache = nullptr,
                                               .strides = {},
                                               .block_size = 16,
                                               .block_tables = nullptr,
                                               .block_table_stride = 0,
                                               .seq_lens = nullptr,
                                               .query_start_loc = qsl.data(),
                                               .num_seqs = 0,
                                               .max_query_len = 0,
                                               .max_seq_len = 0,
                                               .num_q_heads = 4,
                                               .num_kv_heads = 2,
                                               .head_dim = 16,
                                               .scale = 1.0f,
                                               .out = nullptr,
                                               .out_stride = 64,
                                               .workspace = ws.data(),
                                               .workspace_floats = static_cast<int64_t>(ws.size())})
                  .ok());
}

}  // namespace
}  // namespace vamp::kernels::cpu
