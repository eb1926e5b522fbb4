// The gated delta rule, CPU reference (float32): the linear-attention recurrence of Qwen3-Next's
// Gated DeltaNet layers (HF torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule with
// use_qk_l2norm_in_kernel). Conventions: see kernels/cpu/gemm.h.
//
// Per value head h, with key head kh = h / (num_v_heads / num_k_heads) (each key head serves a
// group of consecutive value heads, as HF's repeat_interleave), a state S of [k_dim, v_dim] and,
// for each token t of a sequence:
//   q_t = scale * q[t, kh] / |q[t, kh]|,  k_t = k[t, kh] / |k[t, kh]|    (l2norm_qk; |x| =
//                                                                          sqrt(sum x^2 + 1e-6))
//   S   = exp(g[t, h]) * S                                               (decay, g <= 0)
//   u_t = beta[t, h] * (v[t, h] - S^T k_t)                               (the delta)
//   S   = S + k_t u_t^T
//   out[t, h] = S^T q_t
//
// Two forms compute it:
//   - GatedDeltaRuleRecurrent: token by token, exactly as written above (decode steps);
//   - GatedDeltaRuleChunked: chunks of chunk_size tokens (prefill). Within a chunk, with
//     G_t = g_0 + ... + g_t (cumulative log decay from the chunk's start) and S_0 the state before
//     it, the deltas solve the unit lower-triangular system
//       u_t = beta_t * (v_t - exp(G_t) S_0^T k_t) - sum_{s<t} beta_t exp(G_t - G_s) (k_t . k_s) u_s
//     by forward substitution, then
//       out_t = exp(G_t) S_0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s
//       S     = exp(G_last) S_0 + sum_s exp(G_last - G_s) k_s u_s^T.
//     This is the recurrence unrolled over the chunk (identical in exact arithmetic); every
//     exponent is <= 0, so nothing overflows. Each exp(G_t - G_s) is evaluated as
//     exp(g_{s+1} + ... + g_t), summed from t down, not as a difference of cumulative sums (HF's
//     way): with Qwen3-Next's strong decays |G| reaches hundreds within a chunk, and the float32
//     difference of two such sums carries ~1e-5 relative error (measured on a 4-layer random
//     model against a float64 transliteration of HF: 5e-5 scaled logit error that way, 2.5e-5 this
//     way, the same as the recurrent form). Chunks start at each sequence's first token of the
//     call (as HF and FLA do), so splitting a prefill at a multiple of chunk_size gives the same
//     bits as one call; other splits, and the recurrent form, differ by float32 rounding only.
//     The two forms agree to ~1e-7 absolute on unit-scale inputs (measured; the tests bound 2e-6).
//
// Both forms: sums over k_dim use Dot (kernels/cpu/gemm.h); sums over tokens run in ascending
// token order. A sequence's results depend only on its own tokens and state, never on the rest of
// the batch. q and k are normalised by one function shared by both forms.
//
// State layout, one slot per sequence (the runner's persistent-batch slot): value head h of slot
// s is [v_dim, k_dim] floats at states + s * state_slot_stride + h * v_dim * k_dim, i.e. S
// transposed (row j = column j of S), so that every product with k_t or q_t is a contiguous dot
// over k_dim. float32 always (HF keeps the recurrent state in float32 too).
#ifndef VAMP_KERNELS_CPU_GATED_DELTA_RULE_H_
#define VAMP_KERNELS_CPU_GATED_DELTA_RULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace vamp::kernels::cpu {

// The epsilon of the q/k l2 normalisation (HF l2norm's default, as FLA's).
inline constexpr float kDeltaRuleL2NormEps = 1e-6f;

struct GatedDeltaRuleArgs {
  // [num_tokens, num_k_heads * k_dim] (head kh at kh * k_dim; row strides q_stride, k_stride).
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  // [num_tokens, num_v_heads * v_dim].
  const float* v = nullptr;
  int64_t v_stride = 0;
  // [num_tokens, num_v_heads]: log of the per-token decay (<= 0) and the delta-rule step size.
  const float* g = nullptr;
  int64_t g_stride = 0;
  const float* beta = nullptr;
  int64_t beta_stride = 0;
  int64_t num_k_heads = 0;
  int64_t num_v_heads = 0;  // a multiple of num_k_heads
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  // l2-normalise q and k per head before use (HF use_qk_l2norm_in_kernel).
  bool l2norm_qk = true;
  // Multiplies the (normalised) query: 1 / sqrt(k_dim) in Qwen3-Next.
  float scale = 1.0f;
  // [num_seqs + 1]: sequence i owns rows [query_start_loc[i], query_start_loc[i + 1]).
  const int32_t* query_start_loc = nullptr;
  int64_t num_seqs = 0;
  // [num_seqs]: each sequence's state slot (distinct).
  const int32_t* state_slots = nullptr;
  // [num_seqs]: 0 = the sequence starts here from a zero state (the slot is not read); null =
  // every sequence continues from its state.
  const uint8_t* has_initial_state = nullptr;
  // The state pool (see the header comment); updated in place.
  float* states = nullptr;
  int64_t state_slot_stride = 0;
  // [num_tokens, num_v_heads * v_dim] (row stride out_stride); must not overlap the inputs.
  float* out = nullptr;
  int64_t out_stride = 0;
  // Scratch of at least GatedDeltaRuleWorkspaceFloats(...) floats.
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

// Scratch floats the forms need: the recurrent form is the chunked form's chunk_size == 1.
int64_t GatedDeltaRuleWorkspaceFloats(int64_t chunk_size, int64_t k_dim, int64_t v_dim);

// InvalidArgument (nothing written) for non-positive sizes, num_v_heads not a multiple of
// num_k_heads, chunk_size < 1, a state_slot_stride below num_v_heads * v_dim * k_dim, a negative
// slot, decreasing query_start_loc, or too small a workspace.
absl::Status GatedDeltaRuleRecurrent(const GatedDeltaRuleArgs& a);
// The checks of the above that read no per-sequence array and not the workspace (sizes, head
// ratio, chunk_size, state_slot_stride), shared with the CUDA twin, whose arrays are on the device.
absl::Status CheckGatedDeltaRuleShapes(const GatedDeltaRuleArgs& a, int64_t chunk_size);
absl::Status GatedDeltaRuleChunked(const GatedDeltaRuleArgs& a, int64_t chunk_size);

// The per-token gates of Gated DeltaNet from the projections a and b ([num_tokens, num_heads]
// each, row strides a_stride, b_stride) and the per-head parameters A_log and dt_bias
// ([num_heads]):
//   g[t, h]    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])   (softplus as torch: x > 20 ->
//                                                                    x, else log1p(exp(x)))
//   beta[t, h] = sigmoid(b[t, h]) = 1 / (1 + exp(-b[t, h])).
void GatedDeltaGates(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                     const float* a_log, const float* dt_bias, int64_t num_tokens,
                     int64_t num_heads, float* g, int64_t g_stride, float* beta,
                     int64_t beta_stride);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_GATED_DELTA_RULE_H_
