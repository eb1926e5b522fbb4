// Tests of cpu::GroupedExpertGemm and cpu::GroupedExpertGemmSiluMul (bf16 in and out, float32
// accumulation) against naive double-precision references, plus their argument checks.
//
// Tolerance against the double reference: the kernel rounds a float32 sum to bf16 once, so the
// error is at most half a bf16 ulp (2^-9 relative) plus the float32 summation error (~k * 2^-24 of
// the sum of |terms|, far smaller for these sizes): 1e-2 * max(1, |want|) holds with margin while a
// wrong row, expert or offset is off by O(1).
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/grouped_gemm.h"

namespace vamp::kernels::cpu {
namespace {

constexpr double kTol = 1e-2;
const BFloat16 kSentinel = ToBFloat16(-12345.0f);

std::vector<BFloat16> RandomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = ToBFloat16(dist(rng));
  return v;
}

double NaiveDot(const BFloat16* x, const BFloat16* w, int64_t k) {
  double s = 0.0;
  for (int64_t p = 0; p < k; ++p) s += double{ToFloat(x[p])} * ToFloat(w[p]);
  return s;
}

// A grouped problem: one shard per expert holding `weight_offset` leading elements (another
// matrix, as w13 before w2) and then the [rows_w, k] matrix with row stride ldw.
struct Problem {
  int64_t k, out_cols, lda, ldw, ldc, weight_offset, max_rows;
  std::vector<int32_t> offsets;
  std::vector<BFloat16> a, c;
  std::vector<std::vector<BFloat16>> shards;
  std::vector<const BFloat16*> table;

