// Tests of the CPU reference kernels against straightforward double-precision references, and of
// the property the engine relies on: a row's result never depends on the rest of the batch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace vamp::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "element " << i;
  }
}

TEST(GemmTest, MatchesDoubleReferenceForOddSizes) {
  for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {3, 5, 7}, {7, 67, 19}, {16, 130, 64}, {2, 3, 200}}) {
    const int lda = k + 3, ldw = k + 1, ldc = n + 2;
    auto a = Random(m * lda, 1);
    auto w = Random(n * ldw, 2);
    std::vector<float> c(m * ldc, -7.0f);
    Gemm(a.data(), lda, w.data(), ldw, c.data(), ldc, m, n, k);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double ref = 0;
        for (int p = 0; p < k; ++p) ref += double(a[i * lda + p]) * w[j * ldw + p];
        ASSERT_NEAR(c[i * ldc + j], ref, 1e-4 * std::max(1.0, std::abs(ref))) << m << n << k;
      }
      // Padding between rows is untouched.
      for (int j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], -7.0f);
    }
  }
}

TEST(GemmTest, RowResultIsIndependentOfBatchAndEqualsDot) {
  const int m = 9, n = 37, k = 45;
  auto a = Random(m * k, 3);
  auto w = Random(n * k, 4);
  std::vector<float> full(m * n), single(n);
  Gemm(a.data(), k, w.data(), k, full.data(), n, m, n, k);
  for (int i = 0; i < m; ++i) {
    Gemm(a.data() + i * k, k, w.data(), k, single.data(), n, 1, n, k);
    ASSERT_EQ(0, std::memcmp(single.data(), full.data() + i * n, n * sizeof(float))) << i;
    for (int j = 0; j < n; ++j) ASSERT_EQ(full[i * n + j], Dot(&a[i * k], &w[j * k], k));
  }
}

TEST(NormTest, RmsNormMatchesReference) {
  const int rows = 3, hidden = 37;
  auto x = Random(rows * hidden, 5, 3.0f);
  auto w = Random(hidden, 6);
  std::vector<float> out(rows * hidden);
  RmsNorm(x.data(), hidden, w.data(), 1e-6f, rows, hidden, out.data(), hidden);
  std::vector<double> ref(rows * hidden);
  for (int i = 0; i < rows; ++i) {
    double ms = 0;
    for (int j = 0; j < hidden; ++j) ms += double(x[i * hidden + j]) * x[i * hidden + j];
    ms /= hidden;
    for (int j = 0; j < hidden; ++j)
      ref[i * hidden + j] = w[j] * x[i * hidden + j] / std::sqrt(ms + 1e-6);
  }
  ExpectNear(out, ref, 1e-5);
}

TEST(NormTest, FusedAddRmsNormUpdatesResidualAndNormalises) {
  const int rows = 2, hidden = 16;
  auto x = Random(rows * hidden, 7);
  auto res = Random(rows * hidden, 8);
  auto w = Random(hidden, 9);
  std::vector<float> sum(rows * hidden), want(rows * hidden);
  for (int i = 0; i < rows * hidden; ++i) sum[i] = res[i] + x[i];
  RmsNorm(sum.data(), hidden, w.data(), 1e-5f, rows, hidden, want.data(), hidden);
  FusedAddRmsNorm(x.data(), hidden, res.data(), hidden, w.data(), 1e-5f, rows, hidden);
  EXPECT_EQ(res, sum);
  EXPECT_EQ(x, want);
}

