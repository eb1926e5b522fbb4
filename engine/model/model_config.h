// The model's architecture and hyper-parameters, read from a HF `config.json`.
//
// Architectures are a registry (model_config.cc): each entry names the HF class
// (`architectures[0]`), its `model_type`, and the reader of its fields. A new architecture
// (Mixtral, Qwen3-Next) adds an entry and a model class (see causal_lm.h); the runner never
// changes. Unknown architectures, missing required fields, wrongly typed or out-of-range values and
// features the engine does not implement fail with an error naming the field.
#ifndef VAMP_ENGINE_MODEL_MODEL_CONFIG_H_
#define VAMP_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/memory/model_shape.h"

namespace vamp {

enum class Architecture {
  kQwen3Moe,   // HF Qwen3MoeForCausalLM (model_type "qwen3_moe")
  kQwen3Next,  // HF Qwen3NextForCausalLM (model_type "qwen3_next")
};

// The token mixer of a decoder layer.
enum class LayerType {
  kFullAttention,    // softmax attention over the paged KV cache
  kLinearAttention,  // Gated DeltaNet: per-sequence recurrent state, no KV
};

struct ModelConfig {
  Architecture architecture = Architecture::kQwen3Moe;
  std::string architecture_name;  // as in config.json, e.g. "Qwen3MoeForCausalLM"
  std::string model_type;         // e.g. "qwen3_moe"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  // Dense MLP width of the layers without experts (0 when every layer has experts).
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  // Renormalise the top-k router probabilities to sum to one.
  bool norm_topk_prob = false;
  // Layer i has experts unless listed in mlp_only_layers, and only when
  // (i + 1) % decoder_sparse_step == 0 (HF Qwen3MoE's rule).
  int64_t decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Per-head RMSNorm of q and k before RoPE (Qwen3).
  bool qk_norm = true;
  // Leading elements of each head the rotary embedding rotates: head_dim * partial_rotary_factor
  // (Qwen3-Next: 0.25 of 256 = 64); head_dim for qwen3_moe.
  int64_t rotary_dim = 0;
  // Per decoder layer. All full attention for qwen3_moe; for qwen3_next from `layer_types` or
  // `full_attention_interval` (layer i is full attention iff (i + 1) % interval == 0).
  std::vector<LayerType> layer_types;

  // ---- Qwen3-Next (zero / false for qwen3_moe) ----
  // q_proj also projects a sigmoid gate of the attention output (twice as wide).
  bool attention_output_gate = false;
  // Width of the sigmoid-gated shared expert of every MoE layer (0: none).
  int64_t shared_expert_intermediate_size = 0;
  // Gated DeltaNet: key heads (q and k) and value heads (a multiple of the key heads), their
  // dimensions, and the kernel size of the causal depthwise convolution over q, k and v.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  // The checkpoint's declared dtype ("bfloat16", "float32", ...); informational.
  std::string torch_dtype;

  bool IsMoeLayer(int layer) const;
  // Layers past layer_types (a config not made by the parser) count as full attention.
  bool IsFullAttentionLayer(int layer) const {
    return layer < 0 || static_cast<size_t>(layer) >= layer_types.size() ||
           layer_types[layer] == LayerType::kFullAttention;
  }
  // Parameters of one Gated DeltaNet layer (all ranks together); 0 without linear attention.
  int64_t LinearAttentionParamsPerLayer() const;
  // The memory layer's view of this model (engine/memory/model_shape.h) for weights and KV of
  // `dtype_bytes` per element.
  ModelShape ToModelShape(int64_t dtype_bytes) const;
};

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source = "config.json");
// Reads `<dir>/config.json`, or the file itself when `path` names a file.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// The HF architecture names the registry knows, for messages and --help.
std::vector<std::string> SupportedArchitectures();

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_MODEL_CONFIG_H_
