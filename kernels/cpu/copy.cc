#include "kernels/cpu/copy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace vamp::kernels::cpu {
namespace {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);  // signed zero
  // Subnormal: value = mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
  return sign ? -magnitude : magnitude;
}

}  // namespace

void CopyRoutedExperts(const int32_t* expert_offsets, int64_t first_expert, int64_t num_experts,
                       const uint8_t* src, uint8_t* dst, int64_t expert_bytes,
                       uint64_t* copied_bytes) {
  for (int64_t e = std::max<int64_t>(0, first_expert); e < num_experts; ++e) {
    if (expert_offsets[e + 1] <= expert_offsets[e]) continue;
    const int64_t at = (e - first_expert) * expert_bytes;
    std::memcpy(dst + at, src + at, static_cast<size_t>(expert_bytes));
    if (copied_bytes != nullptr) *copied_bytes += static_cast<uint64_t>(expert_bytes);
  }
}

void GatherRows(const float* src, int64_t src_stride, const int32_t* row_index, int64_t num_rows,
                int64_t cols, float* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < num_rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + row_index[r] * src_stride, cols * sizeof(float));
  }
}

void GatherRows(const BFloat16* src, int64_t src_stride, const int32_t* row_index, int64_t num_rows,
                int64_t cols, BFloat16* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < num_rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + row_index[r] * src_stride, cols * sizeof(BFloat16));
  }
}

void Bf16ToFloat(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BitsToFloat(static_cast<uint32_t>(src[i]) << 16);
}

void Fp16ToFloat(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void FloatToBf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = FloatToBits(src[i]);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
      dst[i] = static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
      continue;
    }
    const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
    dst[i] = static_cast<uint16_t>((bits + rounding) >> 16);
  }
}

void FloatToFp16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = FloatToBits(src[i]);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) {  // NaN
      dst[i] = sign | 0x7E00u;
      continue;
    }
    const float magnitude = BitsToFloat(abs);
    if (magnitude >= 65520.0f) {  // rounds past the largest finite half (65504)
      dst[i] = sign | 0x7C00u;
      continue;
    }
    if (magnitude < 6.103515625e-05f) {  // below 2^-14: subnormal half, units of 2^-24
      // Scaling by 2^24 is exact; nearbyint rounds half to even in the default mode.
      dst[i] = sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
      continue;
    }
    // Normal: drop 13 mantissa bits with round-to-nearest-even, rebias the exponent 127 -> 15.
    const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
    dst[i] = sign | static_cast<uint16_t>((rounded >> 13) - (112u << 10));
  }
}

}  // namespace vamp::kernels::cpu
