#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "absl/types/span.h"
#include "common/logging.h"
#include "kernels/cpu/norm.h"

namespace vamp::kernels::cpu {
namespace {

// Rotates the first 2 * half elements of one head by the angles whose cos/sin start at `cs` (half
// entries each; half = rotary_dim / 2).
inline void RotateHead(float* x, const float* cs, int64_t half) {
  const float* cos = cs;
  const float* sin = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

void BuildRopeCache(float theta, int64_t rotary_dim, int64_t max_positions, float* cos_sin_cache) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // HF: inv_freq = 1.0 / (theta ** (arange(0, dim, 2).float() / dim)) in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float inv_freq = 1.0f / std::pow(theta, exponent);
    for (int64_t pos = 0; pos < max_positions; ++pos) {
      const float angle = static_cast<float>(pos) * inv_freq;
      cos_sin_cache[pos * rotary_dim + i] =
          static_cast<float>(std::cos(static_cast<double>(angle)));
      cos_sin_cache[pos * rotary_dim + half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

void QkNormPartialRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                       int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       int64_t rotary_dim, const float* q_norm_weight, const float* k_norm_weight,
                       float eps, const int64_t* positions, const float* cos_sin_cache,
                       int64_t max_positions) {
  VAMP_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim)
      << "rotary_dim " << rotary_dim << " for head_dim " << head_dim;
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = positions[t];
    VAMP_CHECK(pos >= 0 && pos < max_positions) << "position " << pos << " outside the rope cache";
    const float* cs = cos_sin_cache + pos * rotary_dim;
    for (int64_t h = 0; h < num_q_heads; ++h) {
      float* x = q + t * q_stride + h * head_dim;
      if (q_norm_weight != nullptr)
        RmsNorm(x, head_dim, q_norm_weight, eps, 1, head_dim, x, head_dim);
      RotateHead(x, cs, half);
    }
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      float* x = k + t * k_stride + h * head_dim;
      if (k_norm_weight != nullptr)
        RmsNorm(x, head_dim, k_norm_weight, eps, 1, head_dim, x, head_dim);
      RotateHead(x, cs, half);
    }
  }
}

void QkNormRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                const float* q_norm_weight, const float* k_norm_weight, float eps,
                const int64_t* positions, const float* cos_sin_cache, int64_t max_positions) {
  QkNormPartialRope(q, q_stride, k, k_stride, num_tokens, num_q_heads, num_kv_heads, head_dim,
                    head_dim, q_norm_weight, k_norm_weight, eps, positions, cos_sin_cache,
                    max_positions);
}

void QkNormPartialRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                       int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                       int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                       const float* k_norm_weight, float eps, const int64_t* positions,
                       const float* cos_sin_cache, int64_t max_positions) {
  // Checked here too, so that a bad rotary_dim fails even with no tokens (as the float kernel).
  VAMP_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim)
      << "rotary_dim " << rotary_dim << " for head_dim " << head_dim;
  // One token at a time through the float32 kernel: its arithmetic is per head, so widening a
  // token's heads into contiguous scratch changes nothing but where they sit.
  const int64_t q_width = num_q_heads * head_dim;
  const int64_t k_width = num_kv_heads * head_dim;
  std::vector<float> q_f(q_width);
  std::vector<float> k_f(k_width);
  for (int64_t t = 0; t < num_tokens; ++t) {
    BFloat16* qt = q + t * q_stride;
    BFloat16* kt = k + t * k_stride;
    ToFloat(absl::MakeConstSpan(qt, q_width), q_f.data());
    ToFloat(absl::MakeConstSpan(kt, k_width), k_f.data());
    QkNormPartialRope(q_f.data(), q_width, k_f.data(), k_width, 1, num_q_heads, num_kv_heads,
                      head_dim, rotary_dim, q_norm_weight, k_norm_weight, eps, positions + t,
                      cos_sin_cache, max_positions);
    ToBFloat16(absl::MakeConstSpan(q_f), qt);
    ToBFloat16(absl::MakeConstSpan(k_f), kt);
  }
}

void QkNormRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride, int64_t num_tokens,
                int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                const float* q_norm_weight, const float* k_norm_weight, float eps,
                const int64_t* positions, const float* cos_sin_cache, int64_t max_positions) {
  QkNormPartialRope(q, q_stride, k, k_stride, num_tokens, num_q_heads, num_kv_heads, head_dim,
                    head_dim, q_norm_weight, k_norm_weight, eps, positions, cos_sin_cache,
                    max_positions);
}

}  // namespace vamp::kernels::cpu
