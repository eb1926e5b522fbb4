#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rope.h"

namespace vamp::kernels::cuda {
namespace {

using internal::AsFloat;
using internal::FromFloat;

// One warp per (token, head): blockIdx.x is the token, blockIdx.y the group of kRopeWarps heads
// (q heads first, then k heads). A decode token's 36 heads then run on 9 SMs at once instead of
// one after another in one block.
constexpr int kRopeWarps = 4;

// T is the storage type of q and k (float or __nv_bfloat16); arithmetic is float32 throughout,
// and each element is stored once. Only the first rotary_dim elements of a head rotate (the cache
// row holds rotary_dim / 2 cos then rotary_dim / 2 sin); the rest are normalised when there is a
// weight and otherwise left unwritten. rotary_dim == head_dim is QkNormRope: the loop over the
// rotated pairs is then exactly the full-rotation kernel's and the pass-through loop is empty.
template <typename T>
__global__ void QkNormRopeKernel(T* q, int64_t q_stride, T* k, int64_t k_stride,
                                 int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                 int64_t rotary_dim, const float* q_norm_weight,
                                 const float* k_norm_weight, float eps, const int64_t* positions,
                                 const float* cos_sin_cache, int64_t max_positions) {
  const int64_t t = blockIdx.x;
  const int64_t pos = positions[t];
  if (pos < 0 || pos >= max_positions) return;
  const int64_t half = rotary_dim / 2;
  const float* cos = cos_sin_cache + pos * rotary_dim;
  const float* sin = cos + half;
  const int lane = threadIdx.x % 32;
  const int64_t h = int64_t{blockIdx.y} * kRopeWarps + threadIdx.x / 32;
  if (h < num_q_heads + num_kv_heads) {
    const bool is_q = h < num_q_heads;
    T* x = is_q ? q + t * q_stride + h * head_dim : k + t * k_stride + (h - num_q_heads) * head_dim;
    const float* w = is_q ? q_norm_weight : k_norm_weight;
    float inv_rms = 1.0f;
    if (w != nullptr) {
      float sum_sq = 0.0f;
      for (int64_t j = lane; j < head_dim; j += 32) {
        const float v = AsFloat(x[j]);
        sum_sq += v * v;
      }
      sum_sq = internal::WarpSum(sum_sq);  // all lanes have read x before any writes it
      inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(head_dim) + eps);
    }
    for (int64_t i = lane; i < half; i += 32) {
      float x1 = AsFloat(x[i]);
      float x2 = AsFloat(x[i + half]);
      if (w != nullptr) {
        x1 = w[i] * (x1 * inv_rms);
        x2 = w[i + half] * (x2 * inv_rms);
      }
      x[i] = FromFloat<T>(x1 * cos[i] - x2 * sin[i]);
      x[i + half] = FromFloat<T>(x2 * cos[i] + x1 * sin[i]);
    }
    if (w != nullptr) {
      for (int64_t j = rotary_dim + lane; j < head_dim; j += 32) {
        x[j] = FromFloat<T>(w[j] * (AsFloat(x[j]) * inv_rms));
      }
    }
  }
}

// Checks shared by both entry points, then the launch; rotary_dim is validated by the caller.
template <typename T>
absl::Status LaunchQkNormRope(T* q, int64_t q_stride, T* k, int64_t k_stride, int64_t num_tokens,
                              int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                              int64_t rotary_dim, const float* q_norm_weight,
                              const float* k_norm_weight, float eps, const int64_t* positions,
                              const float* cos_sin_cache, int64_t max_positions,
                              cudaStream_t stream, const char* name) {
  if (num_tokens < 0 || num_q_heads < 0 || num_kv_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": num_tokens ", num_tokens, ", heads ",
                                                   num_q_heads, " / ", num_kv_heads,
                                                   " must be non-negative"));
  }
  if (num_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_tokens ", num_tokens, " exceeds the grid"));
  }
  const int64_t head_groups = internal::CeilDiv(num_q_heads + num_kv_heads, kRopeWarps);
  if (head_groups > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", num_q_heads + num_kv_heads, " heads exceed the grid"));
  }
  if (num_tokens == 0 || head_groups == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(head_groups));
  QkNormRopeKernel<T><<<grid, kRopeWarps * 32, 0, stream>>>(
      q, q_stride, k, k_stride, num_q_heads, num_kv_heads, head_dim, rotary_dim, q_norm_weight,
      k_norm_weight, eps, positions, cos_sin_cache, max_positions);
  return internal::LaunchStatus(name);
}

