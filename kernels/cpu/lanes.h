// Internal to kernels/cpu: the fixed-order dot product shared by the GEMM and attention kernels.
// Element p of a length-k reduction (below the largest multiple of kLanes) is accumulated in lane
// p % kLanes; the lanes are combined pairwise, then the tail is added in order. The lanes are a
// GCC vector type, so SSE (two registers per vector) and AVX2 (one) perform the same per-lane
// operations: results never depend on the instruction set or on inlining.
#ifndef VAMP_KERNELS_CPU_LANES_H_
#define VAMP_KERNELS_CPU_LANES_H_

#include <cstdint>
#include <cstring>

namespace vamp::kernels::cpu::internal {

constexpr int kLanes = 8;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes LoadLanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load
  return v;
}

inline float FinishDot(Lanes acc, const float* x, const float* y, int64_t k_main, int64_t k) {
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t p = k_main; p < k; ++p) s += x[p] * y[p];
  return s;
}

// out[r][c] = dot(x[r], w[c]) for an R x C tile: each loaded vector of x and w is used C and R
// times.
template <int R, int C>
inline void DotTile(const float* const* x, const float* const* w, int64_t k, float* const* out) {
  Lanes acc[R][C] = {};
  const int64_t k_main = k - k % kLanes;
  for (int64_t p = 0; p < k_main; p += kLanes) {
    Lanes wv[C];
    for (int c = 0; c < C; ++c) wv[c] = LoadLanes(w[c] + p);
    for (int r = 0; r < R; ++r) {
      const Lanes xv = LoadLanes(x[r] + p);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) out[r][c] = FinishDot(acc[r][c], x[r], w[c], k_main, k);
  }
}

inline float InlineDot(const float* x, const float* y, int64_t k) {
  float result;
  float* out = &result;
  DotTile<1, 1>(&x, &y, k, &out);
  return result;
}

}  // namespace vamp::kernels::cpu::internal

#endif  // VAMP_KERNELS_CPU_LANES_H_
