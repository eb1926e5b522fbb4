// Qwen3-Next (HF Qwen3NextForCausalLM) for one tensor-parallel rank, on the CPU reference kernels
// (float32).
//
// Decoder layer l, pre-norm, with a token mixer chosen by config.layer_types[l]:
//   h = RMSNorm1p(x);  x += FullAttention(h) or GatedDeltaNet(h)
//   h = RMSNorm1p(x);  x += MoE(h) + sigmoid(shared_gate . h) * SharedExpert(h)  (or a dense MLP
//                                                                                  in mlp_only
//                                                                                  layers)
// then the final RMSNorm1p and the LM head for the requested rows. RMSNorm1p is HF's
// Qwen3NextRMSNorm, y = RMSNorm(x) * (1 + w): the model stores 1 + w (evaluated in float32 as HF
// does) and runs the ordinary RMSNorm kernels, so the arithmetic is HF's.
//
// FullAttention (every full_attention_interval-th layer): q_proj yields, per head, the query and
// an output gate; q and k get a per-head RMSNorm1p, then the rotary embedding on their first
// rotary_dim elements (partial_rotary_factor); paged causal attention over the KV cache (only
// these layers have KV); the output is multiplied by sigmoid(gate) before o_proj.
//
// GatedDeltaNet (the other layers): one GEMM projects q, k, v, z, b and a (in_proj_qkvz and
// in_proj_ba with their rows reordered at load time from HF's per-key-head grouping into
// [q | k | v | z | b | a], so no activation is shuffled at run time); a causal depthwise conv1d
// with SiLU over the q, k and v channels (kernels/cpu/causal_conv1d.h); gates
// g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b); the gated delta rule with
// l2-normalised q and k and scale 1/sqrt(linear_key_head_dim) (kernels/cpu/gated_delta_rule.h);
// the gated RMSNorm weight * RMSNorm(o) * silu(z) per value head (plain weight, not 1 + w, as
// HF's Qwen3NextRMSNormGated); out_proj.
//
// The recurrence: a sequence with more than one new token in a step goes through the chunked
// form (chunks of kDeltaRuleChunkSize, as HF's prefill), a sequence with one new token (a decode
// step) through the recurrent form (HF's decode path). The two forms differ by float32 rounding
// only, so a prompt prefilled in one step and the same prompt fed token by token agree to the
// tests' tolerance, not bit for bit; a prefill split at multiples of kDeltaRuleChunkSize is
// bit-identical to one unsplit. Every other kernel keeps the engine's rule (a row's result
// never depends on the rest of the batch).
//
// Recurrent state: per sequence, for every linear-attention layer, the conv state
// ([K - 1, conv channels]) and the delta-rule state ([value heads, v_dim, k_dim]), float32, held
// by the model in slots (ReserveRecurrentStates; ForwardBatch::state_slots). A slot's states of
// all layers are contiguous (slot-major) so that one copy moves a sequence's whole state. The
// model counts the tokens each slot has absorbed and rejects a step that would continue a
// sequence from a slot holding another context (FailedPrecondition).
//
// Snapshots (prefix caching): a step copies a sequence's state after a given number of its tokens
// into a StateSnapshotView (ForwardBatch::state_captures), in the slot's layout, and
// RestoreRecurrentState puts such a copy into a slot, so a prefix-cache hit continues from it.
// The conv state at a point inside the step is the K - 1 conv inputs before it (from the step's
// projections, or the state before the step); the delta rule is run in two calls split at the
// point, the copy taken in between.
//
// Tensor parallelism: attention heads, KV heads, key-head groups of Gated DeltaNet (with their
// value heads), experts, the shared expert and the dense MLP are split across ranks; the partial
// sums after o_proj / out_proj and after the MLP are all-reduced. Embedding, routers, the shared
// expert's gate, norms and the LM head are replicated.
//
// Weights are read by HF's checkpoint names (model.layers.N.self_attn.*, .linear_attn.*,
// .mlp.gate.weight, .mlp.experts.* in either layout, .mlp.shared_expert.*,
// .mlp.shared_expert_gate.weight). The multi-token-prediction head (mtp.*) is not used: it only
// serves speculative decoding, which the engine does not do; its tensors are ignored.
#ifndef VAMP_ENGINE_MODEL_QWEN3_NEXT_H_
#define VAMP_ENGINE_MODEL_QWEN3_NEXT_H_

