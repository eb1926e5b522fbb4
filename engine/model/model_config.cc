#include "engine/model/model_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::json;

// Typed access to the fields of one config object; every error names the source and the field.
// A field that is absent or JSON null takes its default (HF writes null for unset options).
class Fields {
 public:
  Fields(const Json& object, absl::string_view source) : object_(object), source_(source) {}

  const Json* Get(absl::string_view name) const {
    auto it = object_.find(std::string(name));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Error(absl::string_view name, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", name, "' ", what));
  }

  // A required integer in [min, max].
  absl::StatusOr<int64_t> RequiredInt(absl::string_view name, int64_t min, int64_t max) const {
    if (Get(name) == nullptr) return Error(name, "is missing");
    return Int(name, 0, min, max);
  }

  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t default_value, int64_t min,
                              int64_t max) const {
    const Json* j = Get(name);
    if (j == nullptr) return default_value;
    int64_t v;
    if (!ToInt(*j, &v) || v < min || v > max) {
      return Error(
          name, absl::StrCat("must be an integer in [", min, ", ", max, "], got ", Abbreviate(*j)));
    }
    return v;
  }

  // A number in [min, max] (ints accepted).
  absl::StatusOr<double> Double(absl::string_view name, double default_value, double min,
                                double max) const {
    const Json* j = Get(name);
    if (j == nullptr) return default_value;
    if (!j->is_number() || !std::isfinite(j->get<double>()) || j->get<double>() < min ||
        j->get<double>() > max) {
      return Error(
          name, absl::StrCat("must be a number in [", min, ", ", max, "], got ", Abbreviate(*j)));
    }
    return j->get<double>();
  }

  absl::StatusOr<bool> Bool(absl::string_view name, bool default_value) const {
    const Json* j = Get(name);
    if (j == nullptr) return default_value;
    if (!j->is_boolean())
      return Error(name, absl::StrCat("must be true or false, got ", Abbreviate(*j)));
    return j->get<bool>();
  }

  absl::StatusOr<std::string> String(absl::string_view name,
                                     absl::string_view default_value) const {
    const Json* j = Get(name);
    if (j == nullptr) return std::string(default_value);
    if (!j->is_string()) return Error(name, absl::StrCat("must be a string, got ", Abbreviate(*j)));
    return j->get<std::string>();
  }

  // A list of strings, or nullopt when absent.
  absl::StatusOr<std::optional<std::vector<std::string>>> StringList(absl::string_view name) const {
    const Json* j = Get(name);
    if (j == nullptr) return std::nullopt;
    std::vector<std::string> out;
    if (j->is_array()) {
      for (const Json& e : *j) {
        if (!e.is_string()) break;
        out.push_back(e.get<std::string>());
      }
      if (out.size() == j->size()) return out;
    }
    return Error(name, absl::StrCat("must be a list of strings, got ", Abbreviate(*j)));
  }

  // An integer or a list of integers (HF allows both for eos_token_id), each in [min, max].
  absl::StatusOr<std::vector<int64_t>> IntOrIntList(absl::string_view name, int64_t min,
                                                    int64_t max) const {
    std::vector<int64_t> out;
    const Json* j = Get(name);
    if (j == nullptr) return out;
    auto bad = [&] {
      return Error(name, absl::StrCat("must be an integer or a list of integers in [", min, ", ",
                                      max, "], got ", Abbreviate(*j)));
    };
    if (j->is_array()) {
      for (const Json& e : *j) {
        int64_t v;
        if (!ToInt(e, &v) || v < min || v > max) return bad();
        out.push_back(v);
      }
      return out;
    }
    int64_t v;
    if (!ToInt(*j, &v) || v < min || v > max) return bad();
    out.push_back(v);
    return out;
  }

 private:
  static bool ToInt(const Json& j, int64_t* out) {
    if (j.is_number_unsigned()) {
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
      *out = static_cast<int64_t>(j.get<uint64_t>());
      return true;
    }
    if (j.is_number_integer()) {
      *out = j.get<int64_t>();
      return true;
    }
    return false;
  }

  // The value as JSON, cut short for messages.
  static std::string Abbreviate(const Json& j) {
    std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  }