TEST(RopeTest, CacheAndRotationMatchReference) {
  const int dim = 16, max_pos = 50;
  std::vector<float> cache(max_pos * dim);
  BuildRopeCache(10000.0f, dim, max_pos, cache.data());
  for (int pos : {0, 1, 49}) {
    for (int i = 0; i < dim / 2; ++i) {
      const double angle = pos / std::pow(10000.0, 2.0 * i / dim);
      EXPECT_NEAR(cache[pos * dim + i], std::cos(angle), 1e-5);
      EXPECT_NEAR(cache[pos * dim + dim / 2 + i], std::sin(angle), 1e-5);
    }
  }
  // Two tokens, 2 q heads and 1 kv head; no norm weights: pure rotation.
  const int nq = 2, nk = 1, q_stride = nq * dim + 5, k_stride = nk * dim + 3;
  auto q = Random(2 * q_stride, 10);
  auto k = Random(2 * k_stride, 11);
  const auto q0 = q, k0 = k;
  std::vector<int64_t> positions = {0, 7};
  QkNormRope(q.data(), q_stride, k.data(), k_stride, 2, nq, nk, dim, nullptr, nullptr, 1e-6f,
             positions.data(), cache.data(), max_pos);
  for (int d = 0; d < nq * dim; ++d) EXPECT_EQ(q[d], q0[d]) << "position 0 is the identity";
  for (int h = 0; h < nq; ++h) {
    for (int i = 0; i < dim / 2; ++i) {
      const double angle = 7 / std::pow(10000.0, 2.0 * i / dim);
      const double x1 = q0[q_stride + h * dim + i], x2 = q0[q_stride + h * dim + i + dim / 2];
      EXPECT_NEAR(q[q_stride + h * dim + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-5);
      EXPECT_NEAR(q[q_stride + h * dim + i + dim / 2], x2 * std::cos(angle) + x1 * std::sin(angle),
                  1e-5);
    }
  }
  // Bytes outside the heads are untouched.
  for (int d = nq * dim; d < q_stride; ++d) EXPECT_EQ(q[q_stride + d], q0[q_stride + d]);
  for (int d = nk * dim; d < k_stride; ++d) EXPECT_EQ(k[k_stride + d], k0[k_stride + d]);
}

TEST(RopeTest, HeadNormIsAppliedBeforeRotation) {
  const int dim = 8, max_pos = 4;
  std::vector<float> cache(max_pos * dim);
  BuildRopeCache(10000.0f, dim, max_pos, cache.data());
  auto q = Random(dim, 12, 5.0f);
  auto k = Random(dim, 13, 5.0f);
  auto wq = Random(dim, 14);
  auto wk = Random(dim, 15);
  std::vector<float> q_ref(dim), k_ref(dim);
  RmsNorm(q.data(), dim, wq.data(), 1e-6f, 1, dim, q_ref.data(), dim);
  RmsNorm(k.data(), dim, wk.data(), 1e-6f, 1, dim, k_ref.data(), dim);
  int64_t pos = 0;
  QkNormRope(q.data(), dim, k.data(), dim, 1, 1, 1, dim, wq.data(), wk.data(), 1e-6f, &pos,
             cache.data(), max_pos);
  EXPECT_EQ(q, q_ref);
  EXPECT_EQ(k, k_ref);
}

// Dense causal attention in double over explicit per-position K/V, for checking PagedAttention.
struct Seq {
  int context;  // tokens in cache after this step
  int q_len;    // new tokens
};

TEST(AttentionTest, PagedAttentionMatchesDenseReference) {
  const int nq = 4, nkv = 2, dim = 8, block_size = 4, num_blocks = 24, max_blocks = 8;
  const std::vector<Seq> seqs = {{5, 5}, {9, 1}, {13, 4}, {1, 1}};
  // Layout: [block][token][head][dim] with padding in the token stride, K and V separate.
  KvCacheStrides strides{block_size * (nkv * dim + 4), nkv * dim + 4, dim};
  std::vector<float> k_cache(num_blocks * strides.block_stride, NAN);
  std::vector<float> v_cache(num_blocks * strides.block_stride, NAN);
  // Blocks are assigned in a scrambled order to exercise the block table.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  std::vector<int32_t> tables(seqs.size() * max_blocks, -1);
  int next = 0;
  std::vector<std::vector<float>> keys(seqs.size()), values(seqs.size());
  std::vector<int32_t> seq_lens, qsl = {0};
  int total_q = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int nblocks = (seqs[s].context + block_size - 1) / block_size;
    for (int b = 0; b < nblocks; ++b) tables[s * max_blocks + b] = perm[next++];
    keys[s] = Random(seqs[s].context * nkv * dim, 100 + s);
    values[s] = Random(seqs[s].context * nkv * dim, 200 + s);
    std::vector<int64_t> slots(seqs[s].context);
    for (int p = 0; p < seqs[s].context; ++p) {
      slots[p] = int64_t(tables[s * max_blocks + p / block_size]) * block_size + p % block_size;
    }
    WriteKv(keys[s].data(), nkv * dim, values[s].data(), nkv * dim, slots.data(), seqs[s].context,
            nkv, dim, k_cache.data(), v_cache.data(), strides, block_size);
    seq_lens.push_back(seqs[s].context);
    total_q += seqs[s].q_len;
    qsl.push_back(total_q);
  }
  const int q_stride = nq * dim + 2;
  auto q = Random(total_q * q_stride, 300);
  std::vector<float> out(total_q * q_stride, -1.0f), workspace(64);
  const float scale = 1.0f / std::sqrt(float(dim));
  const PagedAttentionArgs<float> all{.q = q.data(),
                                      .q_stride = q_stride,
                                      .k_cache = k_cache.data(),
                                      .v_cache = v_cache.data(),
                                      .strides = strides,
                                      .block_size = block_size,
                                      .block_tables = tables.data(),
                                      .block_table_stride = max_blocks,
                                      .seq_lens = seq_lens.data(),
                                      .query_start_loc = qsl.data(),
                                      .num_seqs = static_cast<int64_t>(seqs.size()),
                                      .num_q_heads = nq,
                                      .num_kv_heads = nkv,
                                      .head_dim = dim,
                                      .scale = scale,
                                      .out = out.data(),
                                      .out_stride = q_stride,
                                      .workspace = workspace.data()};
  PagedAttention(all);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int r = 0; r < seqs[s].q_len; ++r) {
      const int row = qsl[s] + r;
      const int pos = seqs[s].context - seqs[s].q_len + r;
      for (int h = 0; h < nq; ++h) {
        const int kvh = h / (nq / nkv);
        std::vector<double> sc(pos + 1);
        double mx = -1e300, den = 0;
        for (int p = 0; p <= pos; ++p) {
          double d = 0;
          for (int i = 0; i < dim; ++i) {
            d += double(q[row * q_stride + h * dim + i]) * keys[s][(p * nkv + kvh) * dim + i];
          }
          sc[p] = d * scale;
          mx = std::max(mx, sc[p]);
        }
        for (auto& x : sc) den += (x = std::exp(x - mx));
        for (int i = 0; i < dim; ++i) {
          double o = 0;
          for (int p = 0; p <= pos; ++p) o += sc[p] / den * values[s][(p * nkv + kvh) * dim + i];
          ASSERT_NEAR(out[row * q_stride + h * dim + i], o, 1e-5) << s << " " << r << " " << h;
        }
      }
      EXPECT_EQ(out[row * q_stride + nq * dim], -1.0f) << "padding untouched";
    }
  }

  // Splitting sequence 0 (5 new tokens) into two steps gives bit-identical rows.
  std::vector<int32_t> lens_a = {3}, qsl_a = {0, 3}, lens_b = {5}, qsl_b = {0, 2};
  std::vector<float> part(5 * q_stride, 0.0f);
  PagedAttentionArgs<float> step = all;
  step.seq_lens = lens_a.data();
  step.query_start_loc = qsl_a.data();
  step.num_seqs = 1;
  step.out = part.data();
  PagedAttention(step);
  step.q = q.data() + 3 * q_stride;
  step.seq_lens = lens_b.data();
  step.query_start_loc = qsl_b.data();
  step.out = part.data() + 3 * q_stride;
  PagedAttention(step);
  for (int row = 0; row < 5; ++row) {
    EXPECT_EQ(0, std::memcmp(&part[row * q_stride], &out[row * q_stride], nq * dim * 4)) << row;
  }
}

