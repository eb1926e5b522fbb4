#include "kernels/cpu/gated_delta_rule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/gemm.h"

namespace vamp::kernels::cpu {
namespace {

absl::Status Check(const GatedDeltaRuleArgs& a, int64_t chunk_size) {
  if (absl::Status s = CheckGatedDeltaRuleShapes(a, chunk_size); !s.ok()) return s;
  const int64_t need = GatedDeltaRuleWorkspaceFloats(chunk_size, a.k_dim, a.v_dim);
  if (a.workspace == nullptr || a.workspace_floats < need) {
    return absl::InvalidArgumentError(absl::StrCat("gated delta rule: workspace of ",
                                                   a.workspace_floats, " floats; ", need,
                                                   " needed"));
  }
  for (int64_t i = 0; i < a.num_seqs; ++i) {
    if (a.query_start_loc[i + 1] < a.query_start_loc[i] || a.state_slots[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("gated delta rule: sequence ", i,
                                                     " has a negative length or state slot ",
                                                     a.state_slots[i]));
    }
  }
  return absl::OkStatus();
}

// dst = scale * src / sqrt(sum src^2 + eps) when normalising, else scale * src (scale 1 for k).
void NormalizeHead(const float* src, int64_t dim, bool l2norm, float scale, float* dst) {
  const float inv = l2norm ? 1.0f / std::sqrt(Dot(src, src, dim) + kDeltaRuleL2NormEps) : 1.0f;
  for (int64_t i = 0; i < dim; ++i) dst[i] = (src[i] * inv) * scale;
}

// The state of value head h of sequence i, zeroed when the sequence starts here.
float* HeadState(const GatedDeltaRuleArgs& a, int64_t i, int64_t h) {
  float* s = a.states + a.state_slots[i] * a.state_slot_stride + h * a.v_dim * a.k_dim;
  if (a.has_initial_state != nullptr && a.has_initial_state[i] == 0) {
    for (int64_t e = 0; e < a.v_dim * a.k_dim; ++e) s[e] = 0.0f;
  }
  return s;
}

}  // namespace

absl::Status CheckGatedDeltaRuleShapes(const GatedDeltaRuleArgs& a, int64_t chunk_size) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("gated delta rule: ", parts...));
  };
  if (a.num_k_heads < 1 || a.num_v_heads < 1 || a.k_dim < 1 || a.v_dim < 1) {
    return bad("num_k_heads ", a.num_k_heads, ", num_v_heads ", a.num_v_heads, ", k_dim ", a.k_dim,
               " and v_dim ", a.v_dim, " must be positive");
  }
  if (a.num_v_heads % a.num_k_heads != 0) {
    return bad("num_v_heads ", a.num_v_heads, " is not a multiple of num_k_heads ", a.num_k_heads);
  }
  if (chunk_size < 1) return bad("chunk_size ", chunk_size, " must be positive");
  if (a.state_slot_stride < a.num_v_heads * a.v_dim * a.k_dim) {
    return bad("state_slot_stride ", a.state_slot_stride, " is below num_v_heads * v_dim * k_dim");
  }
  return absl::OkStatus();
}

int64_t GatedDeltaRuleWorkspaceFloats(int64_t chunk_size, int64_t k_dim, int64_t v_dim) {
  // Normalised q and k, the deltas u, the log decays, their cumulative sums and the decays to one
  // token, of one chunk.
  return chunk_size * (2 * k_dim + v_dim + 3);
}