  Problem(const std::vector<int32_t>& rows, int64_t extra_rows, int64_t out_cols_arg,
          int64_t weight_rows, int64_t k_arg, int64_t pad, int64_t weight_offset_arg, uint32_t seed)
      : k(k_arg),
        out_cols(out_cols_arg),
        lda(k_arg + pad),
        ldw(k_arg + 2 * pad),
        ldc(out_cols_arg + 3 * pad),
        weight_offset(weight_offset_arg) {
    offsets.push_back(0);
    for (int32_t r : rows) offsets.push_back(offsets.back() + r);
    max_rows = offsets.back() + extra_rows;
    a = RandomBf16(max_rows * lda, seed);
    c.assign(max_rows * ldc, kSentinel);
    shards.reserve(rows.size());  // table points into the shards
    for (size_t e = 0; e < rows.size(); ++e) {
      shards.push_back(RandomBf16(weight_offset + weight_rows * ldw, seed + 1 + e,
                                  1.0f / std::sqrt(static_cast<float>(k))));
      table.push_back(shards.back().data());
    }
  }
  int64_t num_experts() const { return static_cast<int64_t>(table.size()); }
  const BFloat16* W(int64_t e) const { return table[e] + weight_offset; }
};

// Every element of c: the naive value on rows owned by an expert, the sentinel elsewhere (rows no
// expert owns, and the padding columns between out_cols and ldc).
template <typename Want>
void ExpectMatches(const Problem& p, Want want, const std::string& what) {
  int64_t bad = 0;
  std::string first;
  for (int64_t e = 0; e < p.num_experts(); ++e) {
    for (int64_t r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
      for (int64_t j = 0; j < p.out_cols; ++j) {
        const double w = want(e, r, j);
        const double g = ToFloat(p.c[r * p.ldc + j]);
        if (!(std::abs(g - w) <= kTol * std::max(1.0, std::abs(w))) && bad++ == 0) {
          first = "expert " + std::to_string(e) + " row " + std::to_string(r) + " col " +
                  std::to_string(j) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": first " << first;
  int64_t touched = 0;
  for (int64_t r = 0; r < p.max_rows; ++r) {
    const bool owned = r < p.offsets.back();
    for (int64_t j = 0; j < p.ldc; ++j) {
      if ((!owned || j >= p.out_cols) && p.c[r * p.ldc + j].bits != kSentinel.bits) ++touched;
    }
  }
  EXPECT_EQ(touched, 0) << what << ": elements outside the experts' rows/columns were written";
}

TEST(GroupedExpertGemmTest, MatchesNaiveReferenceWithEmptyExpertsAndWeightOffset) {
  // Empty experts first, in the middle and last; spare rows beyond the last expert; padded strides;
  // W after a leading block of 100 elements (as w2 after w13 in one shard).
  Problem p({0, 3, 0, 0, 17, 1, 0, 9, 0}, /*extra_rows=*/5, /*n=*/37, /*weight_rows=*/37,
            /*k=*/29, /*pad=*/3, /*weight_offset=*/100, 11);
  p.table[0] = nullptr;  // empty experts are not read
  p.table[8] = nullptr;
  ASSERT_TRUE(GroupedExpertGemm(p.a.data(), p.lda, p.table.data(), p.weight_offset, p.ldw,
                                p.offsets.data(), p.num_experts(), p.max_rows, p.c.data(), p.ldc,
                                p.out_cols, p.k)
                  .ok());
  ExpectMatches(
      p,
      [&](int64_t e, int64_t r, int64_t j) {
        return NaiveDot(p.a.data() + r * p.lda, p.W(e) + j * p.ldw, p.k);
      },
      "plain");
}

TEST(GroupedExpertGemmTest, TinyModelShapes) {
  // The tiny test model: hidden 64, inter 24 -> w13 [48, 64], w2 [64, 24] after it in one shard.
  for (const auto& [n, k, offset] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{48, 64, 0}, {64, 24, 48 * 64}}) {
    Problem p({2, 0, 5, 1}, 0, n, n, k, 0, offset, 21);
    ASSERT_TRUE(GroupedExpertGemm(p.a.data(), p.lda, p.table.data(), p.weight_offset, p.ldw,
                                  p.offsets.data(), p.num_experts(), p.max_rows, p.c.data(), p.ldc,
                                  p.out_cols, p.k)
                    .ok());
    ExpectMatches(
        p,
        [&](int64_t e, int64_t r, int64_t j) {
          return NaiveDot(p.a.data() + r * p.lda, p.W(e) + j * p.ldw, p.k);
        },
        "n " + std::to_string(n) + " k " + std::to_string(k));
  }
}

TEST(GroupedExpertGemmTest, RoundsTheFloatGemmOnce) {
  // Bit-identical to cpu::Gemm on the widened inputs followed by one rounding: nothing is rounded
  // to bf16 along the way.
  Problem p({4, 6}, 0, 70, 70, 200, 1, 0, 31);
  ASSERT_TRUE(GroupedExpertGemm(p.a.data(), p.lda, p.table.data(), p.weight_offset, p.ldw,
                                p.offsets.data(), p.num_experts(), p.max_rows, p.c.data(), p.ldc,
                                p.out_cols, p.k)
                  .ok());
  for (int64_t e = 0; e < p.num_experts(); ++e) {
    const int64_t rows = p.offsets[e + 1] - p.offsets[e];
    std::vector<float> a_f(rows * p.k), w_f(p.out_cols * p.k), c_f(rows * p.out_cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t q = 0; q < p.k; ++q)
        a_f[i * p.k + q] = ToFloat(p.a[(p.offsets[e] + i) * p.lda + q]);
    for (int64_t j = 0; j < p.out_cols; ++j)
      for (int64_t q = 0; q < p.k; ++q) w_f[j * p.k + q] = ToFloat(p.W(e)[j * p.ldw + q]);
    Gemm(a_f.data(), p.k, w_f.data(), p.k, c_f.data(), p.out_cols, rows, p.out_cols, p.k);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < p.out_cols; ++j) {
        ASSERT_EQ(p.c[(p.offsets[e] + i) * p.ldc + j].bits,
                  ToBFloat16(c_f[i * p.out_cols + j]).bits)
            << "expert " << e << " row " << i << " col " << j;
      }
    }
  }
}

TEST(GroupedExpertGemmTest, RowResultDoesNotDependOnTheBatch) {
  // Row 0 of expert 1 computed among 12 rows, then alone: the same bits.
  Problem big({3, 12}, 0, 40, 40, 96, 0, 0, 41);
  ASSERT_TRUE(GroupedExpertGemm(big.a.data(), big.lda, big.table.data(), 0, big.ldw,
                                big.offsets.data(), 2, big.max_rows, big.c.data(), big.ldc, 40, 96)
                  .ok());
  const int32_t one[] = {0, 0, 1};
  std::vector<BFloat16> alone(40);
  ASSERT_TRUE(GroupedExpertGemm(big.a.data() + 3 * big.lda, big.lda, big.table.data(), 0, big.ldw,
                                one, 2, 1, alone.data(), 40, 40, 96)
                  .ok());
  for (int j = 0; j < 40; ++j) EXPECT_EQ(alone[j].bits, big.c[3 * big.ldc + j].bits) << j;
}

TEST(GroupedExpertGemmSiluMulTest, MatchesNaiveReference) {
  for (const auto& [inter, k] :
       std::vector<std::pair<int64_t, int64_t>>{{24, 64}, {13, 29}, {96, 128}}) {
    Problem p({5, 0, 8, 2}, 3, inter, 2 * inter, k, 2, /*weight_offset=*/16, 51);
    ASSERT_TRUE(GroupedExpertGemmSiluMul(p.a.data(), p.lda, p.table.data(), p.weight_offset, p.ldw,
                                         p.offsets.data(), p.num_experts(), p.max_rows, p.c.data(),
                                         p.ldc, inter, k)
                    .ok());
    ExpectMatches(
        p,
        [&](int64_t e, int64_t r, int64_t j) {
          const double g = NaiveDot(p.a.data() + r * p.lda, p.W(e) + j * p.ldw, k);
          const double u = NaiveDot(p.a.data() + r * p.lda, p.W(e) + (inter + j) * p.ldw, k);
          return g / (1.0 + std::exp(-g)) * u;
        },
        "fused inter " + std::to_string(inter));
  }
}

TEST(GroupedExpertGemmSiluMulTest, AgreesWithUnfusedPathToOneRounding) {
  // Fused: silu(g) * u from float32 sums, rounded once. Unfused: g and u rounded to bf16 first.
  const int64_t inter = 40, k = 64;
  Problem p({6, 3}, 0, inter, 2 * inter, k, 0, 0, 61);
  ASSERT_TRUE(GroupedExpertGemmSiluMul(p.a.data(), p.lda, p.table.data(), 0, p.ldw,
                                       p.offsets.data(), 2, p.max_rows, p.c.data(), p.ldc, inter, k)
                  .ok());
  std::vector<BFloat16> h13(p.max_rows * 2 * inter);
  ASSERT_TRUE(GroupedExpertGemm(p.a.data(), p.lda, p.table.data(), 0, p.ldw, p.offsets.data(), 2,
                                p.max_rows, h13.data(), 2 * inter, 2 * inter, k)
                  .ok());
  for (int64_t r = 0; r < p.max_rows; ++r) {
    for (int64_t j = 0; j < inter; ++j) {
      const float g = ToFloat(h13[r * 2 * inter + j]);
      const float u = ToFloat(h13[r * 2 * inter + inter + j]);
      const float unfused = ToFloat(ToBFloat16(g / (1.0f + std::exp(-g)) * u));
      const float fused = ToFloat(p.c[r * p.ldc + j]);
      EXPECT_NEAR(fused, unfused, 2e-2 * std::max(1.0f, std::abs(unfused))) << r << ", " << j;
    }
  }
}

TEST(GroupedExpertGemmTest, RejectsBadArgumentsWithoutWriting) {
  Problem p({2, 3}, 0, 16, 16, 8, 0, 0, 71);
  auto run = [&](const BFloat16* const* table, const int32_t* offsets, int64_t max_rows,
                 int64_t ldc, int64_t n) {
    return GroupedExpertGemm(p.a.data(), p.lda, table, 0, p.ldw, offsets, 2, max_rows, p.c.data(),
                             ldc, n, p.k);
  };
  const BFloat16* null_second[] = {p.table[0], nullptr};
  absl::Status s = run(null_second, p.offsets.data(), p.max_rows, p.ldc, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert 1 has 3 rows but no weights"), absl::string_view::npos) << s;
  const int32_t decreasing[] = {0, 3, 2};
  EXPECT_EQ(run(p.table.data(), decreasing, p.max_rows, p.ldc, 16).code(),
            absl::StatusCode::kInvalidArgument);
  const int32_t negative_start[] = {-1, 1, 2};
  EXPECT_EQ(run(p.table.data(), negative_start, p.max_rows, p.ldc, 16).code(),
            absl::StatusCode::kInvalidArgument);
  s = run(p.table.data(), p.offsets.data(), /*max_rows=*/4, p.ldc, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds max_rows 4"), absl::string_view::npos) << s;
  EXPECT_EQ(run(p.table.data(), p.offsets.data(), p.max_rows, /*ldc=*/15, 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run(p.table.data(), p.offsets.data(), p.max_rows, p.ldc, /*n=*/-1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupedExpertGemmSiluMul(p.a.data(), p.lda, null_second, 0, p.ldw, p.offsets.data(), 2,
                                     p.max_rows, p.c.data(), p.ldc, 8, p.k)
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (const BFloat16& v : p.c) ASSERT_EQ(v.bits, kSentinel.bits) << "written despite an error";
  // Null weights are fine for an expert without rows, and nothing at all is fine too.
  const int32_t first_only[] = {0, 5, 5};
  EXPECT_TRUE(run(null_second, first_only, p.max_rows, p.ldc, 16).ok());
  EXPECT_TRUE(GroupedExpertGemm(nullptr, 8, nullptr, 0, 8, nullptr, 0, 0, nullptr, 16, 16, 8).ok());
}

}  // namespace
}  // namespace vamp::kernels::cpu
