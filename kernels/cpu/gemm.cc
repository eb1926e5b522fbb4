#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/lanes.h"

namespace vamp::kernels::cpu {
namespace {

using internal::DotTile;

// One or two rows of `a` against columns [j0, j1) of the output.
template <int R>
inline void Rows(const float* const* x, const float* w, int64_t ldw, float* const* out, int64_t j0,
                 int64_t j1, int64_t k) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const float* ws[4] = {w + j * ldw, w + (j + 1) * ldw, w + (j + 2) * ldw, w + (j + 3) * ldw};
    float* o[2] = {out[0] + j, out[R - 1] + j};
    DotTile<R, 4>(x, ws, k, o);
  }
  for (; j < j1; ++j) {
    const float* ws[1] = {w + j * ldw};
    float* o[2] = {out[0] + j, out[R - 1] + j};
    DotTile<R, 1>(x, ws, k, o);
  }
}

// Weight rows widened to float32 per pass of the bf16 GEMMs: bounds the scratch (64 x k floats)
// however large n is (the LM head has ~152k rows), and keeps the block cache-resident while every
// row of `a` passes over it.
constexpr int64_t kBf16WeightBlock = 64;

// The bf16 GEMMs: widen `a` once and `w` block by block, run the float32 Gemm (whose result per
// element depends only on k, never on strides or on which block a row sits in), then store.
template <typename Out>
void GemmBf16(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, Out* c, int64_t ldc,
              int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  std::vector<float> a_f(m * k);
  for (int64_t i = 0; i < m; ++i) ToFloat(absl::MakeConstSpan(a + i * lda, k), a_f.data() + i * k);
  const int64_t block = std::min(n, kBf16WeightBlock);
  std::vector<float> w_f(block * k);
  std::vector<float> c_f;
  if constexpr (!std::is_same_v<Out, float>) c_f.resize(m * block);
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t cols = std::min(block, n - j0);
    for (int64_t j = 0; j < cols; ++j) {
      ToFloat(absl::MakeConstSpan(w + (j0 + j) * ldw, k), w_f.data() + j * k);
    }
    if constexpr (std::is_same_v<Out, float>) {
      Gemm(a_f.data(), k, w_f.data(), k, c + j0, ldc, m, cols, k);
    } else {
      Gemm(a_f.data(), k, w_f.data(), k, c_f.data(), cols, m, cols, k);
      for (int64_t i = 0; i < m; ++i) {
        ToBFloat16(absl::MakeConstSpan(c_f.data() + i * cols, cols), c + i * ldc + j0);
      }
    }
  }
}

}  // namespace

float Dot(const float* x, const float* y, int64_t k) { return internal::InlineDot(x, y, k); }

// Compiled for AVX2 and for the baseline; the loader picks one at start-up (same results).
__attribute__((target_clones("avx2", "default"))) void Gemm(const float* a, int64_t lda,
                                                            const float* w, int64_t ldw, float* c,
                                                            int64_t ldc, int64_t m, int64_t n,
                                                            int64_t k) {
  // Blocks of weight rows stay in cache while the rows of `a` pass over them.
  constexpr int64_t kColBlock = 64;
  for (int64_t j0 = 0; j0 < n; j0 += kColBlock) {
    const int64_t j1 = j0 + kColBlock < n ? j0 + kColBlock : n;
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
      const float* x[2] = {a + i * lda, a + (i + 1) * lda};
      float* out[2] = {c + i * ldc, c + (i + 1) * ldc};
      Rows<2>(x, w, ldw, out, j0, j1, k);
    }
    if (i < m) {
      const float* x[1] = {a + i * lda};
      float* out[1] = {c + i * ldc};
      Rows<1>(x, w, ldw, out, j0, j1, k);
    }
  }
}

void Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, BFloat16* c, int64_t ldc,
          int64_t m, int64_t n, int64_t k) {
  GemmBf16(a, lda, w, ldw, c, ldc, m, n, k);
}

void Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, float* c, int64_t ldc,
          int64_t m, int64_t n, int64_t k) {
  GemmBf16(a, lda, w, ldw, c, ldc, m, n, k);
}

}  // namespace vamp::kernels::cpu
