// Qwen3-Next's elementwise CUDA kernels against their CPU twins on random inputs, float32 and
// bfloat16: the sigmoid gates (attention output gate, shared-expert gate), the grouped gated
// RMSNorm of Gated DeltaNet, and the partial rotary embedding with per-head q/k norm. Shapes are
// Qwen3-Next's (16 q heads and 2 kv heads of 256 with rotary 64; 32 value heads of 128; hidden
// 2048) at 1 to 70 rows, plus odd ones. The argument checks run anywhere; everything else skips
// without a GPU.
//
// Tolerances, as in norm_rope_cuda_test.cc and bf16_kernels_cuda_test.cc:
//   - float32 outputs: |gpu - cpu| <= 1e-5 * max(1, |cpu|). Both sides compute in float32 and
//     differ by CUDA's expf (at most 2 ulp), the sum of squares' order and, in the rope, nvcc's
//     fused multiply-adds: a few 1e-7 relative, so 1e-5 leaves a margin of ~10x while an indexing
//     or formula error is O(1);
//   - bfloat16 outputs: |gpu - cpu| <= 2^-7 * max(1, |cpu|) after widening: those nearly equal
//     floats round to the same bf16 value or a neighbour, one bf16 ulp being at most 2^-7 of it;
//   - the elements a kernel must not write (row padding, v in a packed qkv row, the pass-through
//     part of a head without a norm weight) are part of every compared buffer: the CPU twin leaves
//     them as they were, so a stray GPU write of another value shows;
//   - QkNormPartialRope with rotary_dim == head_dim against QkNormRope on the GPU: bit-exact (one
//     kernel).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/gating.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/gating.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kElementwiseTol = 1e-5;