  const Json& object_;
  std::string source_;
};

// Limits that catch nonsense values (and keep size arithmetic far from overflow) without
// excluding any real model.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 26;

// What differs between the Qwen3 MoE architectures in the fields they share: HF's defaults.
struct Qwen3Defaults {
  std::optional<int64_t> head_dim;  // nullopt: hidden_size / num_attention_heads
  bool norm_topk_prob = false;
};

// The fields qwen3_moe and qwen3_next share: sizes, attention, experts, norms, RoPE, tokens.
absl::Status ReadQwen3Common(const Fields& f, const Qwen3Defaults& defaults, ModelConfig* c) {
  VAMP_ASSIGN_OR_RETURN(c->vocab_size, f.RequiredInt("vocab_size", 1, kMaxVocab));
  VAMP_ASSIGN_OR_RETURN(c->hidden_size, f.RequiredInt("hidden_size", 1, kMaxDim));
  VAMP_ASSIGN_OR_RETURN(c->num_hidden_layers, f.RequiredInt("num_hidden_layers", 1, kMaxLayers));
  VAMP_ASSIGN_OR_RETURN(c->num_attention_heads, f.RequiredInt("num_attention_heads", 1, 4096));
  VAMP_ASSIGN_OR_RETURN(c->num_key_value_heads,
                        f.Int("num_key_value_heads", c->num_attention_heads, 1, 4096));
  if (c->num_attention_heads % c->num_key_value_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", c->num_key_value_heads, ") must divide num_attention_heads (",
                                c->num_attention_heads, ")"));
  }
  const int64_t default_head_dim =
      defaults.head_dim.value_or(c->hidden_size / c->num_attention_heads);
  VAMP_ASSIGN_OR_RETURN(c->head_dim, f.Int("head_dim", default_head_dim, 2, 4096));
  if (c->head_dim % 2 != 0) return f.Error("head_dim", "must be even (rotary embedding)");
  VAMP_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                        f.RequiredInt("moe_intermediate_size", 1, kMaxDim));
  VAMP_ASSIGN_OR_RETURN(c->num_experts, f.RequiredInt("num_experts", 1, 65536));
  VAMP_ASSIGN_OR_RETURN(c->num_experts_per_tok,
                        f.RequiredInt("num_experts_per_tok", 1, c->num_experts));
  VAMP_ASSIGN_OR_RETURN(c->norm_topk_prob, f.Bool("norm_topk_prob", defaults.norm_topk_prob));
  VAMP_ASSIGN_OR_RETURN(c->decoder_sparse_step,
                        f.Int("decoder_sparse_step", 1, 1, c->num_hidden_layers));
  VAMP_ASSIGN_OR_RETURN(std::vector<int64_t> mlp_only,
                        f.IntOrIntList("mlp_only_layers", 0, c->num_hidden_layers - 1));
  c->mlp_only_layers.assign(mlp_only.begin(), mlp_only.end());
  std::sort(c->mlp_only_layers.begin(), c->mlp_only_layers.end());
  c->mlp_only_layers.erase(std::unique(c->mlp_only_layers.begin(), c->mlp_only_layers.end()),
                           c->mlp_only_layers.end());
  bool any_dense = false;
  for (int l = 0; l < c->num_hidden_layers; ++l) any_dense |= !c->IsMoeLayer(l);
  VAMP_ASSIGN_OR_RETURN(c->intermediate_size, any_dense
                                                  ? f.RequiredInt("intermediate_size", 1, kMaxDim)
                                                  : f.Int("intermediate_size", 0, 0, kMaxDim));
  VAMP_ASSIGN_OR_RETURN(c->rms_norm_eps, f.Double("rms_norm_eps", 1e-6, 0.0, 1.0));
  VAMP_ASSIGN_OR_RETURN(c->max_position_embeddings,
                        f.Int("max_position_embeddings", 32768, 1, kMaxPositions));
  VAMP_ASSIGN_OR_RETURN(c->tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  VAMP_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu")
    return f.Error("hidden_act", absl::StrCat("'", act, "' is not supported (only 'silu')"));
  VAMP_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  if (attention_bias) return f.Error("attention_bias", "true is not supported");
  VAMP_ASSIGN_OR_RETURN(bool sliding, f.Bool("use_sliding_window", false));
  if (sliding) return f.Error("use_sliding_window", "true is not supported");

  // RoPE: `rope_theta` at the top level (transformers 4.x) or inside `rope_parameters` (5.x);
  // only the default (unscaled) rotary embedding is implemented.
  VAMP_ASSIGN_OR_RETURN(c->rope_theta, f.Double("rope_theta", 10000.0, 1e-3, 1e12));
  for (const char* scaling : {"rope_scaling", "rope_parameters"}) {
    const Json* rope = f.Get(scaling);
    if (rope == nullptr) continue;
    if (!rope->is_object()) return f.Error(scaling, "must be an object");
    Fields rf(*rope, absl::StrCat(scaling, " in config"));
    VAMP_ASSIGN_OR_RETURN(std::string type, rf.String("rope_type", "default"));
    if (const Json* t = rf.Get("type"); t != nullptr && t->is_string())
      type = t->get<std::string>();
    if (type != "default") {
      return f.Error(scaling,
                     absl::StrCat("rope type '", type, "' is not supported (only 'default')"));
    }
    VAMP_ASSIGN_OR_RETURN(c->rope_theta, rf.Double("rope_theta", c->rope_theta, 1e-3, 1e12));
  }

  VAMP_ASSIGN_OR_RETURN(std::vector<int64_t> bos, f.IntOrIntList("bos_token_id", 0, kMaxVocab));
  if (bos.size() > 1) return f.Error("bos_token_id", "must be a single integer");
  if (!bos.empty()) c->bos_token_id = bos[0];
  VAMP_ASSIGN_OR_RETURN(c->eos_token_ids, f.IntOrIntList("eos_token_id", 0, kMaxVocab));
  // transformers 5 writes "dtype", 4.x "torch_dtype".
  VAMP_ASSIGN_OR_RETURN(c->torch_dtype, f.String("torch_dtype", ""));
  if (c->torch_dtype.empty()) {
    VAMP_ASSIGN_OR_RETURN(c->torch_dtype, f.String("dtype", ""));
  }
  c->qk_norm = true;
  c->rotary_dim = c->head_dim;
  c->layer_types.assign(c->num_hidden_layers, LayerType::kFullAttention);
  return absl::OkStatus();
}