TEST(AttentionTest, WriteKvSkipsNegativeSlots) {
  const int dim = 4;
  KvCacheStrides strides{2 * dim, dim, dim};
  std::vector<float> kc(4 * strides.block_stride, 0.0f), vc = kc;
  std::vector<float> k = {1, 2, 3, 4, 5, 6, 7, 8}, v = {9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<int64_t> slots = {5, -1};
  WriteKv(k.data(), dim, v.data(), dim, slots.data(), 2, 1, dim, kc.data(), vc.data(), strides, 2);
  for (int i = 0; i < dim; ++i) {
    EXPECT_EQ(kc[2 * strides.block_stride + strides.token_stride + i], k[i]);
    EXPECT_EQ(vc[2 * strides.block_stride + strides.token_stride + i], v[i]);
  }
  EXPECT_EQ(std::count(kc.begin(), kc.end(), 0.0f), int(kc.size()) - dim);
}

TEST(MoeTest, RouterTopKSoftmaxSelectsAndRenormalises) {
  // Logits chosen so probabilities are easy: experts 2 and 0 are the top two, then a tie 1/3.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, 0.0f, -1.0f};
  double den = 0;
  for (float l : logits) den += std::exp(double(l));
  int32_t ids[3];
  float w[3];
  RouterTopK(logits.data(), 5, 1, 5, 3, false, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 0);
  EXPECT_EQ(ids[2], 1) << "ties go to the lower expert id";
  EXPECT_NEAR(w[0], std::exp(2.0) / den, 1e-6);
  EXPECT_NEAR(w[2], 1.0 / den, 1e-6);
  RouterTopK(logits.data(), 5, 1, 5, 3, true, ids, w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[0] / w[1], std::exp(1.0), 1e-5);
}

TEST(MoeTest, PermuteIsAStableCountingSort) {
  // 4 tokens, top-2, 5 experts (expert 3 unused).
  const std::vector<int32_t> ids = {1, 4, 0, 1, 4, 2, 1, 0};
  std::vector<int32_t> offsets(6), row_token(8), pair_row(8);
  MoePermute(ids.data(), 4, 2, 5, offsets.data(), row_token.data(), pair_row.data());
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 2, 5, 6, 6, 8}));
  // Expert 0: pairs (1,0), (3,1); expert 1: (0,0), (1,1), (3,0); expert 2: (2,1); expert 4: (0,1),
  // (2,0).
  EXPECT_EQ(row_token, (std::vector<int32_t>{1, 3, 0, 1, 3, 2, 0, 2}));
  for (int p = 0; p < 8; ++p) {
    const int row = pair_row[p];
    EXPECT_EQ(row_token[row], p / 2);
    EXPECT_GE(row, offsets[ids[p]]);
    EXPECT_LT(row, offsets[ids[p] + 1]);
  }
}

