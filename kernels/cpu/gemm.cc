#include "kernels/cpu/gemm.h"

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

}  // namespace vamp::kernels::cpu
