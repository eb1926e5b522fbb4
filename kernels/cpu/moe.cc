#include "kernels/cpu/moe.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "kernels/cpu/gemm.h"

namespace vamp::kernels::cpu {
namespace {

// silu(g) * u, the one expression both SiluAndMul overloads evaluate.
inline float SiluMul(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// ExpertGemm for either element type: one Gemm (of that type) per expert with rows.
template <typename T>
void ExpertGemmT(const T* a, int64_t lda, const T* const* expert_weights, int64_t weight_offset,
                 int64_t ldw, const int32_t* expert_offsets, int64_t num_experts, T* c, int64_t ldc,
                 int64_t n, int64_t k) {
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = expert_offsets[e];
    const int64_t rows = expert_offsets[e + 1] - begin;
    if (rows == 0) continue;
    VAMP_CHECK(expert_weights[e] != nullptr) << "expert " << e << " has rows but no weights";
    Gemm(a + begin * lda, lda, expert_weights[e] + weight_offset, ldw, c + begin * ldc, ldc, rows,
         n, k);
  }
}

}  // namespace

void RouterTopK(const float* router_logits, int64_t logits_stride, int64_t num_tokens,
                int64_t num_experts, int64_t top_k, bool renormalize, int32_t* topk_ids,
                float* topk_weights) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits + t * logits_stride;
    float max_logit = -INFINITY;
    for (int64_t e = 0; e < num_experts; ++e) max_logit = std::fmax(max_logit, logits[e]);
    float denom = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) denom += std::exp(logits[e] - max_logit);
    int32_t* ids = topk_ids + t * top_k;
    float* weights = topk_weights + t * top_k;
    // Selection by repeated scans: top_k is small (<= 10 for the supported models), and the
    // comparison on logits picks exactly the experts of the largest probabilities.
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
        if (taken) continue;
        if (best < 0 || logits[e] > logits[best]) best = static_cast<int32_t>(e);
      }
      ids[j] = best;
      weights[j] = std::exp(logits[best] - max_logit) / denom;
    }
    if (renormalize) {
      float sum = 0.0f;
      for (int64_t j = 0; j < top_k; ++j) sum += weights[j];
      for (int64_t j = 0; j < top_k; ++j) weights[j] /= sum;
    }
  }
}

void MoePermute(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k, int64_t num_experts,
                int32_t* expert_offsets, int32_t* row_token, int32_t* pair_row) {
  const int64_t num_pairs = num_tokens * top_k;
  // expert_offsets[e + 1] = end of expert e's rows.
  for (int64_t e = 0; e <= num_experts; ++e) expert_offsets[e] = 0;
  for (int64_t p = 0; p < num_pairs; ++p) {
    VAMP_CHECK(topk_ids[p] >= 0 && topk_ids[p] < num_experts) << "expert id " << topk_ids[p];
    ++expert_offsets[topk_ids[p] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) expert_offsets[e + 1] += expert_offsets[e];
  // Walking the pairs backwards and filling each expert's rows from its end keeps (token, choice)
  // order within an expert and leaves expert_offsets[e + 1] at the START of expert e's rows.
  for (int64_t p = num_pairs - 1; p >= 0; --p) {
    const int32_t row = --expert_offsets[topk_ids[p] + 1];
    pair_row[p] = row;
    row_token[row] = static_cast<int32_t>(p / top_k);
  }
  for (int64_t e = 0; e < num_experts; ++e) expert_offsets[e] = expert_offsets[e + 1];
  expert_offsets[num_experts] = static_cast<int32_t>(num_pairs);
}

void ExpertGemm(const float* a, int64_t lda, const float* const* expert_weights,
                int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                int64_t num_experts, float* c, int64_t ldc, int64_t n, int64_t k) {
  ExpertGemmT(a, lda, expert_weights, weight_offset, ldw, expert_offsets, num_experts, c, ldc, n,
              k);
}

void SiluAndMul(const float* x, int64_t x_stride, int64_t num_rows, int64_t inter, float* out,
                int64_t out_stride) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* gate = x + r * x_stride;
    const float* up = gate + inter;
    float* o = out + r * out_stride;
    for (int64_t j = 0; j < inter; ++j) o[j] = SiluMul(gate[j], up[j]);
  }
}

void MoeUnpermute(const float* expert_out, int64_t expert_out_stride, const int32_t* pair_row,
                  const float* topk_weights, int64_t num_tokens, int64_t top_k, int64_t hidden,
                  float* out, int64_t out_stride) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* o = out + t * out_stride;
    for (int64_t d = 0; d < hidden; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const float w = topk_weights[t * top_k + j];
      const float* y = expert_out + pair_row[t * top_k + j] * expert_out_stride;
      for (int64_t d = 0; d < hidden; ++d) o[d] += w * y[d];
    }
  }
}

void ExpertGemm(const BFloat16* a, int64_t lda, const BFloat16* const* expert_weights,
                int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                int64_t num_experts, BFloat16* c, int64_t ldc, int64_t n, int64_t k) {
  ExpertGemmT(a, lda, expert_weights, weight_offset, ldw, expert_offsets, num_experts, c, ldc, n,
              k);
}

void SiluAndMul(const BFloat16* x, int64_t x_stride, int64_t num_rows, int64_t inter, BFloat16* out,
                int64_t out_stride) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const BFloat16* gate = x + r * x_stride;
    const BFloat16* up = gate + inter;
    BFloat16* o = out + r * out_stride;
    for (int64_t j = 0; j < inter; ++j)
      o[j] = ToBFloat16(SiluMul(ToFloat(gate[j]), ToFloat(up[j])));
  }
}

void MoeUnpermute(const BFloat16* expert_out, int64_t expert_out_stride, const int32_t* pair_row,
                  const float* topk_weights, int64_t num_tokens, int64_t top_k, int64_t hidden,
                  BFloat16* out, int64_t out_stride) {
  std::vector<float> acc(hidden);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t d = 0; d < hidden; ++d) acc[d] = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const float w = topk_weights[t * top_k + j];
      const BFloat16* y = expert_out + pair_row[t * top_k + j] * expert_out_stride;
      for (int64_t d = 0; d < hidden; ++d) acc[d] += w * ToFloat(y[d]);
    }
    BFloat16* o = out + t * out_stride;
    for (int64_t d = 0; d < hidden; ++d) o[d] = ToBFloat16(acc[d]);
  }
}

}  // namespace vamp::kernels::cpu