absl::Status CheckHeadDim(int64_t head_dim) {
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("QkNormRope: head_dim ", head_dim, " is odd"));
  }
  return absl::OkStatus();
}

absl::Status CheckRotaryDim(int64_t head_dim, int64_t rotary_dim) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("QkNormPartialRope: rotary_dim ", rotary_dim,
                                                   " must be even, positive and at most head_dim ",
                                                   head_dim));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status QkNormRope(float* q, int64_t q_stride, float* k, int64_t k_stride, int64_t num_tokens,
                        int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                        const float* q_norm_weight, const float* k_norm_weight, float eps,
                        const int64_t* positions, const float* cos_sin_cache, int64_t max_positions,
                        cudaStream_t stream) {
  if (absl::Status s = CheckHeadDim(head_dim); !s.ok()) return s;
  return LaunchQkNormRope(q, q_stride, k, k_stride, num_tokens, num_q_heads, num_kv_heads, head_dim,
                          head_dim, q_norm_weight, k_norm_weight, eps, positions, cos_sin_cache,
                          max_positions, stream, "QkNormRopeKernel");
}

absl::Status QkNormRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                        int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                        int64_t head_dim, const float* q_norm_weight, const float* k_norm_weight,
                        float eps, const int64_t* positions, const float* cos_sin_cache,
                        int64_t max_positions, cudaStream_t stream) {
  if (absl::Status s = CheckHeadDim(head_dim); !s.ok()) return s;
  return LaunchQkNormRope(internal::AsDevice(q), q_stride, internal::AsDevice(k), k_stride,
                          num_tokens, num_q_heads, num_kv_heads, head_dim, head_dim, q_norm_weight,
                          k_norm_weight, eps, positions, cos_sin_cache, max_positions, stream,
                          "QkNormRopeKernel<bf16>");
}

absl::Status QkNormPartialRope(float* q, int64_t q_stride, float* k, int64_t k_stride,
                               int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                               const float* k_norm_weight, float eps, const int64_t* positions,
                               const float* cos_sin_cache, int64_t max_positions,
                               cudaStream_t stream) {
  if (absl::Status s = CheckRotaryDim(head_dim, rotary_dim); !s.ok()) return s;
  return LaunchQkNormRope(q, q_stride, k, k_stride, num_tokens, num_q_heads, num_kv_heads, head_dim,
                          rotary_dim, q_norm_weight, k_norm_weight, eps, positions, cos_sin_cache,
                          max_positions, stream, "QkNormPartialRopeKernel");
}

absl::Status QkNormPartialRope(BFloat16* q, int64_t q_stride, BFloat16* k, int64_t k_stride,
                               int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t rotary_dim, const float* q_norm_weight,
                               const float* k_norm_weight, float eps, const int64_t* positions,
                               const float* cos_sin_cache, int64_t max_positions,
                               cudaStream_t stream) {
  if (absl::Status s = CheckRotaryDim(head_dim, rotary_dim); !s.ok()) return s;
  return LaunchQkNormRope(internal::AsDevice(q), q_stride, internal::AsDevice(k), k_stride,
                          num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim,
                          q_norm_weight, k_norm_weight, eps, positions, cos_sin_cache,
                          max_positions, stream, "QkNormPartialRopeKernel<bf16>");
}

}  // namespace vamp::kernels::cuda
