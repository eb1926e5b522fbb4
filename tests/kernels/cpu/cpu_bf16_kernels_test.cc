// bfloat16 on the CPU: the conversions of kernels/cpu/bfloat16.h against an exact reference, and
// every bf16 CPU twin against its float32 kernel applied to the widened inputs.
//
// The bf16 twins are defined (kernels/cpu/gemm.h) as "widen exactly, run the float32 arithmetic
// unchanged, round each output once", so every comparison here is EXACT: bf16 outputs equal the
// float32 kernel's outputs rounded to nearest even, and float32 outputs (the residual stream, the
// float-output GEMM) equal the float32 kernel's bit for bit. None of the twins defines its result
// differently from its float32 kernel, so no 1-ulp allowance is needed anywhere.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gating.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace vamp::kernels::cpu {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Round to nearest, ties to even, computed from the two neighbouring bf16 values in double
// (exact: both neighbours and the input have at most 24 significant bits within a factor of 2).
// Not for NaN.
uint16_t ReferenceRound(float f) {
  const uint32_t u = Bits(f);
  const uint32_t lo = u & 0xFFFF0000u;  // toward zero
  if (lo == u) return static_cast<uint16_t>(lo >> 16);
  const uint32_t hi = lo + 0x10000u;  // next magnitude away from zero (past the largest: infinity)
  const double d_lo = std::abs(static_cast<double>(FromBits(lo)));
  const double d_hi = (hi & 0x7FFFFFFFu) == 0x7F800000u
                          ? std::ldexp(1.0, 128)
                          : std::abs(static_cast<double>(FromBits(hi)));
  const double d = std::abs(static_cast<double>(f));
  if (d - d_lo < d_hi - d) return static_cast<uint16_t>(lo >> 16);
  if (d - d_lo > d_hi - d) return static_cast<uint16_t>(hi >> 16);
  return (lo >> 16) % 2 == 0 ? static_cast<uint16_t>(lo >> 16) : static_cast<uint16_t>(hi >> 16);
}

std::vector<BFloat16> RandomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = ToBFloat16(dist(rng));
  return v;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> Widen(const std::vector<BFloat16>& v) {
  std::vector<float> out(v.size());
  ToFloat(absl::MakeConstSpan(v), out.data());
  return out;
}

std::vector<uint16_t> BitsOf(const std::vector<BFloat16>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
  return out;
}

// Expects got == want bit for bit, reporting the first difference.
void ExpectSameBits(const std::vector<BFloat16>& got, const std::vector<BFloat16>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].bits != want[i].bits && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first at " << first
                     << ": got " << ToFloat(got[first]) << ", want " << ToFloat(want[first]);
}

void ExpectSameFloats(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) != Bits(want[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first at " << first
                     << ": got " << got[first] << ", want " << want[first];
}

// `want` with the elements inside rows of `width` (row stride `stride`) replaced by the rounded
// `computed` ones: the expected bf16 buffer after a kernel that writes only those elements.
std::vector<BFloat16> RoundRows(const std::vector<BFloat16>& before,
                                const std::vector<float>& computed, int64_t rows, int64_t width,
                                int64_t stride) {
  std::vector<BFloat16> want = before;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < width; ++j) want[r * stride + j] = ToBFloat16(computed[r * stride + j]);
  }
  return want;
}

// ---- conversions ----------------------------------------------------------------------------

TEST(BFloat16Test, EveryValueRoundTripsExactly) {
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const BFloat16 v{static_cast<uint16_t>(b)};
    const float f = ToFloat(v);
    ASSERT_EQ(Bits(f), b << 16) << "widening is the bits shifted up";
    if (std::isnan(f)) {
      // A NaN stays a NaN, made quiet (signalling NaNs gain the quiet bit; quiet ones round-trip).
      ASSERT_EQ(ToBFloat16(f).bits, b | 0x0040u) << std::hex << b;
    } else {
      ASSERT_EQ(ToBFloat16(f).bits, b) << std::hex << b;
    }
  }
}