absl::Status ReadQwen3Moe(const Fields& f, ModelConfig* c) {
  return ReadQwen3Common(f, Qwen3Defaults{}, c);
}

// Qwen3NextConfig: the shared fields (HF defaults head_dim to 256 and norm_topk_prob to true),
// the layer layout, the partial rotary embedding, the shared expert and Gated DeltaNet's sizes.
// Sizes HF would default are required here (every released config writes them), so a truncated
// config fails naming the field instead of silently taking a 48-layer model's widths; the two
// exceptions follow HF: partial_rotary_factor (0.25, HF's default for configs that predate it)
// and linear_conv_kernel_dim (4).
absl::Status ReadQwen3Next(const Fields& f, ModelConfig* c) {
  VAMP_RETURN_IF_ERROR(
      ReadQwen3Common(f, Qwen3Defaults{.head_dim = 256, .norm_topk_prob = true}, c));
  c->attention_output_gate = true;

  // partial_rotary_factor at the top level (transformers 4.x) or in rope_parameters (5.x).
  VAMP_ASSIGN_OR_RETURN(double factor, f.Double("partial_rotary_factor", 0.25, 0.0, 1.0));
  if (const Json* rope = f.Get("rope_parameters"); rope != nullptr) {
    Fields rf(*rope, "rope_parameters in config");
    VAMP_ASSIGN_OR_RETURN(factor, rf.Double("partial_rotary_factor", factor, 0.0, 1.0));
  }
  // HF: int(head_dim * partial_rotary_factor), rotated in pairs.
  c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * factor);
  if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0) {
    return f.Error(
        "partial_rotary_factor",
        absl::StrCat("(", factor, ") times head_dim (", c->head_dim,
                     ") must give an even rotary dimension of at least 2, got ", c->rotary_dim));
  }

  // The layer layout: layer_types (as transformers 5 writes it) or full_attention_interval (the
  // released checkpoints); both given must agree. Neither is an error, not HF's interval of 4: a
  // layout is the one thing a reader must not guess.
  const int64_t L = c->num_hidden_layers;
  VAMP_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> names, f.StringList("layer_types"));
  const bool has_interval = f.Get("full_attention_interval") != nullptr;
  VAMP_ASSIGN_OR_RETURN(int64_t interval, f.Int("full_attention_interval", 4, 1, kMaxLayers));
  if (!names.has_value() && !has_interval) {
    return f.Error("layer_types",
                   "is missing (and so is 'full_attention_interval'): the layer layout is needed");
  }
  std::vector<LayerType> from_interval(L);
  for (int64_t l = 0; l < L; ++l) {
    from_interval[l] =
        (l + 1) % interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention;
  }
  if (names.has_value()) {
    if (static_cast<int64_t>(names->size()) != L) {
      return f.Error("layer_types",
                     absl::StrCat("has ", names->size(), " entries; num_hidden_layers is ", L));
    }
    for (int64_t l = 0; l < L; ++l) {
      const std::string& t = (*names)[l];
      if (t == "full_attention") {
        c->layer_types[l] = LayerType::kFullAttention;
      } else if (t == "linear_attention") {
        c->layer_types[l] = LayerType::kLinearAttention;
      } else {
        return f.Error("layer_types",
                       absl::StrCat("entry ", l, " is '", t,
                                    "'; only 'full_attention' and 'linear_attention' exist"));
      }
    }
    if (has_interval && c->layer_types != from_interval) {
      return f.Error("full_attention_interval",
                     absl::StrCat("(", interval, ") disagrees with 'layer_types'"));
    }
  } else {
    c->layer_types = from_interval;
  }

  VAMP_ASSIGN_OR_RETURN(c->shared_expert_intermediate_size,
                        f.RequiredInt("shared_expert_intermediate_size", 0, kMaxDim));
  bool any_linear = false;
  for (LayerType t : c->layer_types) any_linear |= t == LayerType::kLinearAttention;
  if (!any_linear) return absl::OkStatus();
  VAMP_ASSIGN_OR_RETURN(c->linear_num_key_heads, f.RequiredInt("linear_num_key_heads", 1, 4096));
  VAMP_ASSIGN_OR_RETURN(c->linear_num_value_heads,
                        f.RequiredInt("linear_num_value_heads", 1, 4096));
  if (c->linear_num_value_heads % c->linear_num_key_heads != 0) {
    return f.Error("linear_num_value_heads",
                   absl::StrCat("(", c->linear_num_value_heads,
                                ") must be a multiple of linear_num_key_heads (",
                                c->linear_num_key_heads, ")"));
  }
  VAMP_ASSIGN_OR_RETURN(c->linear_key_head_dim, f.RequiredInt("linear_key_head_dim", 1, 4096));
  VAMP_ASSIGN_OR_RETURN(c->linear_value_head_dim, f.RequiredInt("linear_value_head_dim", 1, 4096));
  VAMP_ASSIGN_OR_RETURN(c->linear_conv_kernel_dim, f.Int("linear_conv_kernel_dim", 4, 1, 64));
  return absl::OkStatus();
}

