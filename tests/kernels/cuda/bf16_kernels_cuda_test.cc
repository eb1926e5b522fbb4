// The bfloat16 CUDA overloads against their bf16 CPU twins on fresh random inputs.
//
// Tolerances (compared in float32 after widening both sides):
//   - copies (GatherRows) are bit-exact;
//   - the float32 residual of FusedAddRmsNorm is one float add per element on both sides: exact;
//   - elementwise bf16 outputs: |gpu - cpu| <= 2^-7 * max(1, |cpu|). Both sides compute in float32
//     and differ by a few 1e-7 relative (reduction order, fused multiply-adds); rounding such
//     nearly equal floats to bf16 gives the same value or a neighbour, and one bf16 ulp is at most
//     2^-7 of the value. A wrong index or formula is off by O(1);
//   - GEMMs: |gpu - cpu| <= 2^-7 * |cpu| (bf16 output only: the one-ulp rounding step above) +
//     1e-4 * sum_p |a_p * w_p| + 1e-6. bf16 products are exact in float32, so the two sides differ
//     only by float32 accumulation order (tensor-core tiles and split-k on the GPU, reduced in
//     float32 as the bf16 math mode requires; 8 lanes on the CPU): worst case k * 2^-24 of the
//     term sum (1.2e-4 at k = 2048), for random data a random walk near sqrt(k) * 2^-24 (~3e-6).
//     A wrong row, expert or offset is off by O(1) of the term sum.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kGemmAccTol = 1e-4;
const BFloat16 kSentinel = ToBFloat16(-12345.0f);  // fills padding that no kernel may touch

// sum_p |a[i, p] * w[j, p]| at c's layout (zero in padding), for the GEMM tolerance.
std::vector<double> TermScale(const std::vector<BFloat16>& a, int64_t lda, const BFloat16* w,
                              int64_t ldw, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  std::vector<double> scale(std::max<int64_t>(m, 1) * ldc, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += std::abs(double(ToFloat(a[i * lda + p])) * ToFloat(w[j * ldw + p]));
      }
      scale[i * ldc + j] = s;
    }
  }
  return scale;
}