TEST(BFloat16Test, TiesRoundToEven) {
  // Around 1.0 the bf16 spacing is 2^-7; 2^-8 is exactly half of it.
  const float half_ulp = std::ldexp(1.0f, -8);
  const float tiny = std::ldexp(1.0f, -20);
  EXPECT_EQ(ToBFloat16(1.0f + half_ulp).bits, 0x3F80) << "tie, 1.0 is even";
  EXPECT_EQ(ToBFloat16(1.0f + half_ulp + tiny).bits, 0x3F81) << "just above the tie";
  EXPECT_EQ(ToBFloat16(1.0f + half_ulp - tiny).bits, 0x3F80) << "just below the tie";
  EXPECT_EQ(ToBFloat16(1.0f + 3 * half_ulp).bits, 0x3F82) << "tie between 0x3F81 and 0x3F82";
  EXPECT_EQ(ToBFloat16(-(1.0f + half_ulp)).bits, 0xBF80);
  EXPECT_EQ(ToBFloat16(-(1.0f + 3 * half_ulp)).bits, 0xBF82);
  // Subnormals: the smallest bf16 subnormal is 2^-133; half of it ties to zero (even).
  EXPECT_EQ(ToBFloat16(FromBits(0x00008000u)).bits, 0x0000);
  EXPECT_EQ(ToBFloat16(FromBits(0x00008001u)).bits, 0x0001);
  EXPECT_EQ(ToBFloat16(FromBits(0x00018000u)).bits, 0x0002);
  // Rounding up may carry into the exponent: 0x3FFF8000 ties between 0x3FFF and 0x4000 (even).
  EXPECT_EQ(ToBFloat16(FromBits(0x3FFF8000u)).bits, 0x4000);
}

TEST(BFloat16Test, InfinityNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ToBFloat16(inf).bits, 0x7F80);
  EXPECT_EQ(ToBFloat16(-inf).bits, 0xFF80);
  EXPECT_EQ(ToBFloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(ToBFloat16(-0.0f).bits, 0x8000);
  // Largest finite bf16 is 0x7F7F (about 3.39e38); float values from its upper half-way point on
  // round to infinity (the tie goes to the even neighbour, which is infinity).
  EXPECT_EQ(ToBFloat16(FromBits(0x7F7F7FFFu)).bits, 0x7F7F);
  EXPECT_EQ(ToBFloat16(FromBits(0x7F7F8000u)).bits, 0x7F80);
  EXPECT_EQ(ToBFloat16(std::numeric_limits<float>::max()).bits, 0x7F80);
  EXPECT_EQ(ToBFloat16(-std::numeric_limits<float>::max()).bits, 0xFF80);
  // NaNs: quiet and signalling, both signs, payload only in the low bits that are dropped.
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu}) {
    const BFloat16 b = ToBFloat16(FromBits(nan));
    EXPECT_TRUE(std::isnan(ToFloat(b))) << std::hex << nan << " -> " << b.bits;
    EXPECT_NE(b.bits & 0x0040u, 0u) << "quiet";
    EXPECT_EQ(b.bits & 0x8000u, (nan >> 16) & 0x8000u) << "sign kept";
  }
}

TEST(BFloat16Test, MatchesExactRoundingAroundEveryValue) {
  // Every bf16 upper half with the lower halves that decide rounding: exact, just below and just
  // above the tie, and the extremes.
  for (uint32_t upper = 0; upper <= 0xFFFFu; ++upper) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float f = FromBits((upper << 16) | lower);
      if (std::isnan(f)) continue;
      ASSERT_EQ(ToBFloat16(f).bits, ReferenceRound(f)) << std::hex << Bits(f);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(ToBFloat16(f).bits, ReferenceRound(f)) << std::hex << Bits(f);
  }
}

