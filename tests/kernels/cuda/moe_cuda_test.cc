// CUDA MoE kernels (router, permutation, SiLU-and-mul, expert GEMM, un-permutation) against their
// CPU twins, one by one and chained as a whole MoE layer.
//
// Tolerances: integer outputs (expert ids, offsets, permutation) must be identical. Elementwise
// float outputs use |gpu - cpu| <= 1e-5 * max(1, |cpu|) (float32 on both sides; only summation
// order and fused multiply-adds differ: errors of a few 1e-7 relative). GEMM outputs are compared
// against the size of the terms: |gpu - cpu| <= 1e-5 * sum_p |a_p * w_p| + 1e-6. The two sums of k
// products run in different orders (cuBLAS tiles and FMAs; the CPU's 8 lanes); the worst-case
// rounding bound is about k * 6e-8 of that sum (1.2e-4 at k = 2048), but for random data the
// error is a random walk, near sqrt(k) * 6e-8 (~3e-6), so 1e-5 holds with margin, while a wrong
// row, expert or offset is off by O(1) of that sum.
#include <cstring>
#include <numeric>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kElementwiseTol = 1e-5;
constexpr double kGemmTol = 1e-5;
constexpr float kSentinel = -12345.0f;

// Scale of each element of c = a x w^T for the GEMM tolerance: sum_p |a[i, p] * w[j, p]|.
std::vector<double> GemmTermScale(const std::vector<float>& a, int64_t lda, const float* w,
                                  int64_t ldw, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  std::vector<double> scale(m * ldc, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += std::abs(double(a[i * lda + p]) * w[j * ldw + p]);
      scale[i * ldc + j] = s;
    }
  }
  return scale;
}

