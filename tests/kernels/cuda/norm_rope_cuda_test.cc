// CUDA RMSNorm, q/k norm + RoPE and row gather against their CPU twins (sampling: see
// sampling_cuda_test.cc).
//
// Tolerances: elementwise outputs use |gpu - cpu| <= 1e-5 * max(1, |cpu|). Both sides are float32;
// they differ only by the order of the sum of squares (relative error a few 1e-7 for the sizes
// here) and by nvcc's fused multiply-adds (half an ulp per step), so 1e-5 leaves a margin of
// ~10x while any indexing or formula error shows as O(1). Copies are compared exactly.
#include <cstring>
#include <numeric>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kElementwiseTol = 1e-5;
constexpr float kSentinel = -12345.0f;  // fills padding that no kernel may touch

struct NormShape {
  int64_t rows, hidden;
};
// Tiny model (64), odd sizes, Qwen3-30B-A3B hidden (2048), and a size past one block's stride.
const std::vector<NormShape> kNormShapes = {{1, 64}, {7, 64}, {5, 37}, {3, 2048}, {2, 4099}};

using NormTest = CudaTest;

TEST_F(NormTest, RmsNormMatchesCpu) {
  for (const bool whole_chunks : {false, true}) {
    for (const auto& [rows, hidden] : kNormShapes) {
      const int64_t x_stride = whole_chunks ? (hidden + 3) / 4 * 4 : hidden + 3;
      const int64_t out_stride = whole_chunks ? (hidden + 3) / 4 * 4 + 8 : hidden + 5;
      const auto x = RandomFloats(rows * x_stride, 11, 3.0f);
      const auto w = RandomFloats(hidden, 12);
      std::vector<float> want(rows * out_stride, kSentinel);
      cpu::RmsNorm(x.data(), x_stride, w.data(), 1e-6f, rows, hidden, want.data(), out_stride);
      float* d_out = Upload(std::vector<float>(rows * out_stride, kSentinel));
      VAMP_ASSERT_OK(
          RmsNorm(Upload(x), x_stride, Upload(w), 1e-6f, rows, hidden, d_out, out_stride, stream_));
      ExpectClose(Download(d_out, want.size()), want, kElementwiseTol,
                  "RmsNorm " + std::to_string(rows) + "x" + std::to_string(hidden) +
                      (whole_chunks ? " (whole chunks)" : ""));
    }
  }
}

TEST_F(NormTest, RmsNormInPlaceMatchesCpu) {
  const int64_t rows = 4, hidden = 2048, stride = 2050;
  auto x = RandomFloats(rows * stride, 13);
  const auto w = RandomFloats(hidden, 14);
  float* d_x = Upload(x);
  VAMP_ASSERT_OK(RmsNorm(d_x, stride, Upload(w), 1e-6f, rows, hidden, d_x, stride, stream_));
  cpu::RmsNorm(x.data(), stride, w.data(), 1e-6f, rows, hidden, x.data(), stride);
  ExpectClose(Download(d_x, x.size()), x, kElementwiseTol, "RmsNorm in place");
}

TEST_F(NormTest, FusedAddRmsNormMatchesCpu) {
  // Odd strides take the scalar kernel; strides of whole 16-byte chunks the vectorised one, up
  // to the 4,096 float32 elements it holds in registers (4,099 falls back either way).
  for (const bool whole_chunks : {false, true}) {
    for (const auto& [rows, hidden] : kNormShapes) {
      const int64_t x_stride = whole_chunks ? (hidden + 3) / 4 * 4 + 4 : hidden + 1;
      const int64_t r_stride = whole_chunks ? (hidden + 3) / 4 * 4 : hidden + 7;
      auto x = RandomFloats(rows * x_stride, 15);
      auto residual = RandomFloats(rows * r_stride, 16, 4.0f);
      const auto w = RandomFloats(hidden, 17);
      float* d_x = Upload(x);
      float* d_r = Upload(residual);
      VAMP_ASSERT_OK(
          FusedAddRmsNorm(d_x, x_stride, d_r, r_stride, Upload(w), 1e-5f, rows, hidden, stream_));
      cpu::FusedAddRmsNorm(x.data(), x_stride, residual.data(), r_stride, w.data(), 1e-5f, rows,
                           hidden);
      const std::string what = std::to_string(rows) + "x" + std::to_string(hidden);
      // The residual update is one float add per element on both sides: exact.
      ExpectClose(Download(d_r, residual.size()), residual, 0.0, "residual " + what);
      ExpectClose(Download(d_x, x.size()), x, kElementwiseTol,
                  "normed " + what + (whole_chunks ? " (whole chunks)" : ""));
    }
  }
}