TEST(BFloat16Test, AgreesWithCopyConversions) {
  // copy.h's uint16_t conversions (checkpoint loading) and bfloat16.h must be one definition.
  std::vector<uint16_t> all(0x10000);
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> widened(all.size());
  Bf16ToFloat(all.data(), all.size(), widened.data());
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) {
    ASSERT_EQ(Bits(widened[b]), Bits(ToFloat(BFloat16{all[b]})));
  }
  std::mt19937 rng(8);
  std::vector<float> floats(100000);
  for (auto& f : floats) f = FromBits(rng());
  std::vector<uint16_t> narrowed(floats.size());
  FloatToBf16(floats.data(), floats.size(), narrowed.data());
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(narrowed[i], ToBFloat16(floats[i]).bits) << std::hex << Bits(floats[i]);
  }
}

// ---- kernels ----------------------------------------------------------------------------------

TEST(Bf16KernelsTest, GatherRowsIsBitExact) {
  // Arbitrary bit patterns, NaNs and infinities included, must come through unchanged.
  const int64_t table_rows = 11, cols = 13, src_stride = 16, dst_stride = 15;
  std::mt19937 rng(20);
  std::vector<BFloat16> table(table_rows * src_stride);
  for (auto& v : table) v.bits = static_cast<uint16_t>(rng());
  table[3 * src_stride + 1].bits = 0x7F81;  // signalling NaN
  table[3 * src_stride + 2].bits = 0xFF80;  // -inf
  const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  const BFloat16 sentinel{0x1234};
  std::vector<BFloat16> dst(ids.size() * dst_stride, sentinel);
  GatherRows(table.data(), src_stride, ids.data(), ids.size(), cols, dst.data(), dst_stride);
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t j = 0; j < dst_stride; ++j) {
      const uint16_t want = j < cols ? table[ids[r] * src_stride + j].bits : sentinel.bits;
      ASSERT_EQ(dst[r * dst_stride + j].bits, want) << r << "," << j;
    }
  }
  // No rows: nothing is written.
  std::vector<BFloat16> untouched(4, sentinel);
  GatherRows(table.data(), src_stride, ids.data(), 0, cols, untouched.data(), dst_stride);
  EXPECT_EQ(BitsOf(untouched), BitsOf(std::vector<BFloat16>(4, sentinel)));
}

struct NormShape {
  int64_t rows, hidden;
};

TEST(Bf16KernelsTest, FusedAddRmsNormEqualsFloatKernelRounded) {
  // Qwen3-30B-A3B's hidden size, odd sizes, one element, no rows.
  for (const auto& [rows, hidden] : std::vector<NormShape>{{3, 2048}, {5, 77}, {1, 1}, {0, 16}}) {
    const int64_t x_stride = hidden + 5, r_stride = hidden + 3;
    const auto x = RandomBf16(std::max<int64_t>(rows, 1) * x_stride, 30, 2.0f);
    const auto residual0 = RandomFloats(std::max<int64_t>(rows, 1) * r_stride, 31, 4.0f);
    const auto weight = RandomFloats(hidden, 32);
    // Float kernel on the widened x.
    std::vector<float> x_f = Widen(x), residual_f = residual0;
    FusedAddRmsNorm(x_f.data(), x_stride, residual_f.data(), r_stride, weight.data(), 1e-6f, rows,
                    hidden);
    // bf16 twin.
    std::vector<BFloat16> x_b = x;
    std::vector<float> residual_b = residual0;
    FusedAddRmsNorm(x_b.data(), x_stride, residual_b.data(), r_stride, weight.data(), 1e-6f, rows,
                    hidden);
    const std::string what = std::to_string(rows) + "x" + std::to_string(hidden);
    ExpectSameFloats(residual_b, residual_f, "residual " + what);
    ExpectSameBits(x_b, RoundRows(x, x_f, rows, hidden, x_stride), "x " + what);
  }
}

struct RopeShape {
  int64_t tokens, q_heads, kv_heads, head_dim;
};