// See the file comment; `bf16_output` adds the one-ulp rounding allowance.
void ExpectGemmClose(const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<double>& scale, bool bf16_output, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(scale.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i];
    const double tol = (bf16_output ? kBf16Tol * std::abs(w) : 0.0) + kGemmAccTol * scale[i] + 1e-6;
    if (!(std::abs(got[i] - w) <= tol || got[i] == want[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first at " << first
                     << ": got " << got[first] << ", want " << want[first] << " (term scale "
                     << scale[first] << ")";
}

using Bf16CopyTest = CudaTest;

struct GatherShape {
  int64_t table_rows, cols, src_stride, dst_stride;
};

TEST_F(Bf16CopyTest, GatherRowsIsBitExact) {
  // 16-byte-aligned rows (the vectorised path: Qwen3-30B-A3B's hidden size) and odd, unaligned
  // ones (the element path).
  for (const auto& [table_rows, cols, src_stride, dst_stride] :
       std::vector<GatherShape>{{50, 2048, 2048, 2056}, {13, 77, 83, 80}, {9, 8, 9, 8}}) {
    std::mt19937 rng(5);
    std::vector<BFloat16> table(table_rows * src_stride);
    for (auto& v : table) v.bits = static_cast<uint16_t>(rng());  // NaNs and infinities included
    std::vector<int32_t> ids = {3, 0, static_cast<int32_t>(table_rows - 1), 3, 7, 1};
    std::vector<BFloat16> want(ids.size() * dst_stride, kSentinel);
    cpu::GatherRows(table.data(), src_stride, ids.data(), ids.size(), cols, want.data(),
                    dst_stride);
    BFloat16* d_dst = Upload(std::vector<BFloat16>(want.size(), kSentinel));
    VAMP_ASSERT_OK(GatherRows(Upload(table), src_stride, Upload(ids), ids.size(), cols, d_dst,
                              dst_stride, stream_));
    const std::vector<BFloat16> got = Download(d_dst, want.size());
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(BFloat16)))
        << "gather of " << cols << " columns";
  }
  // No rows: a no-op.
  BFloat16* d_dst = Upload(std::vector<BFloat16>(4, kSentinel));
  VAMP_ASSERT_OK(GatherRows(d_dst, 4, nullptr, 0, 4, d_dst, 4, stream_));
}

struct NormShape {
  int64_t rows, hidden;
};

using Bf16NormTest = CudaTest;

TEST_F(Bf16NormTest, FusedAddRmsNormMatchesCpu) {
  // Tiny model (64), odd sizes, Qwen3-30B-A3B hidden (2048), past one block's stride, the
  // largest row the register-resident kernel holds (8,192) and one past it, no rows. Odd strides
  // take the scalar kernel, strides of whole 16-byte chunks the vectorised one.
  for (const bool whole_chunks : {false, true}) {
    for (const auto& [rows, hidden] : std::vector<NormShape>{
             {1, 64}, {7, 64}, {5, 37}, {3, 2048}, {2, 4099}, {2, 8192}, {1, 8200}, {0, 16}}) {
      const int64_t x_stride = whole_chunks ? (hidden + 7) / 8 * 8 + 8 : hidden + 1;
      const int64_t r_stride = whole_chunks ? (hidden + 3) / 4 * 4 + 4 : hidden + 7;
      const int64_t alloc_rows = std::max<int64_t>(rows, 1);
      auto x = RandomBf16(alloc_rows * x_stride, 15, 2.0f);
      auto residual = RandomFloats(alloc_rows * r_stride, 16, 4.0f);
      const auto w = RandomFloats(hidden, 17);
      BFloat16* d_x = Upload(x);
      float* d_r = Upload(residual);
      VAMP_ASSERT_OK(
          FusedAddRmsNorm(d_x, x_stride, d_r, r_stride, Upload(w), 1e-6f, rows, hidden, stream_));
      cpu::FusedAddRmsNorm(x.data(), x_stride, residual.data(), r_stride, w.data(), 1e-6f, rows,
                           hidden);
      const std::string what = std::to_string(rows) + "x" + std::to_string(hidden) +
                               (whole_chunks ? " (whole chunks)" : "");
      ExpectClose(Download(d_r, residual.size()), residual, 0.0, "residual " + what);
      ExpectBf16Close(Download(d_x, x.size()), x, "normed " + what);
    }
  }
}

struct RopeShape {
  int64_t tokens, q_heads, kv_heads, head_dim;
};

TEST_F(Bf16NormTest, QkNormRopeMatchesCpu) {
  const int64_t max_pos = 4096;
  // Qwen3-30B-A3B (32/4 heads of 128), a small odd layout, head_dim 64, no tokens.
  for (const auto& [tokens, nq, nkv, dim] :
       std::vector<RopeShape>{{5, 32, 4, 128}, {3, 3, 1, 6}, {2, 4, 2, 64}, {0, 2, 1, 8}}) {
    std::vector<float> cache(max_pos * dim);
    cpu::BuildRopeCache(1000000.0f, dim, max_pos, cache.data());
    const int64_t q_stride = nq * dim + 3, k_stride = nkv * dim + 5;
    const int64_t alloc_tokens = std::max<int64_t>(tokens, 1);
    const auto q0 = RandomBf16(alloc_tokens * q_stride, 21, 3.0f);
    const auto k0 = RandomBf16(alloc_tokens * k_stride, 22, 3.0f);
    const auto q_norm = RandomFloats(dim, 23);
    const auto k_norm = RandomFloats(dim, 24);
    std::vector<int64_t> positions(alloc_tokens);
    for (int64_t t = 0; t < alloc_tokens; ++t) positions[t] = (t * 1013 + 7) % max_pos;
    const float* d_cache = Upload(cache);
    const int64_t* d_pos = Upload(positions);
    for (bool with_norm : {true, false}) {
      auto q = q0, k = k0;
      BFloat16* d_q = Upload(q);
      BFloat16* d_k = Upload(k);
      const float* d_qn = with_norm ? Upload(q_norm) : nullptr;
      const float* d_kn = with_norm ? Upload(k_norm) : nullptr;
      VAMP_ASSERT_OK(QkNormRope(d_q, q_stride, d_k, k_stride, tokens, nq, nkv, dim, d_qn, d_kn,
                                1e-6f, d_pos, d_cache, max_pos, stream_));
      cpu::QkNormRope(q.data(), q_stride, k.data(), k_stride, tokens, nq, nkv, dim,
                      with_norm ? q_norm.data() : nullptr, with_norm ? k_norm.data() : nullptr,
                      1e-6f, positions.data(), cache.data(), max_pos);
      const std::string what = std::to_string(nq) + "/" + std::to_string(nkv) + " heads of " +
                               std::to_string(dim) + (with_norm ? " with norm" : " without norm");
      ExpectBf16Close(Download(d_q, q.size()), q, "q " + what);
      ExpectBf16Close(Download(d_k, k.size()), k, "k " + what);
    }
  }
}

using Bf16MoeTest = CudaTest;

TEST_F(Bf16MoeTest, SiluAndMulMatchesCpu) {
  // Qwen3-30B-A3B's expert intermediate size (768), odd sizes, no rows.
  for (const auto& [rows, inter] : std::vector<NormShape>{{9, 768}, {4, 13}, {1, 1}, {0, 8}}) {
    const int64_t x_stride = 2 * inter + 3, out_stride = inter + 2;
    const int64_t alloc_rows = std::max<int64_t>(rows, 1);
    const auto x = RandomBf16(alloc_rows * x_stride, 31, 3.0f);
    std::vector<BFloat16> want(alloc_rows * out_stride, kSentinel);
    cpu::SiluAndMul(x.data(), x_stride, rows, inter, want.data(), out_stride);
    BFloat16* d_out = Upload(std::vector<BFloat16>(want.size(), kSentinel));
    VAMP_ASSERT_OK(SiluAndMul(Upload(x), x_stride, rows, inter, d_out, out_stride, stream_));
    ExpectBf16Close(Download(d_out, want.size()), want,
                    "SiluAndMul " + std::to_string(rows) + "x" + std::to_string(inter));
  }
}

TEST_F(Bf16MoeTest, MoeUnpermuteMatchesCpu) {
  // Odd strides take the scalar kernel, whole 16-byte chunks the vectorised one (2,056: a last
  // column group of one chunk).
  for (const bool whole_chunks : {false, true}) {
    for (const auto& [tokens, hidden] :
         std::vector<NormShape>{{6, 2048}, {3, 33}, {2, 2056}, {0, 4}}) {
      const int64_t top_k = 8, rows = std::max<int64_t>(tokens * top_k, 1);
      const int64_t y_stride = whole_chunks ? (hidden + 7) / 8 * 8 + 8 : hidden + 1;
      const int64_t out_stride = whole_chunks ? (hidden + 7) / 8 * 8 + 16 : hidden + 6;
      const auto y = RandomBf16(rows * y_stride, 41, 2.0f);
      std::vector<int32_t> pair_row(rows);
      for (int64_t p = 0; p < rows; ++p) pair_row[p] = static_cast<int32_t>((p * 7 + 3) % rows);
      std::vector<float> weights = RandomFloats(rows, 42);
      for (auto& w : weights) w = std::abs(w) / 4.0f;
      std::vector<BFloat16> want(std::max<int64_t>(tokens, 1) * out_stride, kSentinel);
      cpu::MoeUnpermute(y.data(), y_stride, pair_row.data(), weights.data(), tokens, top_k, hidden,
                        want.data(), out_stride);
      BFloat16* d_out = Upload(std::vector<BFloat16>(want.size(), kSentinel));
      VAMP_ASSERT_OK(MoeUnpermute(Upload(y), y_stride, Upload(pair_row), Upload(weights), tokens,
                                  top_k, hidden, d_out, out_stride, stream_));
      ExpectBf16Close(Download(d_out, want.size()), want,
                      "MoeUnpermute " + std::to_string(tokens) + "x" + std::to_string(hidden) +
                          (whole_chunks ? " (whole chunks)" : ""));
    }
  }
}

TEST_F(Bf16MoeTest, MoeUnpermuteKernelsGiveTheSameBits) {
  // The same rows laid out with an odd stride (scalar kernel) and a whole-chunk one (vectorised):
  // both sum in choice order, so every output bit agrees.
  const int64_t tokens = 5, top_k = 8, hidden = 2048, rows = tokens * top_k;
  const auto logical = RandomBf16(rows * hidden, 43, 2.0f);
  std::vector<int32_t> pair_row(rows);
  for (int64_t p = 0; p < rows; ++p) pair_row[p] = static_cast<int32_t>((p * 11 + 5) % rows);
  std::vector<float> weights = RandomFloats(rows, 44);
  for (auto& w : weights) w = std::abs(w) / 4.0f;
  std::vector<std::vector<BFloat16>> outs;
  for (const int64_t stride : {hidden + 1, hidden + 8}) {
    std::vector<BFloat16> y(rows * stride, kSentinel);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(logical.begin() + r * hidden, hidden, y.begin() + r * stride);
    }
    BFloat16* d_out = Upload(std::vector<BFloat16>(tokens * stride, kSentinel));
    VAMP_ASSERT_OK(MoeUnpermute(Upload(y), stride, Upload(pair_row), Upload(weights), tokens, top_k,
                                hidden, d_out, stride, stream_));
    const auto out = Download(d_out, tokens * stride);
    std::vector<BFloat16> packed(tokens * hidden);
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy_n(out.begin() + t * stride, hidden, packed.begin() + t * hidden);
    }
    outs.push_back(std::move(packed));
  }
  for (int64_t i = 0; i < tokens * hidden; ++i) {
    ASSERT_EQ(outs[0][i].bits, outs[1][i].bits) << "element " << i;
  }
}

