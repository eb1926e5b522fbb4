#include "kernels/cpu/gating.h"

#include <cmath>

namespace vamp::kernels::cpu {
namespace {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void SigmoidGate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride,
                 int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* xr = x + r * x_stride;
    const float* gr = gate + r * gate_stride;
    for (int64_t c = 0; c < cols; ++c) xr[c] = xr[c] * Sigmoid(gr[c]);
  }
}

void AddSigmoidScaled(float* out, int64_t out_stride, const float* y, int64_t y_stride,
                      const float* gate, int64_t gate_stride, int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* o = out + r * out_stride;
    const float* yr = y + r * y_stride;
    const float s = Sigmoid(gate[r * gate_stride]);
    for (int64_t c = 0; c < cols; ++c) o[c] = o[c] + s * yr[c];
  }
}

}  // namespace vamp::kernels::cpu