TEST(Bf16KernelsTest, QkNormRopeEqualsFloatKernelRounded) {
  const int64_t max_pos = 300;
  // Qwen3-30B-A3B (32 q heads, 4 kv heads, head_dim 128), a small odd layout, no tokens.
  for (const auto& [tokens, nq, nkv, dim] :
       std::vector<RopeShape>{{4, 32, 4, 128}, {3, 3, 1, 6}, {0, 2, 1, 8}}) {
    std::vector<float> cache(max_pos * dim);
    BuildRopeCache(1000000.0f, dim, max_pos, cache.data());
    const int64_t q_stride = nq * dim + 3, k_stride = nkv * dim + 5;
    const int64_t alloc_tokens = std::max<int64_t>(tokens, 1);
    const auto q = RandomBf16(alloc_tokens * q_stride, 40, 3.0f);
    const auto k = RandomBf16(alloc_tokens * k_stride, 41, 3.0f);
    const auto q_norm = RandomFloats(dim, 42);
    const auto k_norm = RandomFloats(dim, 43);
    std::vector<int64_t> positions(alloc_tokens);
    for (int64_t t = 0; t < alloc_tokens; ++t) positions[t] = (t * 97 + 5) % max_pos;
    for (bool with_norm : {true, false}) {
      const float* qw = with_norm ? q_norm.data() : nullptr;
      const float* kw = with_norm ? k_norm.data() : nullptr;
      std::vector<float> q_f = Widen(q), k_f = Widen(k);
      QkNormRope(q_f.data(), q_stride, k_f.data(), k_stride, tokens, nq, nkv, dim, qw, kw, 1e-6f,
                 positions.data(), cache.data(), max_pos);
      std::vector<BFloat16> q_b = q, k_b = k;
      QkNormRope(q_b.data(), q_stride, k_b.data(), k_stride, tokens, nq, nkv, dim, qw, kw, 1e-6f,
                 positions.data(), cache.data(), max_pos);
      const std::string what = std::to_string(nq) + "/" + std::to_string(nkv) + " heads of " +
                               std::to_string(dim) + (with_norm ? " with norm" : " without norm");
      ExpectSameBits(q_b, RoundRows(q, q_f, tokens, nq * dim, q_stride), "q " + what);
      ExpectSameBits(k_b, RoundRows(k, k_f, tokens, nkv * dim, k_stride), "k " + what);
    }
  }
}

TEST(Bf16KernelsTest, SiluAndMulEqualsFloatKernelRounded) {
  // Qwen3-30B-A3B's expert intermediate size, an odd one, no rows.
  for (const auto& [rows, inter] : std::vector<NormShape>{{6, 768}, {3, 13}, {0, 8}}) {
    const int64_t x_stride = 2 * inter + 3, out_stride = inter + 2;
    const int64_t alloc_rows = std::max<int64_t>(rows, 1);
    const auto x = RandomBf16(alloc_rows * x_stride, 50, 3.0f);
    const std::vector<BFloat16> out0(alloc_rows * out_stride, BFloat16{0x4242});
    std::vector<float> out_f(out0.size(), 0.0f);
    const auto x_f = Widen(x);
    SiluAndMul(x_f.data(), x_stride, rows, inter, out_f.data(), out_stride);
    std::vector<BFloat16> out_b = out0;
    SiluAndMul(x.data(), x_stride, rows, inter, out_b.data(), out_stride);
    ExpectSameBits(out_b, RoundRows(out0, out_f, rows, inter, out_stride),
                   "SiluAndMul " + std::to_string(rows) + "x" + std::to_string(inter));
  }
}

