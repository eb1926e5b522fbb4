// cuda::GroupedExpertGemm and cuda::GroupedExpertGemmSiluMul (expert table and row offsets in
// device memory) against their CPU twins on random bf16 inputs.
//
// Tolerance, compared in float: both sides round a float32 sum of k products to bf16 once; the
// sums differ only in order (tensor-core k16 steps vs the CPU's lanes), by ~sqrt(k) * 2^-24 of the
// sum of |terms| for random data, so the bf16 results are equal or one ulp apart (2^-8 relative,
// below 1e-2 * max(1, |want|)); the fused SiLU adds expf's rounding. The k-dependent slack covers
// the float32 part for values near zero. A wrong row, expert, offset or fragment layout is off by
// O(1). Rows no expert owns (and rows of a skipped expert) must keep their sentinel.
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kTol = 1e-2;
const BFloat16 kSentinel = ToBFloat16(-12345.0f);

// Rows per expert of `tokens` tokens each routed to top_k distinct experts chosen uniformly.
std::vector<int32_t> RoutedRows(int64_t tokens, int64_t top_k, int64_t experts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> rows(experts, 0), ids(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) ids[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < top_k; ++j) {
      std::uniform_int_distribution<int64_t> pick(j, experts - 1);
      std::swap(ids[j], ids[pick(rng)]);
      ++rows[ids[j]];
    }
  }
  return rows;
}

struct Case {
  explicit Case(std::string name_arg) : name(std::move(name_arg)) {}
  std::string name;
  std::vector<int32_t> rows;  // per expert
  int64_t extra_rows = 0;     // max_rows - sum(rows)
  int64_t out_cols = 0;       // n, or inter when fused
  int64_t k = 0;
  bool fused = false;
  int64_t lda_pad = 0, ldw_pad = 0, ldc_pad = 0;
  int64_t weight_offset = 0;  // elements before W in each shard
  // Experts share `distinct` shards (table[e] = shard e % distinct): the real shapes need only a
  // few to test the table while keeping host memory small.
  int64_t distinct = 4;
  std::set<int64_t> null_experts;  // table entry null on the device (skipped there)
  int64_t misalign = 0;            // elements added to every table pointer
};

using GroupedGemmTest = CudaTest;

class GroupedGemmCaseTest : public CudaTest {
 public:
  void TinyModelCases();
  void FusedAllTileHeightsCases();