struct GemmShape {
  int64_t m, n, k;
};

using Bf16GemmTest = CudaTest;

TEST_F(Bf16GemmTest, GemmMatchesCpuForBothOutputTypes) {
  // Odd sizes; a decode-sized router (128 experts over hidden 2048); an attention-sized output
  // projection (4096 -> 2048); no rows.
  for (const auto& [m, n, k] : std::vector<GemmShape>{{1, 1, 1},
                                                      {3, 5, 7},
                                                      {7, 67, 19},
                                                      {16, 130, 64},
                                                      {2, 3, 200},
                                                      {4, 128, 2048},
                                                      {9, 2048, 4096},
                                                      {0, 9, 8}}) {
    const int64_t lda = k + 3, ldw = k + 1, ldc = n + 2;
    const int64_t alloc_m = std::max<int64_t>(m, 1);
    const auto a = RandomBf16(alloc_m * lda, 51);
    const auto w = RandomBf16(n * ldw, 52);
    const auto scale = TermScale(a, lda, w.data(), ldw, m, n, k, ldc);
    const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const BFloat16* d_a = Upload(a);
    const BFloat16* d_w = Upload(w);

    std::vector<BFloat16> want_b(alloc_m * ldc, kSentinel);
    cpu::Gemm(a.data(), lda, w.data(), ldw, want_b.data(), ldc, m, n, k);
    BFloat16* d_cb = Upload(std::vector<BFloat16>(want_b.size(), kSentinel));
    VAMP_ASSERT_OK(Gemm(d_a, lda, d_w, ldw, d_cb, ldc, m, n, k, stream_));
    ExpectGemmClose(Widen(Download(d_cb, want_b.size())), Widen(want_b), scale, true,
                    "bf16 output " + what);

    std::vector<float> want_f(alloc_m * ldc, -12345.0f);
    cpu::Gemm(a.data(), lda, w.data(), ldw, want_f.data(), ldc, m, n, k);
    float* d_cf = Upload(std::vector<float>(want_f.size(), -12345.0f));
    VAMP_ASSERT_OK(Gemm(d_a, lda, d_w, ldw, d_cf, ldc, m, n, k, stream_));
    ExpectGemmClose(Download(d_cf, want_f.size()), want_f, scale, false, "float output " + what);
  }
}