TEST(Bf16KernelsTest, MoeUnpermuteEqualsFloatKernelRounded) {
  for (const auto& [tokens, hidden] : std::vector<NormShape>{{5, 2048}, {3, 33}, {0, 4}}) {
    const int64_t top_k = 8, rows = std::max<int64_t>(tokens * top_k, 1);
    const int64_t y_stride = hidden + 1, out_stride = hidden + 6;
    const auto y = RandomBf16(rows * y_stride, 60, 2.0f);
    // A permutation of the rows (as MoePermute produces) and softmax-like weights.
    std::vector<int32_t> pair_row(rows);
    for (int64_t p = 0; p < rows; ++p) pair_row[p] = static_cast<int32_t>((p * 7 + 3) % rows);
    std::vector<float> weights = RandomFloats(rows, 61);
    for (auto& w : weights) w = std::abs(w) / 4.0f;
    const std::vector<BFloat16> out0(std::max<int64_t>(tokens, 1) * out_stride, BFloat16{0x4242});
    std::vector<float> out_f(out0.size(), 0.0f);
    const auto y_f = Widen(y);
    MoeUnpermute(y_f.data(), y_stride, pair_row.data(), weights.data(), tokens, top_k, hidden,
                 out_f.data(), out_stride);
    std::vector<BFloat16> out_b = out0;
    MoeUnpermute(y.data(), y_stride, pair_row.data(), weights.data(), tokens, top_k, hidden,
                 out_b.data(), out_stride);
    ExpectSameBits(out_b, RoundRows(out0, out_f, tokens, hidden, out_stride),
                   "MoeUnpermute " + std::to_string(tokens) + "x" + std::to_string(hidden));
  }
}

// ---- Qwen3-Next's elementwise kernels -------------------------------------------------------

struct PartialRopeShape {
  int64_t tokens, q_heads, kv_heads, head_dim, rotary_dim;
};

TEST(Bf16KernelsTest, QkNormPartialRopeEqualsFloatKernelRounded) {
  const int64_t max_pos = 300;
  // Qwen3-Next (16 q heads, 2 kv heads, head_dim 256, rotary 64), a small odd layout, full
  // rotation (== QkNormRope), no tokens.
  for (const auto& [tokens, nq, nkv, dim, rot] : std::vector<PartialRopeShape>{
           {4, 16, 2, 256, 64}, {3, 3, 1, 10, 4}, {2, 2, 1, 8, 8}, {0, 2, 1, 8, 4}}) {
    std::vector<float> cache(max_pos * rot);
    BuildRopeCache(10000000.0f, rot, max_pos, cache.data());
    const int64_t q_stride = nq * dim + 3, k_stride = nkv * dim + 5;
    const int64_t alloc_tokens = std::max<int64_t>(tokens, 1);
    const auto q = RandomBf16(alloc_tokens * q_stride, 44, 3.0f);
    const auto k = RandomBf16(alloc_tokens * k_stride, 45, 3.0f);
    const auto q_norm = RandomFloats(dim, 46);
    const auto k_norm = RandomFloats(dim, 47);
    std::vector<int64_t> positions(alloc_tokens);
    for (int64_t t = 0; t < alloc_tokens; ++t) positions[t] = (t * 89 + 7) % max_pos;
    for (bool with_norm : {true, false}) {
      const float* qw = with_norm ? q_norm.data() : nullptr;
      const float* kw = with_norm ? k_norm.data() : nullptr;
      std::vector<float> q_f = Widen(q), k_f = Widen(k);
      QkNormPartialRope(q_f.data(), q_stride, k_f.data(), k_stride, tokens, nq, nkv, dim, rot, qw,
                        kw, 1e-6f, positions.data(), cache.data(), max_pos);
      std::vector<BFloat16> q_b = q, k_b = k;
      QkNormPartialRope(q_b.data(), q_stride, k_b.data(), k_stride, tokens, nq, nkv, dim, rot, qw,
                        kw, 1e-6f, positions.data(), cache.data(), max_pos);
      const std::string what = std::to_string(nq) + "/" + std::to_string(nkv) + " heads of " +
                               std::to_string(dim) + " rotary " + std::to_string(rot) +
                               (with_norm ? " with norm" : " without norm");
      ExpectSameBits(q_b, RoundRows(q, q_f, tokens, nq * dim, q_stride), "q " + what);
      ExpectSameBits(k_b, RoundRows(k, k_f, tokens, nkv * dim, k_stride), "k " + what);
      if (rot == dim) {  // the bf16 QkNormRope is the full rotation
        std::vector<BFloat16> q_full = q, k_full = k;
        QkNormRope(q_full.data(), q_stride, k_full.data(), k_stride, tokens, nq, nkv, dim, qw, kw,
                   1e-6f, positions.data(), cache.data(), max_pos);
        ExpectSameBits(q_full, q_b, "QkNormRope q " + what);
        ExpectSameBits(k_full, k_b, "QkNormRope k " + what);
      }
    }
  }
}