absl::Status GatedDeltaRuleRecurrent(const GatedDeltaRuleArgs& a) {
  if (absl::Status s = Check(a, 1); !s.ok()) return s;
  const int64_t dk = a.k_dim, dv = a.v_dim, group = a.num_v_heads / a.num_k_heads;
  float* qn = a.workspace;
  float* kn = qn + dk;
  for (int64_t i = 0; i < a.num_seqs; ++i) {
    const int64_t begin = a.query_start_loc[i], end = a.query_start_loc[i + 1];
    if (begin == end) continue;
    for (int64_t h = 0; h < a.num_v_heads; ++h) {
      const int64_t kh = h / group;
      float* S = HeadState(a, i, h);
      for (int64_t t = begin; t < end; ++t) {
        NormalizeHead(a.q + t * a.q_stride + kh * dk, dk, a.l2norm_qk, a.scale, qn);
        NormalizeHead(a.k + t * a.k_stride + kh * dk, dk, a.l2norm_qk, 1.0f, kn);
        const float decay = std::exp(a.g[t * a.g_stride + h]);
        const float beta = a.beta[t * a.beta_stride + h];
        const float* v = a.v + t * a.v_stride + h * dv;
        float* o = a.out + t * a.out_stride + h * dv;
        for (int64_t j = 0; j < dv; ++j) {
          float* row = S + j * dk;  // column j of S
          for (int64_t e = 0; e < dk; ++e) row[e] *= decay;
          const float delta = (v[j] - Dot(row, kn, dk)) * beta;
          for (int64_t e = 0; e < dk; ++e) row[e] += kn[e] * delta;
          o[j] = Dot(row, qn, dk);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GatedDeltaRuleChunked(const GatedDeltaRuleArgs& a, int64_t chunk_size) {
  if (absl::Status s = Check(a, chunk_size); !s.ok()) return s;
  const int64_t dk = a.k_dim, dv = a.v_dim, group = a.num_v_heads / a.num_k_heads;
  float* qn = a.workspace;           // [chunk, dk]
  float* kn = qn + chunk_size * dk;  // [chunk, dk]
  float* u = kn + chunk_size * dk;   // [chunk, dv]
  float* G = u + chunk_size * dv;    // [chunk] cumulative log decays
  float* lg = G + chunk_size;        // [chunk] log decays
  float* D = lg + chunk_size;        // [chunk] decays from each token to one
  for (int64_t i = 0; i < a.num_seqs; ++i) {
    const int64_t begin = a.query_start_loc[i], end = a.query_start_loc[i + 1];
    if (begin == end) continue;
    for (int64_t h = 0; h < a.num_v_heads; ++h) {
      const int64_t kh = h / group;
      float* S = HeadState(a, i, h);  // [dv, dk]: row j = column j of S
      for (int64_t c0 = begin; c0 < end; c0 += chunk_size) {
        const int64_t len = std::min(chunk_size, end - c0);
        float cumulative = 0.0f;
        for (int64_t t = 0; t < len; ++t) {
          const int64_t row = c0 + t;
          NormalizeHead(a.q + row * a.q_stride + kh * dk, dk, a.l2norm_qk, a.scale, qn + t * dk);
          NormalizeHead(a.k + row * a.k_stride + kh * dk, dk, a.l2norm_qk, 1.0f, kn + t * dk);
          lg[t] = a.g[row * a.g_stride + h];
          cumulative += lg[t];
          G[t] = cumulative;
        }
        // decay[s] = exp(g_{s+1} + ... + g_t) for s <= t, summed from t down: never the
        // difference of two cumulative sums, whose float32 rounding grows with the chunk.
        auto decays_to = [&](int64_t t) {
          float sum = 0.0f;
          D[t] = 1.0f;
          for (int64_t s = t - 1; s >= 0; --s) {
            sum += lg[s + 1];
            D[s] = std::exp(sum);
          }
        };
        // The deltas, by forward substitution (u_s for s < t are final when u_t is computed).
        for (int64_t t = 0; t < len; ++t) {
          const float beta = a.beta[(c0 + t) * a.beta_stride + h];
          const float decay = std::exp(G[t]);
          const float* v = a.v + (c0 + t) * a.v_stride + h * dv;
          const float* kt = kn + t * dk;
          float* ut = u + t * dv;
          decays_to(t);
          for (int64_t j = 0; j < dv; ++j) ut[j] = beta * (v[j] - decay * Dot(S + j * dk, kt, dk));
          for (int64_t s = 0; s < t; ++s) {
            const float coeff = beta * D[s] * Dot(kt, kn + s * dk, dk);
            const float* us = u + s * dv;
            for (int64_t j = 0; j < dv; ++j) ut[j] -= coeff * us[j];
          }
        }
        // Outputs: the decayed initial state's read-out plus the chunk's own contributions.
        for (int64_t t = 0; t < len; ++t) {
          const float decay = std::exp(G[t]);
          const float* qt = qn + t * dk;
          float* o = a.out + (c0 + t) * a.out_stride + h * dv;
          decays_to(t);
          for (int64_t j = 0; j < dv; ++j) o[j] = decay * Dot(S + j * dk, qt, dk);
          for (int64_t s = 0; s <= t; ++s) {
            const float coeff = D[s] * Dot(qt, kn + s * dk, dk);
            const float* us = u + s * dv;
            for (int64_t j = 0; j < dv; ++j) o[j] += coeff * us[j];
          }
        }
        // The state after the chunk.
        const float state_decay = std::exp(G[len - 1]);
        for (int64_t e = 0; e < dv * dk; ++e) S[e] *= state_decay;
        decays_to(len - 1);
        for (int64_t s = 0; s < len; ++s) {
          const float w = D[s];
          const float* ks = kn + s * dk;
          const float* us = u + s * dv;
          for (int64_t j = 0; j < dv; ++j) {
            const float f = w * us[j];
            float* row = S + j * dk;
            for (int64_t e = 0; e < dk; ++e) row[e] += ks[e] * f;
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

void GatedDeltaGates(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                     const float* a_log, const float* dt_bias, int64_t num_tokens,
                     int64_t num_heads, float* g, int64_t g_stride, float* beta,
                     int64_t beta_stride) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const float x = a[t * a_stride + h] + dt_bias[h];
      const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
      g[t * g_stride + h] = -std::exp(a_log[h]) * softplus;
      beta[t * beta_stride + h] = 1.0f / (1.0f + std::exp(-b[t * b_stride + h]));
    }
  }
}

}  // namespace vamp::kernels::cpu
