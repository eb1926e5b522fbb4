#include "kernels/cpu/norm.h"

#include <cmath>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/gemm.h"

namespace vamp::kernels::cpu {
namespace {

inline void NormalizeRow(const float* x, const float* weight, float eps, int64_t hidden,
                         float* out) {
  const float mean_square = Dot(x, x, hidden) / static_cast<float>(hidden);
  const float inv_rms = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t j = 0; j < hidden; ++j) out[j] = weight[j] * (x[j] * inv_rms);
}

// One group of RmsNormGated: the norm written to `out` first (so the gate multiplies the stored
// float32 norm), then gated in place. `out` may equal `x`.
inline void GatedGroup(const float* x, const float* z, const float* weight, float eps, int64_t dim,
                       float* out) {
  NormalizeRow(x, weight, eps, dim, out);
  for (int64_t j = 0; j < dim; ++j) out[j] = out[j] * (z[j] / (1.0f + std::exp(-z[j])));
}

}  // namespace

void RmsNorm(const float* x, int64_t x_stride, const float* weight, float eps, int64_t num_rows,
             int64_t hidden, float* out, int64_t out_stride) {
  for (int64_t i = 0; i < num_rows; ++i) {
    NormalizeRow(x + i * x_stride, weight, eps, hidden, out + i * out_stride);
  }
}

void RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                  const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                  int64_t group_dim, float* out, int64_t out_stride) {
  for (int64_t i = 0; i < num_rows; ++i) {
    for (int64_t g = 0; g < num_groups; ++g) {
      GatedGroup(x + i * x_stride + g * group_dim, z + i * z_stride + g * group_dim, weight, eps,
                 group_dim, out + i * out_stride + g * group_dim);
    }
  }
}

void RmsNormGated(const float* x, int64_t x_stride, const float* z, int64_t z_stride,
                  const float* weight, float eps, int64_t num_rows, int64_t num_groups,
                  int64_t group_dim, BFloat16* out, int64_t out_stride) {
  std::vector<float> group(group_dim);
  for (int64_t i = 0; i < num_rows; ++i) {
    for (int64_t g = 0; g < num_groups; ++g) {
      GatedGroup(x + i * x_stride + g * group_dim, z + i * z_stride + g * group_dim, weight, eps,
                 group_dim, group.data());
      ToBFloat16(absl::MakeConstSpan(group), out + i * out_stride + g * group_dim);
    }
  }
}

void FusedAddRmsNorm(float* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden) {
  for (int64_t i = 0; i < num_rows; ++i) {
    float* xr = x + i * x_stride;
    float* rr = residual + i * residual_stride;
    for (int64_t j = 0; j < hidden; ++j) rr[j] += xr[j];
    NormalizeRow(rr, weight, eps, hidden, xr);
  }
}

void FusedAddRmsNorm(BFloat16* x, int64_t x_stride, float* residual, int64_t residual_stride,
                     const float* weight, float eps, int64_t num_rows, int64_t hidden) {
  std::vector<float> normed(hidden);
  for (int64_t i = 0; i < num_rows; ++i) {
    BFloat16* xr = x + i * x_stride;
    float* rr = residual + i * residual_stride;
    for (int64_t j = 0; j < hidden; ++j) rr[j] += ToFloat(xr[j]);
    NormalizeRow(rr, weight, eps, hidden, normed.data());
    ToBFloat16(absl::MakeConstSpan(normed), xr);
  }
}

}  // namespace vamp::kernels::cpu