  // Runs one case on the GPU and on the CPU twin and compares every element of c.
  void Run(const Case& cs) {
    SCOPED_TRACE(cs.name);
    const int64_t experts = static_cast<int64_t>(cs.rows.size());
    const int64_t k = cs.k;
    const int64_t weight_rows = cs.fused ? 2 * cs.out_cols : cs.out_cols;
    const int64_t lda = k + cs.lda_pad, ldw = k + cs.ldw_pad, ldc = cs.out_cols + cs.ldc_pad;
    std::vector<int32_t> offsets{0};
    for (int32_t r : cs.rows) offsets.push_back(offsets.back() + r);
    const int64_t max_rows = offsets.back() + cs.extra_rows;

    // Shards padded to 8 elements so that each starts 16-byte aligned unless `misalign` says not.
    const int64_t shard_elems = (cs.weight_offset + weight_rows * ldw + cs.misalign + 7) / 8 * 8;
    const auto weights = RandomBf16(cs.distinct * shard_elems, 7,
                                    1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(k, 1))));
    const auto a = RandomBf16(max_rows * lda, 9, 1.0f);
    std::vector<BFloat16> want(max_rows * ldc, kSentinel);

    std::vector<const BFloat16*> host_table(experts);
    for (int64_t e = 0; e < experts; ++e) {
      host_table[e] = weights.data() + (e % cs.distinct) * shard_elems + cs.misalign;
    }
    const absl::Status cpu =
        cs.fused ? cpu::GroupedExpertGemmSiluMul(a.data(), lda, host_table.data(), cs.weight_offset,
                                                 ldw, offsets.data(), experts, max_rows,
                                                 want.data(), ldc, cs.out_cols, k)
                 : cpu::GroupedExpertGemm(a.data(), lda, host_table.data(), cs.weight_offset, ldw,
                                          offsets.data(), experts, max_rows, want.data(), ldc,
                                          cs.out_cols, k);
    ASSERT_TRUE(cpu.ok()) << cpu;
    // A null table entry on the device: its rows keep the sentinel.
    for (int64_t e : cs.null_experts) {
      for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
        for (int64_t j = 0; j < cs.out_cols; ++j) want[r * ldc + j] = kSentinel;
      }
    }

    BFloat16* d_weights = Upload(weights);
    std::vector<const BFloat16*> dev_table(experts);
    for (int64_t e = 0; e < experts; ++e) {
      dev_table[e] = cs.null_experts.count(e)
                         ? nullptr
                         : d_weights + (e % cs.distinct) * shard_elems + cs.misalign;
    }
    BFloat16* d_c = Upload(std::vector<BFloat16>(max_rows * ldc, kSentinel));
    const BFloat16* d_a = Upload(a);
    const BFloat16* const* d_table = Upload(dev_table);
    const int32_t* d_offsets = Upload(offsets);
    ASSERT_FALSE(HasFailure());
    VAMP_ASSERT_OK(
        cs.fused ? GroupedExpertGemmSiluMul(d_a, lda, d_table, cs.weight_offset, ldw, d_offsets,
                                            experts, max_rows, d_c, ldc, cs.out_cols, k, stream_)
                 : GroupedExpertGemm(d_a, lda, d_table, cs.weight_offset, ldw, d_offsets, experts,
                                     max_rows, d_c, ldc, cs.out_cols, k, stream_));
    const std::vector<BFloat16> got = Download(d_c, max_rows * ldc);
    ASSERT_FALSE(HasFailure());

    const double slack = 1e-6 * static_cast<double>(k);
    int64_t bad = 0, exact = 0, first = -1;
    for (int64_t i = 0; i < max_rows * ldc; ++i) {
      const double g = ToFloat(got[i]), w = ToFloat(want[i]);
      if (got[i].bits == want[i].bits) {
        ++exact;
        continue;
      }
      const bool sentinel = want[i].bits == kSentinel.bits || got[i].bits == kSentinel.bits;
      if (sentinel || !(std::abs(g - w) <= kTol * std::max(1.0, std::abs(w)) + slack)) {
        if (bad++ == 0) first = i;
      }
    }
    EXPECT_EQ(bad, 0) << bad << " of " << max_rows * ldc << " elements differ; first at row "
                      << first / ldc << " col " << first % ldc << ": got "
                      << (first >= 0 ? ToFloat(got[first]) : 0.0f) << ", want "
                      << (first >= 0 ? ToFloat(want[first]) : 0.0f);
    RecordProperty("bit_identical_fraction",
                   std::to_string(static_cast<double>(exact) / (max_rows * ldc)));
  }
};

// ---- skewed row distributions (tensor-core path, all three tile heights) ----

TEST_F(GroupedGemmCaseTest, AllRowsOnOneExpertWithSpareRows) {
  // avg rows = ceil(337 / min(8, 337)) = 43: medium tiles; 300 rows = 4 tiles of 64 + a partial.
  Case cs{"all rows on expert 5"};
  cs.rows = {0, 0, 0, 0, 0, 300, 0, 0};
  cs.extra_rows = 37;
  cs.out_cols = 256;
  cs.k = 192;
  Run(cs);
}

TEST_F(GroupedGemmCaseTest, LargeTilesWithPartialTiles) {
  // avg rows = 700 / 2 = 350: 128-row tiles; n and k not multiples of the 128 x 64 tile.
  Case cs{"large tiles"};
  cs.rows = {261, 439};
  cs.out_cols = 200;
  cs.k = 328;
  cs.ldc_pad = 8;
  Run(cs);
}

TEST_F(GroupedGemmCaseTest, ManyEmptyExperts) {
  // 64 experts, 10 with rows (1..40), the others empty with null pointers; spare rows.
  Case cs{"many empty experts"};
  cs.rows.assign(64, 0);
  std::mt19937 rng(3);
  for (int i = 0; i < 10; ++i) cs.rows[(i * 37 + 5) % 64] = 1 + static_cast<int32_t>(rng() % 40);
  cs.extra_rows = 100;
  cs.out_cols = 256;
  cs.k = 128;
  for (int64_t e = 0; e < 64; ++e) {
    if (cs.rows[e] == 0 && e % 2 == 0) cs.null_experts.insert(e);
  }
  Run(cs);
}

TEST_F(GroupedGemmCaseTest, MaxRowsFarAboveActualRows) {
  Case cs{"max_rows 10x"};
  cs.rows = {3, 0, 1, 2};
  cs.extra_rows = 54;
  cs.out_cols = 64;
  cs.k = 64;
  Run(cs);
}

// ---- the real shapes at small scale (w13 and w2 of one shard; w2 after w13) ----

