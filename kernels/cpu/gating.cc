#include "kernels/cpu/gating.h"

#include <cmath>

namespace vamp::kernels::cpu {
namespace {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The one definition of each output element, shared by the float32 and bf16 kernels.
inline float Gated(float x, float gate) { return x * Sigmoid(gate); }
inline float AddScaled(float out, float s, float y) { return out + s * y; }

}  // namespace

void SigmoidGate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride,
                 int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* xr = x + r * x_stride;
    const float* gr = gate + r * gate_stride;
    for (int64_t c = 0; c < cols; ++c) xr[c] = Gated(xr[c], gr[c]);
  }
}

void AddSigmoidScaled(float* out, int64_t out_stride, const float* y, int64_t y_stride,
                      const float* gate, int64_t gate_stride, int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* o = out + r * out_stride;
    const float* yr = y + r * y_stride;
    const float s = Sigmoid(gate[r * gate_stride]);
    for (int64_t c = 0; c < cols; ++c) o[c] = AddScaled(o[c], s, yr[c]);
  }
}

void SigmoidGate(BFloat16* x, int64_t x_stride, const BFloat16* gate, int64_t gate_stride,
                 int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    BFloat16* xr = x + r * x_stride;
    const BFloat16* gr = gate + r * gate_stride;
    for (int64_t c = 0; c < cols; ++c) xr[c] = ToBFloat16(Gated(ToFloat(xr[c]), ToFloat(gr[c])));
  }
}

void AddSigmoidScaled(BFloat16* out, int64_t out_stride, const BFloat16* y, int64_t y_stride,
                      const float* gate, int64_t gate_stride, int64_t num_rows, int64_t cols) {
  for (int64_t r = 0; r < num_rows; ++r) {
    BFloat16* o = out + r * out_stride;
    const BFloat16* yr = y + r * y_stride;
    const float s = Sigmoid(gate[r * gate_stride]);
    for (int64_t c = 0; c < cols; ++c)
      o[c] = ToBFloat16(AddScaled(ToFloat(o[c]), s, ToFloat(yr[c])));
  }
}

}  // namespace vamp::kernels::cpu