struct ArchitectureEntry {
  const char* hf_name;
  const char* model_type;
  Architecture architecture;
  absl::Status (*read)(const Fields&, ModelConfig*);
};

// The registry. Add an entry (and a CausalLm implementation) per new architecture.
constexpr ArchitectureEntry kArchitectures[] = {
    {"Qwen3MoeForCausalLM", "qwen3_moe", Architecture::kQwen3Moe, &ReadQwen3Moe},
    {"Qwen3NextForCausalLM", "qwen3_next", Architecture::kQwen3Next, &ReadQwen3Next},
};

}  // namespace

bool ModelConfig::IsMoeLayer(int layer) const {
  if (num_experts <= 0) return false;
  if (std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), layer)) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::LinearAttentionParamsPerLayer() const {
  if (linear_num_key_heads == 0) return 0;
  const int64_t key_dim = linear_num_key_heads * linear_key_head_dim;
  const int64_t value_dim = linear_num_value_heads * linear_value_head_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  return hidden_size * (conv_dim + value_dim)        // in_proj_qkvz
         + hidden_size * 2 * linear_num_value_heads  // in_proj_ba
         + conv_dim * linear_conv_kernel_dim         // conv1d
         + value_dim * hidden_size                   // out_proj
         + 2 * linear_num_value_heads                // A_log, dt_bias
         + linear_value_head_dim;                    // the gated norm
}