#include <memory>
#include <vector>

#include "engine/model/causal_lm.h"
#include "engine/model/feed_forward.h"
#include "engine/model/recurrent_state_slots.h"
#include "engine/model/weight_source.h"
#include "kernels/cpu/gated_delta_rule.h"

namespace vamp {

class Qwen3NextModel : public CausalLm {
 public:
  // Tokens per chunk of the chunked delta rule: HF's torch_chunk_gated_delta_rule and FLA's
  // kernels use 64, so prefill chunks line up with the reference's.
  static constexpr int64_t kDeltaRuleChunkSize = 64;

  // Reads this rank's shard of every weight from `source`; experts go to `experts`. Holds no
  // recurrent-state slots until ReserveRecurrentStates.
  static absl::StatusOr<std::unique_ptr<Qwen3NextModel>> Load(const ModelConfig& config,
                                                              const ParallelConfig& parallel,
                                                              WeightSource& source,
                                                              ExpertWeightSink& experts);

  const ModelConfig& config() const override { return config_; }
  const ParallelConfig& parallel() const override { return parallel_; }
  ExpertShardLayout expert_layout() const override { return expert_layout_; }
  int64_t kv_heads_per_rank() const override { return kv_heads_; }
  // The full-attention layers only: the linear-attention layers keep no KV.
  const std::vector<int>& attention_layers() const override { return attention_layers_; }
  const std::vector<int>& moe_layers() const override { return moe_layers_; }

  int64_t RecurrentStateFloatsPerSlot() const override { return slot_floats_; }
  absl::Status ReserveRecurrentStates(int64_t num_slots) override;
  int64_t num_state_slots() const { return slots_.num_slots(); }
  bool SupportsStateSnapshots() const override { return true; }
  // FailedPrecondition for a slot outside those reserved; InvalidArgument for num_tokens < 1 or a
  // view smaller than a slot.
  absl::Status RestoreRecurrentState(int32_t slot, const StateSnapshotView& from,
                                     int64_t num_tokens) override;

  // Also FailedPrecondition (before anything runs) when the model has linear-attention layers and
  // batch.state_slots is not one slot in range per sequence, distinct, each either starting its
  // sequence (context before the step == 0) or continuing the context its slot holds; and
  // InvalidArgument for state_captures that name a sequence twice or out of range, a point outside
  // [1, the sequence's step length], or a view smaller than a slot. A failure after the layers
  // started leaves the batch's slots usable only by sequences that start over, and the captures'
  // views holding no usable state.
  absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                       Communicator* comm, float* logits) override;