struct ModelShape {
  const char* name;
  int64_t hidden, inter, experts, top_k;
};
constexpr ModelShape kQwen3_30B{"qwen3-30b-a3b", 2048, 768, 128, 8};
constexpr ModelShape kQwen3Next{"qwen3-next", 2048, 512, 512, 10};

void RealShapeCases(GroupedGemmCaseTest* test, const ModelShape& m, int64_t tokens) {
  const std::vector<int32_t> rows = RoutedRows(tokens, m.top_k, m.experts, 17);
  const std::string what = std::string(m.name) + " tokens " + std::to_string(tokens);
  Case w13{what + " w13"};
  w13.rows = rows;
  w13.out_cols = 2 * m.inter;
  w13.k = m.hidden;
  test->Run(w13);
  Case w2{what + " w2"};
  w2.rows = rows;
  w2.out_cols = m.hidden;
  w2.k = m.inter;
  w2.weight_offset = 2 * m.inter * m.hidden;
  test->Run(w2);
  Case fused{what + " w13 fused"};
  fused.rows = rows;
  fused.out_cols = m.inter;
  fused.k = m.hidden;
  fused.fused = true;
  test->Run(fused);
}

// Prefill-sized groups (Hopper: the wgmma tiles) at a reduced width so the CPU twin stays quick:
// 1,024 tokens top-2 over 16 experts is 128 rows per expert on average, over 8 experts 256; the
// odd widths leave partial tiles in n and k.
constexpr ModelShape kPrefillMedium{"prefill, 16 experts", 512, 384, 16, 2};
constexpr ModelShape kPrefillLarge{"prefill, 8 experts", 512, 384, 8, 2};
constexpr ModelShape kPrefillOdd{"prefill, 8 experts, odd widths", 328, 104, 8, 2};
// The default kernels (wgmma on Hopper), then the mma.sync tiles (SetGroupedGemmMmaSyncOnly),
// then the default again.
void BothTensorCoreKernels(const std::function<void()>& body) {
  for (const bool mma_sync : {false, true}) {
    SCOPED_TRACE(mma_sync ? "mma.sync tiles" : "default tiles");
    SetGroupedGemmMmaSyncOnly(mma_sync);
    body();
  }
  SetGroupedGemmMmaSyncOnly(false);
}

// Decode-sized groups (up to 16 rows per expert) on the 16 x 64 decode tiles (default) and on the
// 32 x 128 tiles they replaced.
void BothDecodeTiles(const std::function<void()>& body) {
  for (const bool decode_tile : {true, false}) {
    SCOPED_TRACE(decode_tile ? "16 x 64 decode tiles" : "32 x 128 tiles");
    SetGroupedGemmDecodeTile(decode_tile);
    body();
  }
  SetGroupedGemmDecodeTile(true);
}

TEST_F(GroupedGemmCaseTest, PrefillMediumTiles) {
  BothTensorCoreKernels([&] { RealShapeCases(this, kPrefillMedium, 1024); });
}
TEST_F(GroupedGemmCaseTest, PrefillLargeTiles) {
  BothTensorCoreKernels([&] { RealShapeCases(this, kPrefillLarge, 1024); });
}
TEST_F(GroupedGemmCaseTest, MidSizeGroupsOnEveryKernel) {
  // 512 tokens top-2 over 16 experts: 64 rows per expert (wgmma on Hopper, mma.sync 64-row tiles).
  BothTensorCoreKernels([&] { RealShapeCases(this, kPrefillMedium, 512); });
}
TEST_F(GroupedGemmCaseTest, PrefillOddWidths) {
  BothTensorCoreKernels([&] { RealShapeCases(this, kPrefillOdd, 1024); });
}

TEST_F(GroupedGemmCaseTest, Qwen3_30B_4Tokens) {
  BothDecodeTiles([&] { RealShapeCases(this, kQwen3_30B, 4); });
}
TEST_F(GroupedGemmCaseTest, Qwen3_30B_64Tokens) {
  BothDecodeTiles([&] { RealShapeCases(this, kQwen3_30B, 64); });
}
TEST_F(GroupedGemmCaseTest, Qwen3Next_4Tokens) {
  BothDecodeTiles([&] { RealShapeCases(this, kQwen3Next, 4); });
}
TEST_F(GroupedGemmCaseTest, Qwen3Next_64Tokens) { RealShapeCases(this, kQwen3Next, 64); }

// ---- tiny test model (hidden 64, inter 24, 16 experts, top-4): predicated partial tiles ----