struct RopeShape {
  int64_t tokens, q_heads, kv_heads, head_dim;
};

using RopeTest = CudaTest;

TEST_F(RopeTest, QkNormRopeMatchesCpu) {
  const int64_t max_positions = 4096;
  // Tiny model (4/2 heads, head_dim 16), Qwen3-30B-A3B (32/4, 128), and an odd head count with a
  // head_dim that is not a multiple of 32.
  for (const auto& [tokens, nq, nkv, hd] :
       std::vector<RopeShape>{{5, 4, 2, 16}, {3, 32, 4, 128}, {4, 3, 1, 40}}) {
    std::vector<float> cache(max_positions * hd);
    cpu::BuildRopeCache(1e6f, hd, max_positions, cache.data());
    const float* d_cache = Upload(cache);
    std::mt19937 rng(21);
    std::vector<int64_t> positions(tokens);
    for (auto& p : positions) p = std::uniform_int_distribution<int64_t>(0, max_positions - 1)(rng);
    positions[0] = 0;
    positions.back() = max_positions - 1;
    const int64_t* d_positions = Upload(positions);
    const auto qn = RandomFloats(hd, 22);
    const auto kn = RandomFloats(hd, 23);
    for (bool with_norm : {true, false}) {
      // Packed qkv rows, as the QKV projection writes them; v must stay untouched.
      const int64_t stride = (nq + 2 * nkv) * hd + 2;
      auto qkv = RandomFloats(tokens * stride, 24, 2.0f);
      float* d_qkv = Upload(qkv);
      VAMP_ASSERT_OK(QkNormRope(d_qkv, stride, d_qkv + nq * hd, stride, tokens, nq, nkv, hd,
                                with_norm ? Upload(qn) : nullptr, with_norm ? Upload(kn) : nullptr,
                                1e-6f, d_positions, d_cache, max_positions, stream_));
      cpu::QkNormRope(qkv.data(), stride, qkv.data() + nq * hd, stride, tokens, nq, nkv, hd,
                      with_norm ? qn.data() : nullptr, with_norm ? kn.data() : nullptr, 1e-6f,
                      positions.data(), cache.data(), max_positions);
      ExpectClose(Download(d_qkv, qkv.size()), qkv, kElementwiseTol,
                  "QkNormRope heads " + std::to_string(nq) + "/" + std::to_string(nkv) + " dim " +
                      std::to_string(hd) + (with_norm ? " norm" : " no norm"));
    }
  }
}

TEST_F(RopeTest, OddHeadDimIsRejected) {
  float* none = nullptr;
  const absl::Status s = QkNormRope(none, 0, none, 0, 1, 1, 1, 15, nullptr, nullptr, 1e-6f, nullptr,
                                    nullptr, 1, stream_);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

using GatherTest = CudaTest;

TEST_F(GatherTest, GatherRowsIsExact) {
  for (const int64_t cols : {64, 37, 2048}) {
    const int64_t vocab = 1000, rows = 13, src_stride = cols + 1, dst_stride = cols + 3;
    const auto table = RandomFloats(vocab * src_stride, 31);
    std::mt19937 rng(32);
    std::vector<int32_t> ids(rows);
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
    ids[1] = ids[0];  // repeated token
    ids[2] = vocab - 1;
    std::vector<float> want(rows * dst_stride, kSentinel);
    cpu::GatherRows(table.data(), src_stride, ids.data(), rows, cols, want.data(), dst_stride);
    float* d_dst = Upload(std::vector<float>(want.size(), kSentinel));
    VAMP_ASSERT_OK(
        GatherRows(Upload(table), src_stride, Upload(ids), rows, cols, d_dst, dst_stride, stream_));
    ExpectClose(Download(d_dst, want.size()), want, 0.0, "GatherRows cols " + std::to_string(cols));
  }
}

}  // namespace
}  // namespace vamp::kernels::cuda