  // Norm weights are visited as applied: 1 + the checkpoint's value for the RMSNorm1p norms.
  void ForEachWeight(
      const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const override;

 private:
  struct Layer {
    bool full_attention = true;
    bool moe = true;
    std::vector<float> input_norm;  // [hidden], 1 + w
    std::vector<float> post_norm;   // [hidden], 1 + w
    // Full attention, rank-local heads.
    std::vector<float> qkv;     // [(2 * q_heads + 2 * kv_heads) * head_dim, hidden]:
                                // query heads | gate heads | k heads | v heads
    std::vector<float> o_proj;  // [hidden, q_heads * head_dim]
    std::vector<float> q_norm;  // [head_dim], 1 + w
    std::vector<float> k_norm;  // [head_dim], 1 + w
    // Gated DeltaNet, rank-local key heads (and their value heads).
    std::vector<float> in_proj;     // [conv_dim + value_dim + 2 * v_heads, hidden]: q | k | v |
                                    // z | b | a
    std::vector<float> conv;        // [conv_dim, kernel]
    std::vector<float> a_log;       // [v_heads]
    std::vector<float> dt_bias;     // [v_heads]
    std::vector<float> gated_norm;  // [v_dim] (plain weight)
    std::vector<float> out_proj;    // [hidden, value_dim]
    // MLP.
    std::vector<float> router;       // [num_experts, hidden] (MoE layers)
    std::vector<float> shared_w13;   // [2 * shared_inter, hidden] gate then up (MoE layers)
    std::vector<float> shared_w2;    // [hidden, shared_inter]
    std::vector<float> shared_gate;  // [hidden] (one output)
    std::vector<float> mlp_w13;      // [2 * inter, hidden] gate then up (dense layers)
    std::vector<float> mlp_w2;       // [hidden, inter] (dense layers)
    // Offset of this layer's conv state in a slot; its delta-rule state follows it.
    int64_t state_offset = 0;
  };

  Qwen3NextModel(const ModelConfig& config, const ParallelConfig& parallel);
  absl::Status LoadWeights(WeightSource& source, ExpertWeightSink& experts);
  absl::Status LoadFullAttention(int layer, WeightSource& source, Layer& L);
  absl::Status LoadLinearAttention(int layer, WeightSource& source, Layer& L);
  absl::Status LoadMlp(int layer, WeightSource& source, ExpertWeightSink& experts, Layer& L);

  // Runs the gated delta rule over rows [begin, end) of one sequence, from its slot's state
  // (`has_initial`) or from zero, by the form the run's length calls for (see the header).
  absl::Status DeltaRuleRun(kernels::cpu::GatedDeltaRuleArgs& args, int32_t begin, int32_t end,
                            uint8_t has_initial);
  // Writes layer `layer`'s conv state after `after` of sequence `seq`'s tokens of this step into
  // `to`: the K - 1 conv inputs before that point (rows of `proj`, or `history`, the sequence's
  // conv state before the step, for the inputs before the step).
  void CaptureConvState(int layer, const ForwardBatch& batch, int64_t seq, int64_t after,
                        const float* proj, const float* history, const StateSnapshotView& to);
  absl::Status FullAttention(int layer, const ForwardBatch& batch, const KvCacheView& kv);
  absl::Status LinearAttention(int layer, const ForwardBatch& batch);
  absl::Status Mlp(int layer, int64_t num_tokens, ExpertWeights* experts);

  ModelConfig config_;
  ParallelConfig parallel_;
  // Full attention, rank-local.
  int64_t q_heads_ = 0;
  int64_t kv_heads_ = 0;
  int64_t first_q_head_ = 0;
  int64_t first_kv_head_ = 0;
  // Gated DeltaNet, rank-local.
  int64_t k_heads_ = 0;  // key heads
  int64_t v_heads_ = 0;  // value heads
  int64_t first_k_head_ = 0;
  int64_t first_v_head_ = 0;
  int64_t key_dim_ = 0;    // k_heads_ * linear_key_head_dim
  int64_t value_dim_ = 0;  // v_heads_ * linear_value_head_dim
  int64_t conv_dim_ = 0;   // 2 * key_dim_ + value_dim_
  // MLP widths, rank-local.
  int64_t dense_inter_ = 0;
  int64_t shared_inter_ = 0;
  ExpertShardLayout expert_layout_;
  std::vector<int> attention_layers_;
  std::vector<int> moe_layers_;

  std::vector<float> embed_;       // [vocab, hidden]
  std::vector<float> lm_head_;     // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;  // [hidden], 1 + w
  std::vector<Layer> layers_;
  std::vector<float> rope_cache_;  // [max_position_embeddings, rotary_dim]

  // Recurrent state: [num_slots, slot_floats_]; per slot, per linear-attention layer, the conv
  // state [K - 1, conv_dim_] then the delta-rule state [v_heads_, v_dim, k_dim].
  int64_t slot_floats_ = 0;
  std::vector<float> states_;
  // What each slot holds; what the current step does with each sequence's state.
  RecurrentStateSlots slots_;
  RecurrentStepPlan plan_;
  // Per capture of the current step: the sequence's conv state before the step (a capture within
  // its first K - 1 tokens reads it after the conv has overwritten the slot).
  std::vector<float> conv_history_;
  std::vector<float> zero_row_;  // [conv_dim_]: the conv inputs before a sequence's start

  // Step workspaces, grown on demand (Forward is single-threaded by contract).
  std::vector<float> hidden_, residual_, proj_, conv_out_, gates_, mixer_out_, attn_ws_;
  std::vector<float> shared_out_, shared_logit_;
  FeedForward feed_forward_;
  std::vector<float> sel_hidden_, sel_residual_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_QWEN3_NEXT_H_