TEST_F(GroupedGemmCaseTest, TinyModelShapes) {
  BothDecodeTiles([&] { TinyModelCases(); });
}

void GroupedGemmCaseTest::TinyModelCases() {
  const std::vector<int32_t> rows = RoutedRows(7, 4, 16, 23);
  Case w13{"tiny w13 n48 k64"};
  w13.rows = rows;
  w13.out_cols = 48;
  w13.k = 64;
  Run(w13);
  Case w2{"tiny w2 n64 k24, after w13"};
  w2.rows = rows;
  w2.out_cols = 64;
  w2.k = 24;
  w2.weight_offset = 48 * 64;
  Run(w2);
  Case fused{"tiny w13 fused inter 24"};
  fused.rows = rows;
  fused.out_cols = 24;
  fused.k = 64;
  fused.fused = true;
  Run(fused);
}

// ---- strides, offsets, fused tile heights ----

TEST_F(GroupedGemmCaseTest, PaddedStridesAndWeightOffset) {
  Case cs{"ldc > n, lda > k, ldw > k, weight_offset"};
  cs.rows = {5, 0, 40, 7};
  cs.out_cols = 128;
  cs.k = 256;
  cs.lda_pad = 16;
  cs.ldw_pad = 8;
  cs.ldc_pad = 24;
  cs.weight_offset = 4096;
  Run(cs);
}

TEST_F(GroupedGemmCaseTest, FusedAllTileHeights) {
  BothDecodeTiles([&] { FusedAllTileHeightsCases(); });
}

void GroupedGemmCaseTest::FusedAllTileHeightsCases() {
  for (const auto& rows : std::vector<std::vector<int32_t>>{{3, 9, 0, 1}, {150, 30}, {700}}) {
    Case cs{"fused, " + std::to_string(rows.size()) + " experts"};
    cs.rows = rows;
    cs.out_cols = 192;  // inter: 3 CTAs of 64 output columns
    cs.k = 320;
    cs.ldc_pad = 8;
    cs.fused = true;
    Run(cs);
  }
}

// ---- fallbacks ----

TEST_F(GroupedGemmCaseTest, GenericPathForOddShapes) {
  for (bool fused : {false, true}) {
    Case cs{fused ? "generic fused inter 13 k 29" : "generic n 37 k 29"};
    cs.rows = {4, 0, 19, 1};
    cs.extra_rows = 3;
    cs.out_cols = fused ? 13 : 37;
    cs.k = 29;
    cs.lda_pad = 1;
    cs.ldc_pad = 3;
    cs.fused = fused;
    Run(cs);
  }
}

TEST_F(GroupedGemmCaseTest, MisalignedExpertPointersFallBackInKernel) {
  // Shapes qualify for tensor cores, but every table pointer is 2 bytes off 16-byte alignment.
  for (bool fused : {false, true}) {
    Case cs{fused ? "misaligned fused" : "misaligned"};
    cs.rows = {6, 0, 70};
    cs.out_cols = 128;
    cs.k = 128;
    cs.misalign = 1;
    cs.fused = fused;
    Run(cs);
  }
}

TEST_F(GroupedGemmCaseTest, NullWeightsOfExpertWithRowsAreSkipped) {
  Case cs{"null expert with rows"};
  cs.rows = {4, 9, 2};
  cs.out_cols = 64;
  cs.k = 64;
  cs.null_experts = {1};
  Run(cs);
}

// ---- batch invariance: a row's bits do not depend on the batch (tile height, position) ----

