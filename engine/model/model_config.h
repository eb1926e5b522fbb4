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
  kQwen3Moe,  // HF Qwen3MoeForCausalLM (model_type "qwen3_moe")
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
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  // The checkpoint's declared dtype ("bfloat16", "float32", ...); informational.
  std::string torch_dtype;

  bool IsMoeLayer(int layer) const;
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
