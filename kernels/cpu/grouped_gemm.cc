#include "kernels/cpu/grouped_gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/cpu/gemm.h"

namespace vamp::kernels::cpu {

absl::Status CheckGroupedGemmShape(const char* name, int64_t lda, int64_t weight_offset,
                                   int64_t ldw, int64_t num_experts, int64_t max_rows, int64_t ldc,
                                   int64_t out_cols, int64_t k) {
  if (num_experts < 0 || max_rows < 0 || out_cols < 0 || k < 0 || weight_offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": negative size (num_experts ", num_experts, ", max_rows ", max_rows,
                     ", columns ", out_cols, ", k ", k, ", weight_offset ", weight_offset, ")"));
  }
  if (lda < k || ldw < k || ldc < out_cols) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": strides shorter than rows (lda ", lda,
                                                   ", ldw ", ldw, " vs k ", k, "; ldc ", ldc,
                                                   " vs ", out_cols, " output columns)"));
  }
  return absl::OkStatus();
}

namespace {

// Weight rows widened to float32 per pass: bounds the scratch to 64 x k floats (x2 when fused)
// however large n is, and keeps the block cache-resident while the expert's rows pass over it.
constexpr int64_t kWeightBlock = 64;

// Checks everything the kernel relies on before anything is written, so an error leaves `c`
// untouched. `out_cols` is the output width (n, or inter when fused), `weight_rows` the rows of
// each W_e that are read.
absl::Status Validate(const char* name, const BFloat16* a, int64_t lda,
                      const BFloat16* const* expert_weights, int64_t weight_offset, int64_t ldw,
                      const int32_t* expert_offsets, int64_t num_experts, int64_t max_rows,
                      const BFloat16* c, int64_t ldc, int64_t out_cols, int64_t k) {
  if (absl::Status s = CheckGroupedGemmShape(name, lda, weight_offset, ldw, num_experts, max_rows,
                                             ldc, out_cols, k);
      !s.ok()) {
    return s;
  }
  if (num_experts == 0) return absl::OkStatus();
  if (expert_offsets == nullptr || expert_weights == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": null expert_offsets or expert_weights table"));
  }
  if (expert_offsets[0] < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expert_offsets[0] is ", expert_offsets[0], " (must be >= 0)"));
  }
  bool any_rows = false;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t rows = int64_t{expert_offsets[e + 1]} - expert_offsets[e];
    if (rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expert_offsets decrease at expert ",
                                                     e, " (", expert_offsets[e], " -> ",
                                                     expert_offsets[e + 1], ")"));
    }
    if (rows > 0 && expert_weights[e] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expert ", e, " has ", rows, " rows but no weights"));
    }
    any_rows |= rows > 0;
  }
  if (expert_offsets[num_experts] > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expert_offsets[", num_experts,
                                                   "] = ", expert_offsets[num_experts],
                                                   " exceeds max_rows ", max_rows));
  }
  if (any_rows && (a == nullptr || c == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null a or c with rows to compute"));
  }
  return absl::OkStatus();
}

// dst[i, :] = float(src[i, :k]) for i < rows; dst is dense [rows, k].
void Widen(const BFloat16* src, int64_t ld, int64_t rows, int64_t k, float* dst) {
  for (int64_t i = 0; i < rows; ++i) ToFloat(absl::MakeConstSpan(src + i * ld, k), dst + i * k);
}

// Both variants: out_cols = n (plain) or inter (fused; the up rows start at weight row inter).
template <bool kSiluMul>
absl::Status Run(const char* name, const BFloat16* a, int64_t lda,
                 const BFloat16* const* expert_weights, int64_t weight_offset, int64_t ldw,
                 const int32_t* expert_offsets, int64_t num_experts, int64_t max_rows, BFloat16* c,
                 int64_t ldc, int64_t out_cols, int64_t k) {
  if (absl::Status s = Validate(name, a, lda, expert_weights, weight_offset, ldw, expert_offsets,
                                num_experts, max_rows, c, ldc, out_cols, k);
      !s.ok()) {
    return s;
  }
  std::vector<float> a_f, gate_w, up_w, gate, up;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = expert_offsets[e];
    const int64_t rows = expert_offsets[e + 1] - begin;
    if (rows == 0 || out_cols == 0) continue;
    const BFloat16* w = expert_weights[e] + weight_offset;
    a_f.resize(rows * k);
    Widen(a + begin * lda, lda, rows, k, a_f.data());
    for (int64_t j0 = 0; j0 < out_cols; j0 += kWeightBlock) {
      const int64_t cols = std::min(kWeightBlock, out_cols - j0);
      gate_w.resize(cols * k);
      gate.resize(rows * cols);
      Widen(w + j0 * ldw, ldw, cols, k, gate_w.data());
      Gemm(a_f.data(), k, gate_w.data(), k, gate.data(), cols, rows, cols, k);
      if constexpr (kSiluMul) {
        up_w.resize(cols * k);
        up.resize(rows * cols);
        Widen(w + (out_cols + j0) * ldw, ldw, cols, k, up_w.data());
        Gemm(a_f.data(), k, up_w.data(), k, up.data(), cols, rows, cols, k);
        // The expression of cpu::SiluAndMul, on the unrounded float32 sums.
        for (int64_t i = 0; i < rows * cols; ++i) {
          gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        }
      }
      for (int64_t i = 0; i < rows; ++i) {
        ToBFloat16(absl::MakeConstSpan(gate.data() + i * cols, cols), c + (begin + i) * ldc + j0);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GroupedExpertGemm(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               int64_t max_rows, BFloat16* c, int64_t ldc, int64_t n, int64_t k) {
  return Run<false>("GroupedExpertGemm", a, lda, expert_weights, weight_offset, ldw, expert_offsets,
                    num_experts, max_rows, c, ldc, n, k);
}

absl::Status GroupedExpertGemmSiluMul(const BFloat16* a, int64_t lda,
                                      const BFloat16* const* expert_weights, int64_t weight_offset,
                                      int64_t ldw, const int32_t* expert_offsets,
                                      int64_t num_experts, int64_t max_rows, BFloat16* out,
                                      int64_t ldo, int64_t inter, int64_t k) {
  return Run<true>("GroupedExpertGemmSiluMul", a, lda, expert_weights, weight_offset, ldw,
                   expert_offsets, num_experts, max_rows, out, ldo, inter, k);
}

}  // namespace vamp::kernels::cpu