TEST_F(GroupedGemmTest, RowResultDoesNotDependOnTheBatch) {
  const int64_t n = 256, k = 512;
  const auto w = RandomBf16(n * k, 5, 1.0f / std::sqrt(static_cast<float>(k)));
  const auto a = RandomBf16(600 * k, 6, 1.0f);
  BFloat16* d_w = Upload(w);
  const std::vector<const BFloat16*> table{d_w};
  const auto* d_table = Upload(table);
  const BFloat16* d_a = Upload(a);
  ASSERT_FALSE(HasFailure());
  // 600 rows on one expert (128-row tiles), then rows 0..4 alone (32-row tiles).
  BFloat16* d_big = Alloc<BFloat16>(600 * n);
  BFloat16* d_small = Alloc<BFloat16>(5 * n);
  VAMP_ASSERT_OK(GroupedExpertGemm(d_a, k, d_table, 0, k, Upload(std::vector<int32_t>{0, 600}), 1,
                                   600, d_big, n, n, k, stream_));
  VAMP_ASSERT_OK(GroupedExpertGemm(d_a, k, d_table, 0, k, Upload(std::vector<int32_t>{0, 5}), 1, 5,
                                   d_small, n, n, k, stream_));
  const auto big = Download(d_big, 600 * n);
  const auto small = Download(d_small, 5 * n);
  for (int64_t i = 0; i < 5 * n; ++i) ASSERT_EQ(big[i].bits, small[i].bits) << "element " << i;
  // The same 5 rows on the 32 x 128 tiles the 16 x 64 decode tiles replaced.
  SetGroupedGemmDecodeTile(false);
  BFloat16* d_small32 = Alloc<BFloat16>(5 * n);
  VAMP_ASSERT_OK(GroupedExpertGemm(d_a, k, d_table, 0, k, Upload(std::vector<int32_t>{0, 5}), 1, 5,
                                   d_small32, n, n, k, stream_));
  SetGroupedGemmDecodeTile(true);
  const auto small32 = Download(d_small32, 5 * n);
  for (int64_t i = 0; i < 5 * n; ++i) {
    ASSERT_EQ(small32[i].bits, small[i].bits) << "32-row tiles, element " << i;
  }
  // 64, 130 and 600 rows on both tensor-core kernels (wgmma on Hopper) against the 32-row tiles.
  BothTensorCoreKernels([&] {
    for (const int32_t rows : {64, 130, 600}) {
      BFloat16* d_busy = Alloc<BFloat16>(rows * n);
      VAMP_ASSERT_OK(GroupedExpertGemm(d_a, k, d_table, 0, k, Upload(std::vector<int32_t>{0, rows}),
                                       1, rows, d_busy, n, n, k, stream_));
      const auto busy = Download(d_busy, rows * n);
      for (int64_t i = 0; i < 5 * n; ++i) {
        ASSERT_EQ(busy[i].bits, small[i].bits) << rows << " rows, element " << i;
      }
    }
  });
}

// ---- host-side argument checks: no device needed ----

TEST(GroupedGemmArgsTest, RejectsBadArgumentsBeforeLaunching) {
  auto* fake = reinterpret_cast<BFloat16*>(uintptr_t{0x1000});
  const auto* table = reinterpret_cast<const BFloat16* const*>(uintptr_t{0x2000});
  const auto* offsets = reinterpret_cast<const int32_t*>(uintptr_t{0x3000});
  auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(
      code(GroupedExpertGemm(fake, 64, table, 0, 64, offsets, 4, -1, fake, 64, 64, 64, nullptr)),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(GroupedExpertGemm(fake, 63, table, 0, 64, offsets, 4, 8, fake, 64, 64, 64, nullptr)),
      absl::StatusCode::kInvalidArgument);  // lda < k
  EXPECT_EQ(
      code(GroupedExpertGemm(fake, 64, table, 0, 64, offsets, 4, 8, fake, 63, 64, 64, nullptr)),
      absl::StatusCode::kInvalidArgument);  // ldc < n
  EXPECT_EQ(
      code(GroupedExpertGemm(nullptr, 64, table, 0, 64, offsets, 4, 8, fake, 64, 64, 64, nullptr)),
      absl::StatusCode::kInvalidArgument);  // null a with work
  EXPECT_EQ(
      code(GroupedExpertGemm(fake, 64, table, 0, 64, nullptr, 4, 8, fake, 64, 64, 64, nullptr)),
      absl::StatusCode::kInvalidArgument);  // null offsets
  EXPECT_EQ(code(GroupedExpertGemm(fake, 64, table, 0, 64, offsets, 4, int64_t{1} << 32, fake, 64,
                                   64, 64, nullptr)),
            absl::StatusCode::kInvalidArgument);  // rows beyond int32
  EXPECT_EQ(code(GroupedExpertGemmSiluMul(fake, 64, table, 0, 64, offsets, 4, 8, fake, 31, 32, 64,
                                          nullptr)),
            absl::StatusCode::kInvalidArgument);  // ldo < inter
  // Nothing to do: OK without touching any pointer.
  EXPECT_TRUE(
      GroupedExpertGemm(nullptr, 64, nullptr, 0, 64, nullptr, 0, 8, nullptr, 64, 64, 64, nullptr)
          .ok());
  EXPECT_TRUE(
      GroupedExpertGemm(nullptr, 64, nullptr, 0, 64, nullptr, 4, 0, nullptr, 64, 64, 64, nullptr)
          .ok());
}

}  // namespace
}  // namespace vamp::kernels::cuda