TEST(MoeTest, ExpertGemmUsesThePointerTableAndSkipsIdleExperts) {
  const int n = 6, k = 5, experts = 3;
  auto w0 = Random(10 + n * k, 20);  // weights start after a 10-element header
  auto w2 = Random(10 + n * k, 21);
  const float* table[experts] = {w0.data(), nullptr, w2.data()};  // expert 1 has no rows
  const std::vector<int32_t> offsets = {0, 2, 2, 5};
  auto a = Random(5 * k, 22);
  std::vector<float> c(5 * n), want(5 * n);
  ExpertGemm(a.data(), k, table, 10, k, offsets.data(), experts, c.data(), n, n, k);
  Gemm(a.data(), k, w0.data() + 10, k, want.data(), n, 2, n, k);
  Gemm(a.data() + 2 * k, k, w2.data() + 10, k, want.data() + 2 * n, n, 3, n, k);
  EXPECT_EQ(c, want);
}

TEST(MoeTest, SiluAndMulAndUnpermute) {
  const std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f};  // gate (1, -2), up (3, 0.5)
  std::vector<float> out(2);
  SiluAndMul(x.data(), 4, 1, 2, out.data(), 2);
  EXPECT_NEAR(out[0], 1.0 / (1.0 + std::exp(-1.0)) * 3.0, 1e-6);
  EXPECT_NEAR(out[1], -2.0 / (1.0 + std::exp(2.0)) * 0.5, 1e-6);

  const std::vector<float> rows = {1, 2, 10, 20, 100, 200};  // 3 rows of hidden 2
  const std::vector<int32_t> pair_row = {2, 0, 1, 2};        // token 0 -> rows 2,0; 1 -> 1,2
  const std::vector<float> weights = {0.5f, 0.25f, 1.0f, 2.0f};
  std::vector<float> y(4);
  MoeUnpermute(rows.data(), 2, pair_row.data(), weights.data(), 2, 2, 2, y.data(), 2);
  EXPECT_EQ(y, (std::vector<float>{50.25f, 100.5f, 210.0f, 420.0f}));
}