// One expert layer's inputs: weights with a header of `offset` elements, a pointer table (host
// array of device pointers, null for experts without rows) and the permuted activations.
struct ExpertCase {
  int64_t n, k, offset, lda, ldw, ldc;
  std::vector<int32_t> offsets;
  std::vector<std::vector<BFloat16>> weights;  // host copies (empty for idle experts)
  std::vector<const BFloat16*> host_table, device_table;
  std::vector<BFloat16> a;
};

class Bf16ExpertGemmTest : public CudaTest {
 protected:
  // Row counts per expert -> a case with fresh random data (seed) uploaded.
  ExpertCase Make(const std::vector<int32_t>& rows_per_expert, int64_t n, int64_t k,
                  uint32_t seed) {
    ExpertCase c;
    c.n = n;
    c.k = k;
    c.offset = 10;
    c.lda = k + 1;
    c.ldw = k + 2;
    c.ldc = n + 3;
    c.offsets.push_back(0);
    for (int32_t r : rows_per_expert) c.offsets.push_back(c.offsets.back() + r);
    for (size_t e = 0; e < rows_per_expert.size(); ++e) {
      if (rows_per_expert[e] == 0) {
        c.weights.emplace_back();
        c.host_table.push_back(nullptr);
        c.device_table.push_back(nullptr);
        continue;
      }
      c.weights.push_back(RandomBf16(c.offset + n * c.ldw, seed * 1000 + e));
      c.host_table.push_back(c.weights.back().data());
      c.device_table.push_back(Upload(c.weights.back()));
    }
    const int64_t rows = c.offsets.back();
    c.a = RandomBf16(std::max<int64_t>(rows, 1) * c.lda, seed);
    return c;
  }