std::string Shape(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

struct RowShape {
  int64_t rows, cols;
};
// Qwen3-Next's gated attention output (16 heads x 256) and hidden size (2048) at decode, small and
// large prefill row counts; an odd width below one block; a width past one block's stride.
const std::vector<RowShape> kRowShapes = {{1, 4096},  {7, 4096}, {70, 4096}, {1, 2048},
                                          {70, 2048}, {5, 37},   {3, 1000}};

// ---- Sigmoid gates ----

using GatingTest = CudaTest;

TEST_F(GatingTest, SigmoidGateMatchesCpu) {
  for (const auto& [rows, cols] : kRowShapes) {
    // The gate is a view into a wider row (as the q projection writes [q | gate]); x is padded.
    const int64_t x_stride = cols + 3, gate_stride = 2 * cols + 1;
    auto x = RandomFloats(rows * x_stride, 101, 2.0f);
    const auto gate = RandomFloats(rows * gate_stride, 102, 4.0f);
    float* d_x = Upload(x);
    VAMP_ASSERT_OK(
        SigmoidGate(d_x, x_stride, Upload(gate) + cols, gate_stride, rows, cols, stream_));
    cpu::SigmoidGate(x.data(), x_stride, gate.data() + cols, gate_stride, rows, cols);
    ExpectClose(Download(d_x, x.size()), x, kElementwiseTol, "SigmoidGate " + Shape(rows, cols));
  }
}

TEST_F(GatingTest, SigmoidGateBf16MatchesCpu) {
  for (const auto& [rows, cols] : kRowShapes) {
    const int64_t x_stride = cols + 3, gate_stride = 2 * cols + 1;
    auto x = RandomBf16(rows * x_stride, 103, 2.0f);
    const auto gate = RandomBf16(rows * gate_stride, 104, 4.0f);
    BFloat16* d_x = Upload(x);
    VAMP_ASSERT_OK(
        SigmoidGate(d_x, x_stride, Upload(gate) + cols, gate_stride, rows, cols, stream_));
    cpu::SigmoidGate(x.data(), x_stride, gate.data() + cols, gate_stride, rows, cols);
    ExpectBf16Close(Download(d_x, x.size()), x, "SigmoidGate bf16 " + Shape(rows, cols));
  }
}

TEST_F(GatingTest, AddSigmoidScaledMatchesCpu) {
  for (const auto& [rows, cols] : kRowShapes) {
    for (const int64_t gate_stride : {1, 3}) {  // one logit per row, packed or strided
      const int64_t out_stride = cols + 2, y_stride = cols + 5;
      auto out = RandomFloats(rows * out_stride, 105, 2.0f);
      const auto y = RandomFloats(rows * y_stride, 106, 2.0f);
      const auto gate = RandomFloats(rows * gate_stride, 107, 3.0f);
      float* d_out = Upload(out);
      VAMP_ASSERT_OK(AddSigmoidScaled(d_out, out_stride, Upload(y), y_stride, Upload(gate),
                                      gate_stride, rows, cols, stream_));
      cpu::AddSigmoidScaled(out.data(), out_stride, y.data(), y_stride, gate.data(), gate_stride,
                            rows, cols);
      ExpectClose(
          Download(d_out, out.size()), out, kElementwiseTol,
          "AddSigmoidScaled " + Shape(rows, cols) + " gate stride " + std::to_string(gate_stride));
    }
  }
}

TEST_F(GatingTest, AddSigmoidScaledBf16MatchesCpu) {
  for (const auto& [rows, cols] : kRowShapes) {
    for (const int64_t gate_stride : {1, 3}) {
      const int64_t out_stride = cols + 2, y_stride = cols + 5;
      auto out = RandomBf16(rows * out_stride, 108, 2.0f);
      const auto y = RandomBf16(rows * y_stride, 109, 2.0f);
      const auto gate = RandomFloats(rows * gate_stride, 110, 3.0f);
      BFloat16* d_out = Upload(out);
      VAMP_ASSERT_OK(AddSigmoidScaled(d_out, out_stride, Upload(y), y_stride, Upload(gate),
                                      gate_stride, rows, cols, stream_));
      cpu::AddSigmoidScaled(out.data(), out_stride, y.data(), y_stride, gate.data(), gate_stride,
                            rows, cols);
      ExpectBf16Close(Download(d_out, out.size()), out,
                      "AddSigmoidScaled bf16 " + Shape(rows, cols) + " gate stride " +
                          std::to_string(gate_stride));
    }
  }
}

TEST(GatingArgsTest, BadSizesAreRejectedAndEmptyCallsLaunchNothing) {
  float* f = nullptr;
  BFloat16* b = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(SigmoidGate(f, 0, f, 0, -1, 4, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(SigmoidGate(b, 0, b, 0, 2, -4, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(AddSigmoidScaled(f, 0, f, 0, f, 1, -1, 4, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(AddSigmoidScaled(b, 0, b, 0, f, 1, 1, -4, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(SigmoidGate(f, 0, f, 0, int64_t{1} << 32, 4, nullptr)));
  // Zero rows or columns: OK without touching the (null) pointers or the device.
  EXPECT_TRUE(SigmoidGate(f, 0, f, 0, 0, 4, nullptr).ok());
  EXPECT_TRUE(SigmoidGate(b, 0, b, 0, 3, 0, nullptr).ok());
  EXPECT_TRUE(AddSigmoidScaled(f, 0, f, 0, f, 1, 0, 4, nullptr).ok());
  EXPECT_TRUE(AddSigmoidScaled(b, 0, b, 0, f, 1, 3, 0, nullptr).ok());
}

// ---- Grouped gated RMSNorm ----

struct GroupShape {
  int64_t rows, groups, dim;
};
// Qwen3-Next's 32 value heads of 128 at 1 to 70 tokens; 256-wide groups; odd sizes below a warp;
// a group past a warp's 32 x 8 elements; one group per row.
const std::vector<GroupShape> kGroupShapes = {
    {1, 32, 128}, {9, 32, 128}, {70, 32, 128}, {4, 8, 256}, {3, 3, 7}, {2, 5, 300}, {6, 1, 64}};

using GatedNormTest = CudaTest;

TEST_F(GatedNormTest, RmsNormGatedMatchesCpu) {
  for (const auto& [rows, groups, dim] : kGroupShapes) {
    // x and z sit in one projection-like row ([x | z], z starting mid-row), out is padded.
    const int64_t width = groups * dim, in_stride = 2 * width + 3, out_stride = width + 5;
    const auto in = RandomFloats(rows * in_stride, 111, 2.0f);
    const auto w = RandomFloats(dim, 112);
    std::vector<float> out(rows * out_stride, -12345.0f);
    const float* d_in = Upload(in);
    float* d_out = Upload(out);
    VAMP_ASSERT_OK(RmsNormGated(d_in, in_stride, d_in + width, in_stride, Upload(w), 1e-6f, rows,
                                groups, dim, d_out, out_stride, stream_));
    cpu::RmsNormGated(in.data(), in_stride, in.data() + width, in_stride, w.data(), 1e-6f, rows,
                      groups, dim, out.data(), out_stride);
    ExpectClose(Download(d_out, out.size()), out, kElementwiseTol,
                "RmsNormGated " + Shape(rows, groups) + "x" + std::to_string(dim));
  }
}

TEST_F(GatedNormTest, RmsNormGatedInPlaceMatchesCpu) {
  // As the model calls it: the delta rule's output normalised in place, z from the projection.
  const int64_t rows = 13, groups = 32, dim = 128, width = groups * dim;
  auto x = RandomFloats(rows * width, 113, 2.0f);
  const auto z = RandomFloats(rows * (width + 7), 114, 3.0f);
  const auto w = RandomFloats(dim, 115);
  float* d_x = Upload(x);
  VAMP_ASSERT_OK(RmsNormGated(d_x, width, Upload(z), width + 7, Upload(w), 1e-6f, rows, groups, dim,
                              d_x, width, stream_));
  cpu::RmsNormGated(x.data(), width, z.data(), width + 7, w.data(), 1e-6f, rows, groups, dim,
                    x.data(), width);
  ExpectClose(Download(d_x, x.size()), x, kElementwiseTol, "RmsNormGated in place");
}

TEST_F(GatedNormTest, RmsNormGatedBf16OutputMatchesCpu) {
  for (const auto& [rows, groups, dim] : kGroupShapes) {
    const int64_t width = groups * dim, in_stride = 2 * width + 3, out_stride = width + 5;
    const auto in = RandomFloats(rows * in_stride, 116, 2.0f);
    const auto w = RandomFloats(dim, 117);
    std::vector<BFloat16> out(rows * out_stride, ToBFloat16(-12345.0f));
    const float* d_in = Upload(in);
    BFloat16* d_out = Upload(out);
    VAMP_ASSERT_OK(RmsNormGated(d_in, in_stride, d_in + width, in_stride, Upload(w), 1e-6f, rows,
                                groups, dim, d_out, out_stride, stream_));
    cpu::RmsNormGated(in.data(), in_stride, in.data() + width, in_stride, w.data(), 1e-6f, rows,
                      groups, dim, out.data(), out_stride);
    ExpectBf16Close(Download(d_out, out.size()), out,
                    "RmsNormGated bf16 " + Shape(rows, groups) + "x" + std::to_string(dim));
  }
}

TEST(GatedNormArgsTest, BadSizesAreRejectedAndEmptyCallsLaunchNothing) {
  const float* in = nullptr;
  float* f = nullptr;
  BFloat16* b = nullptr;
  EXPECT_TRUE(
      absl::IsInvalidArgument(RmsNormGated(in, 0, in, 0, in, 1e-6f, -1, 2, 4, f, 0, nullptr)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(RmsNormGated(in, 0, in, 0, in, 1e-6f, 1, -2, 4, b, 0, nullptr)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(RmsNormGated(in, 0, in, 0, in, 1e-6f, 1, 2, 0, f, 0, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      RmsNormGated(in, 0, in, 0, in, 1e-6f, int64_t{1} << 31, 32, 128, f, 0, nullptr)));
  EXPECT_TRUE(RmsNormGated(in, 0, in, 0, in, 1e-6f, 0, 32, 128, f, 0, nullptr).ok());
  EXPECT_TRUE(RmsNormGated(in, 0, in, 0, in, 1e-6f, 5, 0, 128, b, 0, nullptr).ok());
}

// ---- Partial rotary embedding ----

struct PartialRopeShape {
  int64_t tokens, q_heads, kv_heads, head_dim, rotary_dim;
};

using PartialRopeTest = CudaTest;

constexpr int64_t kMaxPositions = 4096;

std::vector<int64_t> RandomPositions(int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> positions(tokens);
  for (auto& p : positions) p = std::uniform_int_distribution<int64_t>(0, kMaxPositions - 1)(rng);
  positions[0] = 0;
  positions.back() = kMaxPositions - 1;
  return positions;
}

// Qwen3-Next (16/2 heads of 256, rotary 64) at 1 to 70 tokens; a rotary part narrower than a warp
// with head_dim not a multiple of 32; an odd head_dim (allowed: only rotary_dim must be even);
// full rotation through the partial entry point.
const std::vector<PartialRopeShape> kPartialRopeShapes = {{1, 16, 2, 256, 64},  {9, 16, 2, 256, 64},
                                                          {70, 16, 2, 256, 64}, {4, 3, 1, 40, 8},
                                                          {3, 2, 1, 15, 6},     {5, 4, 2, 64, 64}};

TEST_F(PartialRopeTest, QkNormPartialRopeMatchesCpu) {
  for (const auto& [tokens, nq, nkv, hd, rot] : kPartialRopeShapes) {
    std::vector<float> cache(kMaxPositions * rot);
    cpu::BuildRopeCache(1e7f, rot, kMaxPositions, cache.data());
    const auto positions = RandomPositions(tokens, 118);
    const float* d_cache = Upload(cache);
    const int64_t* d_positions = Upload(positions);
    const auto qn = RandomFloats(hd, 119);
    const auto kn = RandomFloats(hd, 120);
    for (bool with_norm : {true, false}) {
      // Packed qkv rows, as the QKV projection writes them; v and the padding must stay untouched.
      const int64_t stride = (nq + 2 * nkv) * hd + 2;
      auto qkv = RandomFloats(tokens * stride, 121, 2.0f);
      float* d_qkv = Upload(qkv);
      VAMP_ASSERT_OK(QkNormPartialRope(d_qkv, stride, d_qkv + nq * hd, stride, tokens, nq, nkv, hd,
                                       rot, with_norm ? Upload(qn) : nullptr,
                                       with_norm ? Upload(kn) : nullptr, 1e-6f, d_positions,
                                       d_cache, kMaxPositions, stream_));
      cpu::QkNormPartialRope(qkv.data(), stride, qkv.data() + nq * hd, stride, tokens, nq, nkv, hd,
                             rot, with_norm ? qn.data() : nullptr, with_norm ? kn.data() : nullptr,
                             1e-6f, positions.data(), cache.data(), kMaxPositions);
      ExpectClose(Download(d_qkv, qkv.size()), qkv, kElementwiseTol,
                  "QkNormPartialRope " + std::to_string(tokens) + " tokens, heads " +
                      std::to_string(nq) + "/" + std::to_string(nkv) + " dim " +
                      std::to_string(hd) + " rotary " + std::to_string(rot) +
                      (with_norm ? " norm" : " no norm"));
    }
  }
}

TEST_F(PartialRopeTest, QkNormPartialRopeBf16MatchesCpu) {
  for (const auto& [tokens, nq, nkv, hd, rot] : kPartialRopeShapes) {
    std::vector<float> cache(kMaxPositions * rot);
    cpu::BuildRopeCache(1e7f, rot, kMaxPositions, cache.data());
    const auto positions = RandomPositions(tokens, 122);
    const float* d_cache = Upload(cache);
    const int64_t* d_positions = Upload(positions);
    const auto qn = RandomFloats(hd, 123);
    const auto kn = RandomFloats(hd, 124);
    for (bool with_norm : {true, false}) {
      const int64_t q_stride = nq * hd + 3, k_stride = nkv * hd + 5;
      auto q = RandomBf16(tokens * q_stride, 125, 3.0f);
      auto k = RandomBf16(tokens * k_stride, 126, 3.0f);
      BFloat16* d_q = Upload(q);
      BFloat16* d_k = Upload(k);
      VAMP_ASSERT_OK(QkNormPartialRope(
          d_q, q_stride, d_k, k_stride, tokens, nq, nkv, hd, rot, with_norm ? Upload(qn) : nullptr,
          with_norm ? Upload(kn) : nullptr, 1e-6f, d_positions, d_cache, kMaxPositions, stream_));
      cpu::QkNormPartialRope(q.data(), q_stride, k.data(), k_stride, tokens, nq, nkv, hd, rot,
                             with_norm ? qn.data() : nullptr, with_norm ? kn.data() : nullptr,
                             1e-6f, positions.data(), cache.data(), kMaxPositions);
      const std::string what = std::to_string(tokens) + " tokens, heads " + std::to_string(nq) +
                               "/" + std::to_string(nkv) + " dim " + std::to_string(hd) +
                               " rotary " + std::to_string(rot) +
                               (with_norm ? " norm" : " no norm");
      ExpectBf16Close(Download(d_q, q.size()), q, "q " + what);
      ExpectBf16Close(Download(d_k, k.size()), k, "k " + what);
    }
  }
}

TEST_F(PartialRopeTest, FullRotaryDimIsQkNormRopeBitForBit) {
  const int64_t tokens = 6, nq = 32, nkv = 4, hd = 128, stride = (nq + 2 * nkv) * hd;
  std::vector<float> cache(kMaxPositions * hd);
  cpu::BuildRopeCache(1e6f, hd, kMaxPositions, cache.data());
  const float* d_cache = Upload(cache);
  const int64_t* d_positions = Upload(RandomPositions(tokens, 127));
  const float* d_qn = Upload(RandomFloats(hd, 128));
  const float* d_kn = Upload(RandomFloats(hd, 129));
  const auto qkv = RandomFloats(tokens * stride, 130, 2.0f);
  float* d_full = Upload(qkv);
  float* d_partial = Upload(qkv);
  VAMP_ASSERT_OK(QkNormRope(d_full, stride, d_full + nq * hd, stride, tokens, nq, nkv, hd, d_qn,
                            d_kn, 1e-6f, d_positions, d_cache, kMaxPositions, stream_));
  VAMP_ASSERT_OK(QkNormPartialRope(d_partial, stride, d_partial + nq * hd, stride, tokens, nq, nkv,
                                   hd, hd, d_qn, d_kn, 1e-6f, d_positions, d_cache, kMaxPositions,
                                   stream_));
  ExpectClose(Download(d_partial, qkv.size()), Download(d_full, qkv.size()), 0.0,
              "float32 partial == full");
  const auto qkv_b = RandomBf16(tokens * stride, 131, 2.0f);
  BFloat16* d_full_b = Upload(qkv_b);
  BFloat16* d_partial_b = Upload(qkv_b);
  VAMP_ASSERT_OK(QkNormRope(d_full_b, stride, d_full_b + nq * hd, stride, tokens, nq, nkv, hd, d_qn,
                            d_kn, 1e-6f, d_positions, d_cache, kMaxPositions, stream_));
  VAMP_ASSERT_OK(QkNormPartialRope(d_partial_b, stride, d_partial_b + nq * hd, stride, tokens, nq,
                                   nkv, hd, hd, d_qn, d_kn, 1e-6f, d_positions, d_cache,
                                   kMaxPositions, stream_));
  ExpectClose(Widen(Download(d_partial_b, qkv_b.size())), Widen(Download(d_full_b, qkv_b.size())),
              0.0, "bf16 partial == full");
}

TEST(PartialRopeArgsTest, BadRotaryDimsAndSizesAreRejected) {
  float* f = nullptr;
  BFloat16* b = nullptr;
  auto partial = [&](int64_t tokens, int64_t head_dim, int64_t rotary_dim) {
    return QkNormPartialRope(f, 0, f, 0, tokens, 1, 1, head_dim, rotary_dim, nullptr, nullptr,
                             1e-6f, nullptr, nullptr, 1, nullptr);
  };
  EXPECT_TRUE(absl::IsInvalidArgument(partial(1, 256, 63)));   // odd
  EXPECT_TRUE(absl::IsInvalidArgument(partial(1, 256, 0)));    // nothing to rotate
  EXPECT_TRUE(absl::IsInvalidArgument(partial(1, 256, 258)));  // wider than the head
  EXPECT_TRUE(absl::IsInvalidArgument(partial(-1, 256, 64)));
  EXPECT_TRUE(absl::IsInvalidArgument(QkNormPartialRope(
      b, 0, b, 0, 1, 1, 1, 256, 65, nullptr, nullptr, 1e-6f, nullptr, nullptr, 1, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(QkNormRope(f, 0, f, 0, 1, -1, 1, 128, nullptr, nullptr, 1e-6f,
                                                 nullptr, nullptr, 1, nullptr)));
  // Zero tokens: OK without touching the (null) pointers or the device.
  EXPECT_TRUE(partial(0, 256, 64).ok());
  EXPECT_TRUE(QkNormPartialRope(b, 0, b, 0, 0, 16, 2, 256, 64, nullptr, nullptr, 1e-6f, nullptr,
                                nullptr, 1, nullptr)
                  .ok());
}

}  // namespace
}  // namespace vamp::kernels::cuda