void ExpectGemmClose(const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(scale.size(), want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= kGemmTol * scale[i] + 1e-6 || got[i] == want[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first at " << first
                     << ": got " << got[first] << ", want " << want[first] << " (term scale "
                     << scale[first] << ")";
}

struct RouterShape {
  int64_t tokens, experts, top_k;
};

using RouterTest = CudaTest;

TEST_F(RouterTest, RouterTopKMatchesCpu) {
  // Tiny model (16 experts, top-4), Qwen3-30B-A3B (128, top-8), Qwen3-Next (512, top-10), all
  // experts selected, and an odd expert count.
  for (const auto& [tokens, experts, top_k] :
       std::vector<RouterShape>{{7, 16, 4}, {5, 128, 8}, {3, 512, 10}, {2, 60, 60}, {4, 37, 1}}) {
    for (bool renormalize : {true, false}) {
      const int64_t stride = experts + 3;
      const auto logits = RandomFloats(tokens * stride, 51, 2.0f);
      std::vector<int32_t> want_ids(tokens * top_k);
      std::vector<float> want_w(tokens * top_k);
      cpu::RouterTopK(logits.data(), stride, tokens, experts, top_k, renormalize, want_ids.data(),
                      want_w.data());
      int32_t* d_ids = Alloc<int32_t>(want_ids.size());
      float* d_w = Alloc<float>(want_w.size());
      VAMP_ASSERT_OK(RouterTopK(Upload(logits), stride, tokens, experts, top_k, renormalize, d_ids,
                                d_w, stream_));
      const std::string what = std::to_string(experts) + " experts top-" + std::to_string(top_k) +
                               (renormalize ? " renormalised" : "");
      EXPECT_EQ(Download(d_ids, want_ids.size()), want_ids) << what;
      ExpectClose(Download(d_w, want_w.size()), want_w, kElementwiseTol, what);
    }
  }
}

TEST_F(RouterTest, TiesGoToTheLowerExpertId) {
  // Logits from {0, 1, 2}: every selection step has ties.
  const int64_t tokens = 9, experts = 128, top_k = 8;
  std::mt19937 rng(52);
  std::vector<float> logits(tokens * experts);
  for (auto& x : logits) x = static_cast<float>(std::uniform_int_distribution<int>(0, 2)(rng));
  for (int64_t e = 0; e < experts; ++e) logits[e] = 1.0f;  // token 0: all equal
  std::vector<int32_t> want_ids(tokens * top_k);
  std::vector<float> want_w(tokens * top_k);
  cpu::RouterTopK(logits.data(), experts, tokens, experts, top_k, true, want_ids.data(),
                  want_w.data());
  ASSERT_EQ(want_ids[0], 0);
  ASSERT_EQ(want_ids[top_k - 1], top_k - 1);
  int32_t* d_ids = Alloc<int32_t>(want_ids.size());
  float* d_w = Alloc<float>(want_w.size());
  VAMP_ASSERT_OK(
      RouterTopK(Upload(logits), experts, tokens, experts, top_k, true, d_ids, d_w, stream_));
  EXPECT_EQ(Download(d_ids, want_ids.size()), want_ids);
  ExpectClose(Download(d_w, want_w.size()), want_w, kElementwiseTol, "tied weights");
}

struct PermuteCase {
  int64_t tokens, top_k, experts;
  bool skewed;  // pair (t, j) on expert j % 2: runs of equal ids within a warp
};

using PermuteTest = CudaTest;

TEST_F(PermuteTest, MoePermuteMatchesCpuExactly) {
  // Includes an empty batch, batches within one pass of the kernel's 4096 pairs, and prefill
  // chunks of many passes (8192 x 8 = 65,536 pairs; a partial last pass; 512 experts).
  for (const auto& [tokens, top_k, experts, skewed] :
       std::vector<PermuteCase>{{7, 4, 16, false},
                                {8192, 8, 128, false},
                                {2049, 10, 512, false},
                                {3001, 8, 128, true},
                                {300, 8, 128, false},
                                {1, 8, 128, false},
                                {0, 8, 128, false},
                                {200, 4, 16, true},
                                {100, 1, 16, true},
                                {33, 10, 512, false}}) {
    std::mt19937 rng(61);
    std::vector<int32_t> ids(tokens * top_k);
    for (int64_t t = 0; t < tokens; ++t) {
      // Distinct experts per token, as the router produces (skewed cases repeat them: the sort
      // does not require distinct ids).
      std::vector<int32_t> all(experts);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < top_k; ++j)
        ids[t * top_k + j] = skewed ? static_cast<int32_t>(j % 2) : all[j];
    }
    const int64_t pairs = tokens * top_k;
    std::vector<int32_t> want_off(experts + 1), want_rt(pairs), want_pr(pairs);
    cpu::MoePermute(ids.data(), tokens, top_k, experts, want_off.data(), want_rt.data(),
                    want_pr.data());
    int32_t* d_off = Alloc<int32_t>(experts + 1);
    int32_t* d_rt = Alloc<int32_t>(pairs);
    int32_t* d_pr = Alloc<int32_t>(pairs);
    VAMP_ASSERT_OK(MoePermute(Upload(ids), tokens, top_k, experts, d_off, d_rt, d_pr, stream_));
    const std::string what = std::to_string(tokens) + " tokens top-" + std::to_string(top_k) +
                             " of " + std::to_string(experts) + (skewed ? " skewed" : "");
    EXPECT_EQ(Download(d_off, experts + 1), want_off) << what;
    EXPECT_EQ(Download(d_rt, pairs), want_rt) << what;
    EXPECT_EQ(Download(d_pr, pairs), want_pr) << what;
  }
}

TEST_F(PermuteTest, IdsOutsideTheExpertsGetNoRow) {
  // 3 tokens x top-2 on 4 experts; -1 and 4 are out of range (the CPU twin aborts on them).
  const std::vector<int32_t> ids{2, -1, 0, 2, 4, 1};
  int32_t* d_off = Alloc<int32_t>(5);
  int32_t* d_rt = Alloc<int32_t>(6);
  int32_t* d_pr = Alloc<int32_t>(6);
  VAMP_ASSERT_OK(MoePermute(Upload(ids), 3, 2, 4, d_off, d_rt, d_pr, stream_));
  EXPECT_EQ(Download(d_off, 5), (std::vector<int32_t>{0, 1, 2, 4, 4}));
  EXPECT_EQ(Download(d_pr, 6), (std::vector<int32_t>{2, -1, 0, 3, -1, 1}));
  const std::vector<int32_t> rt = Download(d_rt, 6);
  EXPECT_EQ(std::vector<int32_t>(rt.begin(), rt.begin() + 4), (std::vector<int32_t>{1, 2, 0, 1}));
}

using ActivationTest = CudaTest;

TEST_F(ActivationTest, SiluAndMulMatchesCpu) {
  for (const int64_t inter : {24, 37, 768}) {
    const int64_t rows = 9, x_stride = 2 * inter + 3, out_stride = inter + 2;
    const auto x = RandomFloats(rows * x_stride, 71, 3.0f);
    std::vector<float> want(rows * out_stride, kSentinel);
    cpu::SiluAndMul(x.data(), x_stride, rows, inter, want.data(), out_stride);
    float* d_out = Upload(std::vector<float>(want.size(), kSentinel));
    VAMP_ASSERT_OK(SiluAndMul(Upload(x), x_stride, rows, inter, d_out, out_stride, stream_));
    ExpectClose(Download(d_out, want.size()), want, kElementwiseTol,
                "SiluAndMul inter " + std::to_string(inter));
  }
}

TEST_F(ActivationTest, MoeUnpermuteMatchesCpu) {
  for (const auto& [tokens, top_k, experts, hidden] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {7, 4, 16, 64}, {5, 8, 128, 2048}, {3, 2, 4, 37}}) {
    std::mt19937 rng(81);
    std::vector<int32_t> ids(tokens * top_k);
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, experts - 1)(rng);
    const int64_t pairs = tokens * top_k;
    std::vector<int32_t> off(experts + 1), row_token(pairs), pair_row(pairs);
    cpu::MoePermute(ids.data(), tokens, top_k, experts, off.data(), row_token.data(),
                    pair_row.data());
    const int64_t y_stride = hidden + 1, out_stride = hidden + 4;
    const auto y = RandomFloats(pairs * y_stride, 82);
    const auto weights = RandomFloats(pairs, 83, 0.3f);
    std::vector<float> want(tokens * out_stride, kSentinel);
    cpu::MoeUnpermute(y.data(), y_stride, pair_row.data(), weights.data(), tokens, top_k, hidden,
                      want.data(), out_stride);
    float* d_out = Upload(std::vector<float>(want.size(), kSentinel));
    VAMP_ASSERT_OK(MoeUnpermute(Upload(y), y_stride, Upload(pair_row), Upload(weights), tokens,
                                top_k, hidden, d_out, out_stride, stream_));
    ExpectClose(Download(d_out, want.size()), want, kElementwiseTol,
                "MoeUnpermute hidden " + std::to_string(hidden));
  }
}