struct GroupShape {
  int64_t rows, groups, dim;
};

TEST(Bf16KernelsTest, RmsNormGatedEqualsFloatKernelRounded) {
  // Qwen3-Next (32 value heads of 128), an odd layout, no rows.
  for (const auto& [rows, groups, dim] :
       std::vector<GroupShape>{{3, 32, 128}, {5, 3, 7}, {0, 2, 4}}) {
    const int64_t width = groups * dim, alloc_rows = std::max<int64_t>(rows, 1);
    const int64_t x_stride = width + 3, z_stride = 2 * width + 1, out_stride = width + 2;
    const auto x = RandomFloats(alloc_rows * x_stride, 62, 2.0f);
    const auto z = RandomFloats(alloc_rows * z_stride, 63, 3.0f);
    const auto w = RandomFloats(dim, 64);
    std::vector<float> out_f(alloc_rows * out_stride, 0.0f);
    RmsNormGated(x.data(), x_stride, z.data() + 1, z_stride, w.data(), 1e-6f, rows, groups, dim,
                 out_f.data(), out_stride);
    const std::vector<BFloat16> out0(out_f.size(), BFloat16{0x4242});
    std::vector<BFloat16> out_b = out0;
    RmsNormGated(x.data(), x_stride, z.data() + 1, z_stride, w.data(), 1e-6f, rows, groups, dim,
                 out_b.data(), out_stride);
    ExpectSameBits(out_b, RoundRows(out0, out_f, rows, width, out_stride),
                   "RmsNormGated " + std::to_string(rows) + "x" + std::to_string(groups) + "x" +
                       std::to_string(dim));
  }
}

