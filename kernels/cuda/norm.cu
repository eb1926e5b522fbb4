#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::AsFloat;
using internal::FromFloat;
using internal::Vec16;

// One block per row: hidden sizes of interest (64 .. 8192) fit a few elements per thread.
constexpr int kNormThreads = 256;

// T is the storage type of x and out (float or __nv_bfloat16); the residual, the weight and all
// arithmetic are float32. When `residual` is non-null: residual += x first, and the norm is of the
// updated residual.
template <typename T>
__global__ void RmsNormKernel(const T* x, int64_t x_stride, float* residual,
                              int64_t residual_stride, const float* weight, float eps,
                              int64_t hidden, T* out, int64_t out_stride) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_stride;
  float* rr = residual != nullptr ? residual + row * residual_stride : nullptr;
  if (rr != nullptr) {
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) rr[j] += AsFloat(xr[j]);
    // each thread re-reads only the residual elements it wrote: no barrier needed
  }
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = rr != nullptr ? rr[j] : AsFloat(xr[j]);
    sum_sq += v * v;
  }
  sum_sq = internal::BlockSum(sum_sq, scratch);  // barrier: all of x read before out is written
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  T* o = out + row * out_stride;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = rr != nullptr ? rr[j] : AsFloat(xr[j]);
    o[j] = FromFloat<T>(weight[j] * (v * inv_rms));
  }
}

// Chunks per thread of the register-resident kernel below: rows of up to 8,192 bfloat16 or 4,096
// float32 elements.
constexpr int kVecNormChunks = 4;

// The same row norm with 16-byte loads and stores, the row held in registers: x, the residual and
// the weight are all requested before the one reduction, so a row costs about one memory round
// trip instead of one per pass (a decode step's norms are one block each: latency, not bandwidth,
// is their cost). Thread t owns chunks t, t + kNormThreads, ... of kVec elements (internal::Vec16),
// at most kVecNormChunks of them. Preconditions (VecNormFits): hidden, the strides and the
// pointers are whole chunks. Each thread's sum of squares runs over its chunks in order before the
// block sum, so the result differs from RmsNormKernel's only in the order of that sum.

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormVecKernel(const T* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t hidden, T* out, int64_t out_stride) {
  constexpr int kVec = Vec16<T>::kVec;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_stride;
  float* rr = residual != nullptr ? residual + row * residual_stride : nullptr;
  float v[kVecNormChunks][kVec];
  float w[kVecNormChunks][kVec];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kVecNormChunks; ++c) {
    const int64_t j0 = (int64_t{c} * kNormThreads + threadIdx.x) * kVec;
    if (j0 >= hidden) break;
    Vec16<T>::Load(xr + j0, v[c]);
#pragma unroll
    for (int i = 0; i < kVec; i += 4) Vec16<float>::Load(weight + j0 + i, &w[c][i]);
    if (rr != nullptr) {
#pragma unroll
      for (int i = 0; i < kVec; i += 4) {
        float r[4];
        Vec16<float>::Load(rr + j0 + i, r);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[c][i + e] += r[e];
        Vec16<float>::Store(rr + j0 + i, &v[c][i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum_sq += v[c][i] * v[c][i];
  }
  sum_sq = internal::BlockSum(sum_sq, scratch);  // barrier: all of x read before out is written
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  T* o = out + row * out_stride;
#pragma unroll
  for (int c = 0; c < kVecNormChunks; ++c) {
    const int64_t j0 = (int64_t{c} * kNormThreads + threadIdx.x) * kVec;
    if (j0 >= hidden) break;
    float y[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = w[c][i] * (v[c][i] * inv_rms);
    Vec16<T>::Store(o + j0, y);
  }
}

// Whether RmsNormVecKernel takes these arguments: whole 16-byte chunks everywhere, and a row
// that fits the registers.
template <typename T>
bool VecNormFits(const T* x, int64_t x_stride, const float* residual, int64_t residual_stride,
                 const float* weight, int64_t hidden, const T* out, int64_t out_stride) {
  constexpr int64_t kVec = Vec16<T>::kVec;
  return hidden > 0 && hidden % kVec == 0 && hidden <= kNormThreads * kVecNormChunks * kVec &&
         x_stride % kVec == 0 && out_stride % kVec == 0 && internal::Aligned16(x) &&
         internal::Aligned16(out) && internal::Aligned16(weight) &&
         (residual == nullptr || (residual_stride % 4 == 0 && internal::Aligned16(residual)));
}

template <typename T>
absl::Status LaunchRmsNorm(const T* x, int64_t x_stride, float* residual, int64_t residual_stride,
                           const float* weight, float eps, int64_t num_rows, int64_t hidden, T* out,
                           int64_t out_stride, cudaStream_t stream, const char* name) {
  if (num_rows == 0) return absl::OkStatus();
  if (num_rows < 0 || num_rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_rows ", num_rows, " outside [0, 2^31)"));
  }
  if (VecNormFits(x, x_stride, residual, residual_stride, weight, hidden, out, out_stride)) {
    RmsNormVecKernel<T><<<static_cast<unsigned>(num_rows), kNormThreads, 0, stream>>>(
        x, x_stride, residual, residual_stride, weight, eps, hidden, out, out_stride);
  } else {
    RmsNormKernel<T><<<static_cast<unsigned>(num_rows), kNormThreads, 0, stream>>>(
        x, x_stride, residual, residual_stride, weight, eps, hidden, out, out_stride);
  }
  return internal::LaunchStatus(name);
}

// RmsNormGated: one warp per group (a Gated DeltaNet value head), kGatedNormWarps groups per
// block. A group of 128 is 4 elements a lane, so a warp reduction replaces the block reduction
// and its barriers, and a decode token's 32 heads spread over 4 blocks (SMs) rather than 1.
constexpr int kGatedNormWarps = 8;

// T is the storage type of out (float or __nv_bfloat16); x, z, the weight and all arithmetic are
// float32. Warp w of block b handles group b * kGatedNormWarps + w of the (num_rows x num_groups)
// groups in row-major order; a warp past the last group exits whole, so WarpSum's full mask holds.
template <typename T>
__global__ void RmsNormGatedKernel(const float* x, int64_t x_stride, const float* z,
                                   int64_t z_stride, const float* weight, float eps,
                                   int64_t num_groups, int64_t total_groups, int64_t group_dim,
                                   T* out, int64_t out_stride) {
  const int64_t group = int64_t{blockIdx.x} * kGatedNormWarps + threadIdx.x / 32;
  if (group >= total_groups) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = group / num_groups, offset = (group % num_groups) * group_dim;
  const float* xg = x + i * x_stride + offset;
  const float* zg = z + i * z_stride + offset;
  T* o = out + i * out_stride + offset;
  float sum_sq = 0.0f;
  for (int64_t j = lane; j < group_dim; j += 32) sum_sq += xg[j] * xg[j];
  sum_sq = internal::WarpSum(sum_sq);  // every lane has read the group before any overwrites it
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(group_dim) + eps);
  for (int64_t j = lane; j < group_dim; j += 32) {
    // The CPU twin's order: the normed value (weight * (x * inv_rms)), then times silu(z).
    const float normed = weight[j] * (xg[j] * inv_rms);
    const float zj = zg[j];
    o[j] = FromFloat<T>(normed * (zj / (1.0f + expf(-zj))));
  }
}

template <typename T>
absl::Status LaunchRmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                                const float* weight, float eps, int64_t num_rows,
                                int64_t num_groups, int64_t group_dim, T* out, int64_t out_stride,
                                cudaStream_t stream, const char* name) {
  if (num_rows < 0 || num_groups < 0 || group_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormGated: num_rows ", num_rows,
                                                   ", num_groups ", num_groups, ", group_dim ",
                                                   group_dim, " (group_dim must be positive)"));
  }
  if (num_rows == 0 || num_groups == 0) return absl::OkStatus();
  const int64_t max_blocks = std::numeric_limits<int32_t>::max();
  if (num_rows > max_blocks * kGatedNormWarps / num_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormGated: ", num_rows, " x ", num_groups, " groups exceed the grid"));
  }
  const int64_t total = num_rows * num_groups;
  RmsNormGatedKernel<T>
      <<<internal::CeilDiv(total, kGatedNormWarps), kGatedNormWarps * 32, 0, stream>>>(
          x, x_stride, z, z_stride, weight, eps, num_groups, total, group_dim, out, out_stride);
  return internal::LaunchStatus(name);
}

}  // namespace

absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps,
                     int64_t num_rows, int64_t hidden, float* out, int64_t out_stride,
                     cudaStream_t stream) {
  return LaunchRmsNorm<float>(x, x_stride, nullptr, 0, weight, eps, num_rows, hidden, out,
                              out_stride, stream, "RmsNorm");
}

absl::Status FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                             const float* weight, float eps, int64_t num_rows, int64_t hidden,
                             cudaStream_t stream) {
  return LaunchRmsNorm<float>(x, x_stride, residual, residual_stride, weight, eps, num_rows, hidden,
                              x, x_stride, stream, "FusedAddRmsNorm");
}

absl::Status FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual,
                             int64_t residual_stride, const float* weight, float eps,
                             int64_t num_rows, int64_t hidden, cudaStream_t stream) {
  __nv_bfloat16* xd = internal::AsDevice(x);
  return LaunchRmsNorm<__nv_bfloat16>(xd, x_stride, residual, residual_stride, weight, eps,
                                      num_rows, hidden, xd, x_stride, stream,
                                      "FusedAddRmsNorm<bf16>");
}

absl::Status RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                          const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                          int64_t group_dim, float* out, int64_t out_stride, cudaStream_t stream) {
  return LaunchRmsNormGated(x, x_stride, z, z_stride, weight, eps, num_rows, num_groups, group_dim,
                            out, out_stride, stream, "RmsNormGatedKernel");
}

absl::Status RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                          const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                          int64_t group_dim, BFloat16* out, int64_t out_stride,
                          cudaStream_t stream) {
  return LaunchRmsNormGated(x, x_stride, z, z_stride, weight, eps, num_rows, num_groups, group_dim,
                            internal::AsDevice(out), out_stride, stream,
                            "RmsNormGatedKernel<bf16>");
}

}  // namespace vamp::kernels::cuda
