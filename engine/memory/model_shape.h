// The shape of a Mixture-of-Experts model as far as memory planning needs it: how big the expert
// shards are, which layers hold experts and KV, and roughly how much the other weights weigh.
// Presets for the models in shared/DESIGN.md ("Model shapes"); the HF config.json reader fills the
// same struct for real checkpoints.
//
// Units: sizes in elements unless the name says bytes; layer indices are decoder-layer indices as
// in checkpoint tensor names (`model.layers.{i}`).
#ifndef VAMP_ENGINE_MEMORY_MODEL_SHAPE_H_
#define VAMP_ENGINE_MEMORY_MODEL_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace vamp {

struct ModelShape {
  std::string name;

  int64_t hidden_size = 0;
  // Per-expert intermediate size (full, before tensor-parallel sharding).
  int64_t moe_intermediate_size = 0;
  // Routed experts per MoE layer and experts selected per token.
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;

  int64_t num_layers = 0;
  // Decoder layers with a routed-expert MLP, ascending. The others have a dense MLP of
  // `dense_intermediate_size`.
  std::vector<int> moe_layers;
  // Decoder layers with full (softmax) attention, ascending; only these hold KV blocks. The others
  // use linear attention (Qwen3-Next's Gated DeltaNet) whose state is per request, not per token.
  std::vector<int> attention_layers;

  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Bytes per weight and per KV element (bf16: 2).
  int64_t dtype_bytes = 2;

  // --- Non-expert weights, for the memory plan's estimate of the rest of the model. ---
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  // Intermediate size of the dense MLP in non-MoE layers (0 when every layer is MoE).
  int64_t dense_intermediate_size = 0;
  // Shared expert per MoE layer (Qwen3-Next: 512, sigmoid-gated); 0 when there is none.
  int64_t shared_expert_intermediate_size = 0;
  // Qwen3-Next's attention projects a sigmoid output gate together with q (q_proj is twice as
  // wide).
  bool attention_output_gate = false;
  // Parameters of one linear-attention layer (all of them, before sharding); 0 when there are none.
  int64_t linear_attention_params_per_layer = 0;
  // Gated DeltaNet geometry (before sharding; 0 without linear attention), for the recurrent state
  // each sequence keeps per linear-attention layer: the conv state, (conv kernel - 1) inputs of the
  // q, k and v channels (2 key heads' worth + value heads), and the delta-rule state, one
  // [value dim, key dim] matrix per value head.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  // Bytes per recurrent-state element: float32, as HF keeps it and the CPU engine stores it.
  int64_t recurrent_state_dtype_bytes = 4;

  // Checks that sizes are positive, layer lists are sorted, unique and in range, top-k <= experts,
  // and heads divide as attention needs. Errors name the field.
  absl::Status Validate() const;

  // Bytes of one rank-local expert shard: w13 (gate and up, fused) then w2 (down), the intermediate
  // dimension split over `tp_size` ranks. Requires moe_intermediate_size % tp_size == 0.
  int64_t ExpertW13BytesPerRank(int tp_size) const;
  int64_t ExpertW2BytesPerRank(int tp_size) const;
  int64_t ExpertBytesPerRank(int tp_size) const {
    return ExpertW13BytesPerRank(tp_size) + ExpertW2BytesPerRank(tp_size);
  }
  // KV heads each rank stores: heads are split across ranks, and replicated when there are fewer
  // KV heads than ranks (as vLLM does).
  int64_t KvHeadsPerRank(int tp_size) const;
  // K and V bytes of one token over all attention layers on one rank.
  int64_t KvBytesPerTokenPerRank(int tp_size) const;
  // Estimate of the non-expert weights one rank holds: embeddings and LM head (vocab-parallel),
  // attention, linear attention, dense and shared-expert MLPs split over ranks; routers and norms
  // replicated. An estimate for planning; the loader knows the exact bytes.
  int64_t NonExpertWeightBytesPerRank(int tp_size) const;
  // Whether `layer` holds routed experts.
  bool IsMoeLayer(int layer) const;
  // Bytes of one sequence's recurrent state on one rank (key heads, with their value heads, split
  // over ranks): conv and delta-rule state of every linear-attention layer; 0 for a model without
  // linear attention. Per sequence and fixed: it does not grow with the sequence.
  int64_t RecurrentStateBytesPerSeqPerRank(int tp_size) const;
};

// Qwen3-30B-A3B (HF Qwen3MoeForCausalLM): 48 layers, all MoE and full attention; 128 experts,
// top-8; 32/4 heads of 128.
ModelShape Qwen3_30B_A3B_Shape();
// Qwen3-Next-80B-A3B: 48 MoE layers (512 experts, top-10, one shared expert), full attention in
// every fourth layer (16/2 heads of 256), Gated DeltaNet in the others.
ModelShape Qwen3Next_80B_A3B_Shape();

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_MODEL_SHAPE_H_
