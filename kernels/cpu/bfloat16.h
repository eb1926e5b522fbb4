// bfloat16 storage shared by the CPU reference kernels and their CUDA twins.
//
// A BFloat16 is the upper 16 bits of an IEEE-754 float32 (1 sign, 8 exponent, 7 mantissa bits):
// the same size, alignment and bit pattern as CUDA's __nv_bfloat16, so device code reinterprets
// `BFloat16*` as `__nv_bfloat16*` and host code needs no CUDA header. Kernels store bfloat16 and
// compute in float32; conversion to bfloat16 rounds to nearest, ties to even (as
// __float2bfloat16_rn), and keeps NaN a NaN.
#ifndef VAMP_KERNELS_CPU_BFLOAT16_H_
#define VAMP_KERNELS_CPU_BFLOAT16_H_

#include <cstdint>
#include <cstring>

#include "absl/types/span.h"

namespace vamp::kernels {

struct BFloat16 {
  uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2 && alignof(BFloat16) == 2, "BFloat16 must match __nv_bfloat16");

// Exact: every bfloat16 is a float32.
inline float ToFloat(BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), infinities and overflow to infinity as IEEE.
inline BFloat16 ToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

// Element-wise conversions; `out` holds in.size() elements.
inline void ToFloat(absl::Span<const BFloat16> in, float* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = ToFloat(in[i]);
}
inline void ToBFloat16(absl::Span<const float> in, BFloat16* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = ToBFloat16(in[i]);
}

}  // namespace vamp::kernels

#endif  // VAMP_KERNELS_CPU_BFLOAT16_H_