ModelShape ModelConfig::ToModelShape(int64_t dtype_bytes) const {
  ModelShape s;
  s.name = architecture_name;
  s.hidden_size = hidden_size;
  s.moe_intermediate_size = moe_intermediate_size;
  s.num_experts = num_experts;
  s.num_experts_per_token = num_experts_per_tok;
  s.num_layers = num_hidden_layers;
  bool any_dense = false;
  for (int l = 0; l < num_hidden_layers; ++l) {
    if (IsMoeLayer(l)) {
      s.moe_layers.push_back(l);
    } else {
      any_dense = true;
    }
    if (IsFullAttentionLayer(l)) s.attention_layers.push_back(l);
  }
  s.num_q_heads = num_attention_heads;
  s.num_kv_heads = num_key_value_heads;
  s.head_dim = head_dim;
  s.dtype_bytes = dtype_bytes;
  s.vocab_size = vocab_size;
  s.tie_word_embeddings = tie_word_embeddings;
  s.dense_intermediate_size = any_dense ? intermediate_size : 0;
  s.shared_expert_intermediate_size = shared_expert_intermediate_size;
  s.attention_output_gate = attention_output_gate;
  s.linear_attention_params_per_layer = LinearAttentionParamsPerLayer();
  s.linear_num_key_heads = linear_num_key_heads;
  s.linear_num_value_heads = linear_num_value_heads;
  s.linear_key_head_dim = linear_key_head_dim;
  s.linear_value_head_dim = linear_value_head_dim;
  s.linear_conv_kernel_dim = linear_conv_kernel_dim;
  return s;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const auto& e : kArchitectures) names.push_back(e.hf_name);
  return names;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  Json root = Json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  Fields f(root, source);
  const std::string supported = absl::StrJoin(SupportedArchitectures(), ", ");

  // Pick the architecture: the first registered name in `architectures`, else by `model_type`.
  VAMP_ASSIGN_OR_RETURN(std::string model_type, f.String("model_type", ""));
  const ArchitectureEntry* entry = nullptr;
  std::vector<std::string> listed;
  if (const Json* archs = f.Get("architectures"); archs != nullptr) {
    if (!archs->is_array()) return f.Error("architectures", "must be a list of strings");
    for (const Json& a : *archs) {
      if (!a.is_string()) return f.Error("architectures", "must be a list of strings");
      listed.push_back(a.get<std::string>());
    }
    for (const std::string& name : listed) {
      for (const auto& e : kArchitectures) {
        if (name == e.hf_name && entry == nullptr) entry = &e;
      }
    }
    if (entry == nullptr) {
      return f.Error("architectures",
                     absl::StrCat("names no supported architecture: [", absl::StrJoin(listed, ", "),
                                  "] (supported: ", supported, ")"));
    }
  } else {
    for (const auto& e : kArchitectures) {
      if (model_type == e.model_type) entry = &e;
    }
    if (entry == nullptr) {
      return f.Error(
          model_type.empty() ? "architectures" : "model_type",
          absl::StrCat(model_type.empty() ? "is missing"
                                          : absl::StrCat("'", model_type, "' is not supported"),
                       " (supported architectures: ", supported, ")"));
    }
  }
  if (!model_type.empty() && model_type != entry->model_type) {
    return f.Error("model_type",
                   absl::StrCat("'", model_type, "' does not match architecture ", entry->hf_name,
                                " (expected '", entry->model_type, "')"));
  }
  ModelConfig config;
  config.architecture = entry->architecture;
  config.architecture_name = entry->hf_name;
  config.model_type = entry->model_type;
  VAMP_RETURN_IF_ERROR(entry->read(f, &config));
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  struct stat st;
  std::string file = path;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model config '", file, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseModelConfig(text.str(), file);
}

}  // namespace vamp