using GemmTest = CudaTest;

TEST_F(GemmTest, GemmMatchesCpu) {
  // Odd sizes, padded strides, a decode-sized QKV projection of the tiny model and a Qwen3-30B
  // shaped one (hidden 2048 -> (32 + 2 * 4) * 128 = 5120).
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {3, 5, 7}, {7, 67, 19}, {5, 128, 64}, {4, 5120, 2048}, {33, 160, 2048}}) {
    const int64_t lda = k + 3, ldw = k + 1, ldc = n + 2;
    const auto a = RandomFloats(m * lda, 91);
    const auto w = RandomFloats(n * ldw, 92);
    std::vector<float> want(m * ldc, kSentinel);
    cpu::Gemm(a.data(), lda, w.data(), ldw, want.data(), ldc, m, n, k);
    float* d_c = Upload(std::vector<float>(want.size(), kSentinel));
    VAMP_ASSERT_OK(Gemm(Upload(a), lda, Upload(w), ldw, d_c, ldc, m, n, k, stream_));
    auto scale = GemmTermScale(a, lda, w.data(), ldw, m, n, k, ldc);
    ExpectGemmClose(
        Download(d_c, want.size()), want, scale,
        "Gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
  }
}

TEST_F(GemmTest, ShortStridesAreRejected) {
  const float* none = nullptr;
  const absl::Status s = Gemm(none, 3, none, 4, nullptr, 5, 2, 5, 4, stream_);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

struct MoeShape {
  int64_t tokens, experts, top_k, hidden, inter;
};

// Expert shards [w13 | w2] (w13: [2 * inter, hidden], w2: [hidden, inter]) of the experts that
// have rows, stored on the device in reverse expert order inside one allocation, so the pointer
// table is not the identity; experts without rows have null pointers.
struct ExpertTable {
  std::vector<std::vector<float>> host;  // per expert, empty when it has no rows
  std::vector<const float*> host_ptrs;   // for the CPU twin
  std::vector<const float*> dev_ptrs;    // for the CUDA twin
};

TEST_F(GemmTest, MoeLayerMatchesCpuStepByStep) {
  // The tiny model, and Qwen3-30B-A3B at two tokens (16 experts with rows: ~300 MB of weights).
  for (const auto& [tokens, experts, top_k, hidden, inter] :
       std::vector<MoeShape>{{7, 16, 4, 64, 24}, {2, 128, 8, 2048, 768}}) {
    const std::string what = std::to_string(experts) + " experts, hidden " + std::to_string(hidden);
    const int64_t pairs = tokens * top_k;
    const int64_t w13_elems = 2 * inter * hidden, shard = w13_elems + hidden * inter;
    const auto x = RandomFloats(tokens * hidden, 101);
    const auto logits = RandomFloats(tokens * experts, 102, 2.0f);

    // Router and permutation (CPU reference).
    std::vector<int32_t> ids(pairs), off(experts + 1), row_token(pairs), pair_row(pairs);
    std::vector<float> topk_w(pairs);
    cpu::RouterTopK(logits.data(), experts, tokens, experts, top_k, true, ids.data(),
                    topk_w.data());
    cpu::MoePermute(ids.data(), tokens, top_k, experts, off.data(), row_token.data(),
                    pair_row.data());

    ExpertTable table;
    table.host.resize(experts);
    table.host_ptrs.assign(experts, nullptr);
    table.dev_ptrs.assign(experts, nullptr);
    int64_t used = 0;
    for (int64_t e = 0; e < experts; ++e) used += off[e + 1] > off[e];
    float* d_weights = Alloc<float>(used * shard);
    ASSERT_NE(d_weights, nullptr);
    int64_t slot = used;
    for (int64_t e = 0; e < experts; ++e) {
      if (off[e + 1] == off[e]) continue;
      table.host[e] = RandomFloats(shard, 1000 + e, 1.0f / std::sqrt(float(hidden)));
      table.host_ptrs[e] = table.host[e].data();
      float* dev = d_weights + (--slot) * shard;
      CopyToDevice(dev, table.host[e].data(), shard);
      table.dev_ptrs[e] = dev;
    }

    // CPU layer.
    std::vector<float> gathered(pairs * hidden), h13(pairs * 2 * inter), act(pairs * inter),
        y(pairs * hidden), out(tokens * hidden);
    cpu::GatherRows(x.data(), hidden, row_token.data(), pairs, hidden, gathered.data(), hidden);
    cpu::ExpertGemm(gathered.data(), hidden, table.host_ptrs.data(), 0, hidden, off.data(), experts,
                    h13.data(), 2 * inter, 2 * inter, hidden);
    cpu::SiluAndMul(h13.data(), 2 * inter, pairs, inter, act.data(), inter);
    cpu::ExpertGemm(act.data(), inter, table.host_ptrs.data(), w13_elems, inter, off.data(),
                    experts, y.data(), hidden, hidden, inter);
    cpu::MoeUnpermute(y.data(), hidden, pair_row.data(), topk_w.data(), tokens, top_k, hidden,
                      out.data(), hidden);

    // GPU layer, each stage checked against the CPU on the CPU's inputs to that stage, so an
    // error is pinned to its kernel; the final output is from the GPU chain.
    int32_t* d_ids = Alloc<int32_t>(pairs);
    float* d_topk_w = Alloc<float>(pairs);
    VAMP_ASSERT_OK(RouterTopK(Upload(logits), experts, tokens, experts, top_k, true, d_ids,
                              d_topk_w, stream_));
    EXPECT_EQ(Download(d_ids, pairs), ids) << what;
    int32_t* d_off = Alloc<int32_t>(experts + 1);
    int32_t* d_row_token = Alloc<int32_t>(pairs);
    int32_t* d_pair_row = Alloc<int32_t>(pairs);
    VAMP_ASSERT_OK(
        MoePermute(d_ids, tokens, top_k, experts, d_off, d_row_token, d_pair_row, stream_));
    const std::vector<int32_t> gpu_off = Download(d_off, experts + 1);  // host offsets for cuBLAS
    ASSERT_EQ(gpu_off, off) << what;
    float* d_gathered = Alloc<float>(pairs * hidden);
    VAMP_ASSERT_OK(
        GatherRows(Upload(x), hidden, d_row_token, pairs, hidden, d_gathered, hidden, stream_));
    ExpectClose(Download(d_gathered, pairs * hidden), gathered, 0.0, "gather " + what);
    float* d_h13 = Alloc<float>(pairs * 2 * inter);
    VAMP_ASSERT_OK(ExpertGemm(d_gathered, hidden, table.dev_ptrs.data(), 0, hidden, gpu_off.data(),
                              experts, d_h13, 2 * inter, 2 * inter, hidden, stream_));
    {
      std::vector<double> scale(pairs * 2 * inter);
      for (int64_t e = 0; e < experts; ++e) {
        for (int32_t r = off[e]; r < off[e + 1]; ++r) {
          for (int64_t j = 0; j < 2 * inter; ++j) {
            double s = 0;
            for (int64_t p = 0; p < hidden; ++p)
              s += std::abs(double(gathered[r * hidden + p]) * table.host[e][j * hidden + p]);
            scale[r * 2 * inter + j] = s;
          }
        }
      }
      ExpectGemmClose(Download(d_h13, h13.size()), h13, scale, "w13 " + what);
    }
    float* d_act = Alloc<float>(pairs * inter);
    VAMP_ASSERT_OK(SiluAndMul(d_h13, 2 * inter, pairs, inter, d_act, inter, stream_));
    float* d_y = Alloc<float>(pairs * hidden);
    // w2 from the CPU's activations, so this checks the GEMM alone.
    VAMP_ASSERT_OK(ExpertGemm(Upload(act), inter, table.dev_ptrs.data(), w13_elems, inter,
                              gpu_off.data(), experts, d_y, hidden, hidden, inter, stream_));
    {
      std::vector<double> scale(pairs * hidden);
      for (int64_t e = 0; e < experts; ++e) {
        for (int32_t r = off[e]; r < off[e + 1]; ++r) {
          for (int64_t j = 0; j < hidden; ++j) {
            double s = 0;
            for (int64_t p = 0; p < inter; ++p)
              s += std::abs(double(act[r * inter + p]) * table.host[e][w13_elems + j * inter + p]);
            scale[r * hidden + j] = s;
          }
        }
      }
      ExpectGemmClose(Download(d_y, y.size()), y, scale, "w2 " + what);
    }
    float* d_out = Alloc<float>(tokens * hidden);
    VAMP_ASSERT_OK(MoeUnpermute(d_y, hidden, d_pair_row, d_topk_w, tokens, top_k, hidden, d_out,
                                hidden, stream_));
    // The output went through two GEMMs, SiLU and a weighted sum on each side; the GEMM bound
    // (relative to the output's typical size, ~1 here) with a 10x allowance covers the chain.
    ExpectClose(Download(d_out, out.size()), out, 1e-4, "MoE output " + what);
  }
}

using RoutedCopyTest = CudaTest;

// Routed expert staging from pinned host memory, against the CPU twin: only the routed experts of
// the offloaded range land in the buffer (bit-exact), the rest keeps its old bytes, and the device
// counter adds the bytes copied. Experts of 600 KiB + 16 B: more than one 256 KiB chunk, not a
// multiple of it.
TEST_F(RoutedCopyTest, CopiesOnlyRoutedOffloadedExpertsFromPinnedMemory) {
  constexpr int64_t kExperts = 12, kFirst = 5, kBytes = 600 * 1024 + 16;
  constexpr int64_t kOffloaded = kExperts - kFirst;
  // Experts 5, 8 and 11 are routed (plus 1 and 3, which are resident and must not be copied).
  const std::vector<int32_t> counts = {0, 2, 0, 1, 0, 3, 0, 0, 1, 0, 0, 4};
  std::vector<int32_t> offsets(kExperts + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  uint8_t* host = nullptr;
  VAMP_ASSERT_CUDA(
      cudaHostAlloc(reinterpret_cast<void**>(&host), kOffloaded * kBytes, cudaHostAllocDefault));
  for (int64_t i = 0; i < kOffloaded * kBytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> want(kOffloaded * kBytes, 0xEE);
  uint64_t want_bytes = 0;
  cpu::CopyRoutedExperts(offsets.data(), kFirst, kExperts, host, want.data(), kBytes, &want_bytes);
  EXPECT_EQ(want_bytes, 3u * kBytes);

  void* device_src = nullptr;
  VAMP_ASSERT_CUDA(cudaHostGetDevicePointer(&device_src, host, 0));
  uint8_t* dst = Upload(std::vector<uint8_t>(kOffloaded * kBytes, 0xEE));
  uint64_t* counter = Upload(std::vector<uint64_t>{10});
  const int32_t* dev_offsets = Upload(offsets);
  VAMP_ASSERT_OK(CopyRoutedExperts(dev_offsets, kFirst, kExperts,
                                   static_cast<const uint8_t*>(device_src), dst, kBytes, counter,
                                   stream_));
  const std::vector<uint8_t> got = Download(dst, kOffloaded * kBytes);
  EXPECT_EQ(Download(counter, 1)[0], 10 + want_bytes);
  VAMP_ASSERT_CUDA(cudaFreeHost(host));
  EXPECT_TRUE(got == want) << "the staging buffer differs from the CPU twin's";

  EXPECT_EQ(
      CopyRoutedExperts(dev_offsets, kFirst, kExperts, dst, dst, 100, nullptr, stream_).code(),
      absl::StatusCode::kInvalidArgument)
      << "expert bytes not a multiple of 16";
}

}  // namespace
}  // namespace vamp::kernels::cuda