  // Runs the CPU twin and `gpu` (ExpertGemm or ExpertGemmGrouped) on `c` and compares; returns
  // the GPU call's status so callers can skip on Unimplemented.
  template <typename Fn>
  absl::Status Check(const ExpertCase& c, Fn gpu, const std::string& what) {
    const int64_t num_experts = static_cast<int64_t>(c.host_table.size());
    const int64_t rows = c.offsets.back();
    std::vector<BFloat16> want(std::max<int64_t>(rows, 1) * c.ldc, kSentinel);
    cpu::ExpertGemm(c.a.data(), c.lda, c.host_table.data(), c.offset, c.ldw, c.offsets.data(),
                    num_experts, want.data(), c.ldc, c.n, c.k);
    BFloat16* d_c = Upload(std::vector<BFloat16>(want.size(), kSentinel));
    const absl::Status status = gpu(Upload(c.a), c.lda, c.device_table.data(), c.offset, c.ldw,
                                    c.offsets.data(), num_experts, d_c, c.ldc, c.n, c.k, stream_);
    if (!status.ok()) return status;
    // Term scale per output row, from the expert that owns it.
    std::vector<double> scale(want.size(), 0.0);
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t begin = c.offsets[e], count = c.offsets[e + 1] - begin;
      if (count == 0) continue;
      const std::vector<BFloat16> a_e(c.a.begin() + begin * c.lda,
                                      c.a.begin() + (begin + count) * c.lda);
      const auto s =
          TermScale(a_e, c.lda, c.host_table[e] + c.offset, c.ldw, count, c.n, c.k, c.ldc);
      std::copy(s.begin(), s.begin() + count * c.ldc, scale.begin() + begin * c.ldc);
    }
    ExpectGemmClose(Widen(Download(d_c, want.size())), Widen(want), scale, true, what);
    return absl::OkStatus();
  }
};

// Both GPU variants, as callables with one signature.
const auto kPerExpert = [](auto... args) { return ExpertGemm(args...); };
const auto kGrouped = [](auto... args) { return ExpertGemmGrouped(args...); };

TEST_F(Bf16ExpertGemmTest, PerExpertGemmMatchesCpu) {
  // Idle experts (null weights), single rows, equal and distinct counts; Qwen3-30B-A3B's w13
  // (2 * 768 outputs over 2048) and w2 (2048 over 768) shapes, and an odd one.
  const std::vector<int32_t> counts = {3, 0, 1, 1, 5, 0, 2, 1, 0, 3};
  for (const auto& [n, k] : std::vector<NormShape>{{1536, 2048}, {2048, 768}, {37, 19}}) {
    VAMP_ASSERT_OK(Check(Make(counts, n, k, 61), kPerExpert,
                         "ExpertGemm " + std::to_string(n) + "x" + std::to_string(k)));
  }
  // No rows at all: nothing is computed and nothing written.
  VAMP_ASSERT_OK(Check(Make({0, 0, 0}, 8, 8, 62), kPerExpert, "ExpertGemm without rows"));
}

TEST_F(Bf16ExpertGemmTest, GroupedGemmMatchesCpu) {
  const std::vector<int32_t> counts = {3, 0, 1, 1, 5, 0, 2, 1, 0, 3};
  for (const auto& [n, k] : std::vector<NormShape>{{1536, 2048}, {2048, 768}, {37, 19}}) {
    const absl::Status s =
        Check(Make(counts, n, k, 71), kGrouped,
              "ExpertGemmGrouped " + std::to_string(n) + "x" + std::to_string(k));
    if (absl::IsUnimplemented(s)) GTEST_SKIP() << s;
    VAMP_ASSERT_OK(s);
  }
  VAMP_ASSERT_OK(Check(Make({0, 0, 0}, 8, 8, 72), kGrouped, "ExpertGemmGrouped without rows"));
}

TEST_F(Bf16ExpertGemmTest, GroupedGemmReusesAndGrowsItsPointerSlots) {
  // More calls in a row than the ring has slots (each with different data, so a slot refilled
  // too early would send a GEMM to another call's matrices), then more experts than the first
  // allocation holds (300 experts with rows > 256), then back to a small call.
  for (int call = 0; call < 9; ++call) {
    std::vector<int32_t> counts(16);
    for (int e = 0; e < 16; ++e) counts[e] = (e * 5 + call) % 4;  // 0..3 rows, some idle
    const absl::Status s =
        Check(Make(counts, 40, 24, 80 + call), kGrouped, "grouped call " + std::to_string(call));
    if (absl::IsUnimplemented(s)) GTEST_SKIP() << s;
    VAMP_ASSERT_OK(s);
  }
  std::vector<int32_t> many(300, 1);
  many[17] = 2;
  many[200] = 0;
  VAMP_ASSERT_OK(Check(Make(many, 16, 8, 90), kGrouped, "grouped, 299 experts with rows"));
  VAMP_ASSERT_OK(Check(Make({2, 1}, 16, 8, 91), kGrouped, "grouped, small after growth"));
}

}  // namespace
}  // namespace vamp::kernels::cuda