TEST(Bf16KernelsTest, SigmoidGateEqualsFloatKernelRounded) {
  // Qwen3-Next's attention output (16 heads x 256), an odd width, no rows.
  for (const auto& [rows, cols] : std::vector<NormShape>{{4, 4096}, {3, 13}, {0, 8}}) {
    const int64_t alloc_rows = std::max<int64_t>(rows, 1);
    const int64_t x_stride = cols + 3, gate_stride = 2 * cols + 1;
    const auto x = RandomBf16(alloc_rows * x_stride, 65, 2.0f);
    const auto gate = RandomBf16(alloc_rows * gate_stride, 66, 4.0f);
    std::vector<float> x_f = Widen(x);
    const std::vector<float> gate_f = Widen(gate);
    SigmoidGate(x_f.data(), x_stride, gate_f.data() + cols, gate_stride, rows, cols);
    std::vector<BFloat16> x_b = x;
    SigmoidGate(x_b.data(), x_stride, gate.data() + cols, gate_stride, rows, cols);
    ExpectSameBits(x_b, RoundRows(x, x_f, rows, cols, x_stride),
                   "SigmoidGate " + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

TEST(Bf16KernelsTest, AddSigmoidScaledEqualsFloatKernelRounded) {
  // Qwen3-Next's hidden size (2048), an odd width, no rows; one gate logit per row, strided.
  for (const auto& [rows, cols] : std::vector<NormShape>{{5, 2048}, {3, 13}, {0, 8}}) {
    const int64_t alloc_rows = std::max<int64_t>(rows, 1);
    const int64_t out_stride = cols + 2, y_stride = cols + 5, gate_stride = 3;
    const auto out0 = RandomBf16(alloc_rows * out_stride, 67, 2.0f);
    const auto y = RandomBf16(alloc_rows * y_stride, 68, 2.0f);
    const auto gate = RandomFloats(alloc_rows * gate_stride, 69, 3.0f);
    std::vector<float> out_f = Widen(out0);
    const std::vector<float> y_f = Widen(y);
    AddSigmoidScaled(out_f.data(), out_stride, y_f.data(), y_stride, gate.data(), gate_stride, rows,
                     cols);
    std::vector<BFloat16> out_b = out0;
    AddSigmoidScaled(out_b.data(), out_stride, y.data(), y_stride, gate.data(), gate_stride, rows,
                     cols);
    ExpectSameBits(out_b, RoundRows(out0, out_f, rows, cols, out_stride),
                   "AddSigmoidScaled " + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

struct GemmShape {
  int64_t m, n, k;
};

TEST(Bf16KernelsTest, GemmEqualsFloatGemmOnWidenedInputs) {
  // Odd sizes, n past the 64-row weight block (130, 200), one row, no rows, an empty reduction.
  for (const auto& [m, n, k] : std::vector<GemmShape>{
           {1, 1, 1}, {3, 5, 7}, {7, 130, 19}, {16, 200, 64}, {2, 3, 300}, {0, 9, 8}, {4, 6, 0}}) {
    const int64_t lda = k + 3, ldw = k + 1, ldc = n + 2;
    const int64_t alloc_m = std::max<int64_t>(m, 1);
    const auto a = RandomBf16(alloc_m * lda, 70);
    const auto w = RandomBf16(n * ldw, 71);
    const auto a_f = Widen(a), w_f = Widen(w);
    std::vector<float> want(alloc_m * ldc, -7.0f);
    Gemm(a_f.data(), lda, w_f.data(), ldw, want.data(), ldc, m, n, k);
    const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);

    std::vector<float> got_f(want.size(), -7.0f);
    Gemm(a.data(), lda, w.data(), ldw, got_f.data(), ldc, m, n, k);
    ExpectSameFloats(got_f, want, "float output " + what);

    const std::vector<BFloat16> c0(want.size(), ToBFloat16(-7.0f));
    std::vector<BFloat16> got_b = c0;
    Gemm(a.data(), lda, w.data(), ldw, got_b.data(), ldc, m, n, k);
    ExpectSameBits(got_b, RoundRows(c0, want, m, n, ldc), "bf16 output " + what);
  }
}

TEST(Bf16KernelsTest, ExpertGemmEqualsFloatExpertGemm) {
  const int64_t n = 70, k = 24, experts = 4, offset = 10, ldw = k + 2, lda = k + 1, ldc = n + 3;
  std::vector<std::vector<BFloat16>> weights;
  std::vector<std::vector<float>> weights_f;
  for (int64_t e = 0; e < experts; ++e) {
    weights.push_back(RandomBf16(offset + n * ldw, 80 + e));
    weights_f.push_back(Widen(weights.back()));
  }
  // Expert 1 has no rows and no weights; expert 3 has a single row.
  const std::vector<int32_t> offsets = {0, 3, 3, 8, 9};
  const BFloat16* table[experts] = {weights[0].data(), nullptr, weights[2].data(),
                                    weights[3].data()};
  const float* table_f[experts] = {weights_f[0].data(), nullptr, weights_f[2].data(),
                                   weights_f[3].data()};
  const int64_t rows = offsets[experts];
  const auto a = RandomBf16(rows * lda, 90);
  const auto a_f = Widen(a);
  std::vector<float> want(rows * ldc, 0.0f);
  ExpertGemm(a_f.data(), lda, table_f, offset, ldw, offsets.data(), experts, want.data(), ldc, n,
             k);
  const std::vector<BFloat16> c0(rows * ldc, BFloat16{0x4242});
  std::vector<BFloat16> got = c0;
  ExpertGemm(a.data(), lda, table, offset, ldw, offsets.data(), experts, got.data(), ldc, n, k);
  ExpectSameBits(got, RoundRows(c0, want, rows, n, ldc), "ExpertGemm");
}

}  // namespace
}  // namespace vamp::kernels::cpu