TEST(CopyTest, CopyRoutedExpertsCopiesOnlyRoutedOffloadedExperts) {
  // 4 experts of 2 bytes, [2, 4) offloaded; experts 0 and 3 routed.
  const std::vector<int32_t> offsets = {0, 1, 1, 1, 3};
  const std::vector<uint8_t> src = {20, 21, 30, 31};
  std::vector<uint8_t> dst = {9, 9, 9, 9};
  uint64_t copied = 5;
  CopyRoutedExperts(offsets.data(), 2, 4, src.data(), dst.data(), 2, &copied);
  EXPECT_EQ(dst, (std::vector<uint8_t>{9, 9, 30, 31})) << "expert 2 is not routed: left alone";
  EXPECT_EQ(copied, 7u);
  CopyRoutedExperts(offsets.data(), 2, 4, src.data(), dst.data(), 2, nullptr);  // no counter
}

TEST(CopyTest, GatherAndConversions) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6);
  GatherRows(table.data(), 2, ids.data(), 3, 2, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1, 20, 21}));

  const std::vector<uint16_t> half = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00, 0x8000, 0x0400};
  std::vector<float> f(half.size());
  Fp16ToFloat(half.data(), half.size(), f.data());
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(f[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(f[3], 65504.0f);
  EXPECT_TRUE(std::isinf(f[4]));
  EXPECT_TRUE(std::signbit(f[5]) && f[5] == 0.0f);
  EXPECT_EQ(f[6], std::ldexp(1.0f, -14));
  uint16_t nan_half = 0x7E00;
  float nan_f;
  Fp16ToFloat(&nan_half, 1, &nan_f);
  EXPECT_TRUE(std::isnan(nan_f));

  const std::vector<float> src = {1.0f, -3.5f, 1.00390625f /* rounds to even */, 3.0e38f, NAN};
  std::vector<uint16_t> bf(src.size());
  FloatToBf16(src.data(), src.size(), bf.data());
  std::vector<float> back(src.size());
  Bf16ToFloat(bf.data(), bf.size(), back.data());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -3.5f);
  EXPECT_EQ(back[2], 1.0f);
  EXPECT_NEAR(back[3], 3.0e38f, 3.0e38f / 128);
  EXPECT_TRUE(std::isnan(back[4]));

  // fp16 narrowing: exact values, round to even, subnormals, overflow, and a full round trip of
  // every finite half.
  const std::vector<float> hs = {1.0f,
                                 -2.0f,
                                 1.0f + 1.0f / 2048 /* tie -> even */,
                                 std::ldexp(1.0f, -24),
                                 std::ldexp(3.0f, -26),
                                 65504.0f,
                                 65520.0f,
                                 -1e9f};
  std::vector<uint16_t> hb(hs.size());
  FloatToFp16(hs.data(), hs.size(), hb.data());
  EXPECT_EQ(
      hb, (std::vector<uint16_t>{0x3C00, 0xC000, 0x3C00, 0x0001, 0x0001, 0x7BFF, 0x7C00, 0xFC00}));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;  // inf / NaN
    const uint16_t in = static_cast<uint16_t>(h);
    float x;
    uint16_t out;
    Fp16ToFloat(&in, 1, &x);
    FloatToFp16(&x, 1, &out);
    ASSERT_EQ(out, in) << h;
  }
}

}  // namespace
}  // namespace vamp::kernels::cpu
