#include "engine/memory/model_shape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace vamp {
namespace {

absl::Status CheckPositive(absl::string_view field, int64_t value) {
  if (value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model shape: ", field, " must be positive, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerList(absl::string_view field, const std::vector<int>& layers,
                            int64_t num_layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model shape: ", field, "[", i, "] = ", layers[i], " is outside [0, ", num_layers, ")"));
    }
    if (i > 0 && layers[i] <= layers[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("model shape: ", field,
                                                     " must be strictly ascending; entry ", i, " (",
                                                     layers[i], ") follows ", layers[i - 1]));
    }
  }
  return absl::OkStatus();
}

std::vector<int> Range(int begin, int end, int step) {
  std::vector<int> out;
  for (int i = begin; i < end; i += step) out.push_back(i);
  return out;
}

}  // namespace

absl::Status ModelShape::Validate() const {
  if (absl::Status s = CheckPositive("hidden_size", hidden_size); !s.ok()) return s;
  if (absl::Status s = CheckPositive("moe_intermediate_size", moe_intermediate_size); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPositive("num_experts", num_experts); !s.ok()) return s;
  if (absl::Status s = CheckPositive("num_experts_per_token", num_experts_per_token); !s.ok()) {
    return s;
  }
  if (num_experts_per_token > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("model shape: num_experts_per_token (",
                                                   num_experts_per_token, ") exceeds num_experts (",
                                                   num_experts, ")"));
  }
  if (absl::Status s = CheckPositive("num_layers", num_layers); !s.ok()) return s;
  if (absl::Status s = CheckPositive("num_q_heads", num_q_heads); !s.ok()) return s;
  if (absl::Status s = CheckPositive("num_kv_heads", num_kv_heads); !s.ok()) return s;
  if (absl::Status s = CheckPositive("head_dim", head_dim); !s.ok()) return s;
  if (absl::Status s = CheckPositive("dtype_bytes", dtype_bytes); !s.ok()) return s;
  if (num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model shape: num_q_heads (", num_q_heads,
                                                   ") must be a multiple of num_kv_heads (",
                                                   num_kv_heads, ")"));
  }
  if (moe_layers.empty()) {
    return absl::InvalidArgumentError("model shape: moe_layers is empty (not an MoE model)");
  }
  if (absl::Status s = CheckLayerList("moe_layers", moe_layers, num_layers); !s.ok()) return s;
  if (absl::Status s = CheckLayerList("attention_layers", attention_layers, num_layers); !s.ok()) {
    return s;
  }
  if (static_cast<int64_t>(moe_layers.size()) < num_layers && dense_intermediate_size <= 0) {
    return absl::InvalidArgumentError(
        "model shape: dense_intermediate_size must be positive when some layers are not MoE");
  }
  if (static_cast<int64_t>(attention_layers.size()) < num_layers &&
      linear_attention_params_per_layer <= 0) {
    return absl::InvalidArgumentError(
        "model shape: linear_attention_params_per_layer must be positive when some layers have "
        "no full attention");
  }
  if (vocab_size < 0 || dense_intermediate_size < 0 || shared_expert_intermediate_size < 0 ||
      linear_attention_params_per_layer < 0) {
    return absl::InvalidArgumentError(
        "model shape: vocab_size, dense_intermediate_size, shared_expert_intermediate_size and "
        "linear_attention_params_per_layer must not be negative");
  }
  if (linear_num_key_heads < 0 || linear_num_value_heads < 0 || linear_key_head_dim < 0 ||
      linear_value_head_dim < 0 || linear_conv_kernel_dim < 0) {
    return absl::InvalidArgumentError(
        "model shape: linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, "
        "linear_value_head_dim and linear_conv_kernel_dim must not be negative");
  }
  if (absl::Status s = CheckPositive("recurrent_state_dtype_bytes", recurrent_state_dtype_bytes);
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

int64_t ModelShape::ExpertW13BytesPerRank(int tp_size) const {
  return 2 * hidden_size * (moe_intermediate_size / tp_size) * dtype_bytes;
}

int64_t ModelShape::ExpertW2BytesPerRank(int tp_size) const {
  return hidden_size * (moe_intermediate_size / tp_size) * dtype_bytes;
}

int64_t ModelShape::KvHeadsPerRank(int tp_size) const {
  return std::max<int64_t>(1, num_kv_heads / tp_size);
}

int64_t ModelShape::KvBytesPerTokenPerRank(int tp_size) const {
  return static_cast<int64_t>(attention_layers.size()) * 2 * KvHeadsPerRank(tp_size) * head_dim *
         dtype_bytes;
}

bool ModelShape::IsMoeLayer(int layer) const {
  return std::binary_search(moe_layers.begin(), moe_layers.end(), layer);
}

int64_t ModelShape::RecurrentStateBytesPerSeqPerRank(int tp_size) const {
  const int64_t linear_layers = num_layers - static_cast<int64_t>(attention_layers.size());
  if (linear_layers <= 0 || linear_num_key_heads <= 0) return 0;
  const int64_t key_heads = linear_num_key_heads / tp_size;
  const int64_t value_heads = linear_num_value_heads / tp_size;
  const int64_t conv_channels =
      2 * key_heads * linear_key_head_dim + value_heads * linear_value_head_dim;
  const int64_t conv = std::max<int64_t>(0, linear_conv_kernel_dim - 1) * conv_channels;
  const int64_t delta = value_heads * linear_value_head_dim * linear_key_head_dim;
  return linear_layers * (conv + delta) * recurrent_state_dtype_bytes;
}

int64_t ModelShape::NonExpertWeightBytesPerRank(int tp_size) const {
  // Parameters split over ranks and parameters every rank holds whole, counted separately.
  const int64_t q_width = num_q_heads * head_dim * (attention_output_gate ? 2 : 1);
  int64_t split = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  int64_t replicated = hidden_size;  // final norm
  const int64_t kv_width_per_rank = KvHeadsPerRank(tp_size) * head_dim;
  const int64_t num_attention = static_cast<int64_t>(attention_layers.size());
  // q and o are split by heads; k and v hold the rank's own (possibly replicated) KV heads, so they
  // are counted per rank as they are.
  split += num_attention * (hidden_size * q_width + num_q_heads * head_dim * hidden_size);
  replicated += num_attention * 2 * hidden_size * kv_width_per_rank;
  replicated += num_attention * 2 * head_dim;  // q/k norms
  split += (num_layers - num_attention) * linear_attention_params_per_layer;
  const int64_t num_moe = static_cast<int64_t>(moe_layers.size());
  replicated += num_moe * num_experts * hidden_size;  // routers
  if (shared_expert_intermediate_size > 0) {
    split += num_moe * 3 * hidden_size * shared_expert_intermediate_size;
    replicated += num_moe * hidden_size;  // shared-expert gate
  }
  split += (num_layers - num_moe) * 3 * hidden_size * dense_intermediate_size;
  replicated += num_layers * 2 * hidden_size;  // input and post-attention norms
  return (split / tp_size + replicated) * dtype_bytes;
}

ModelShape Qwen3_30B_A3B_Shape() {
  ModelShape s;
  s.name = "Qwen3-30B-A3B";
  s.hidden_size = 2048;
  s.moe_intermediate_size = 768;
  s.num_experts = 128;
  s.num_experts_per_token = 8;
  s.num_layers = 48;
  s.moe_layers = Range(0, 48, 1);
  s.attention_layers = Range(0, 48, 1);
  s.num_q_heads = 32;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.dtype_bytes = 2;
  s.vocab_size = 151936;
  s.tie_word_embeddings = false;
  return s;
}

ModelShape Qwen3Next_80B_A3B_Shape() {
  ModelShape s;
  s.name = "Qwen3-Next-80B-A3B";
  s.hidden_size = 2048;
  s.moe_intermediate_size = 512;
  s.num_experts = 512;
  s.num_experts_per_token = 10;
  s.num_layers = 48;
  s.moe_layers = Range(0, 48, 1);
  s.attention_layers = Range(3, 48, 4);  // full_attention_interval = 4
  s.num_q_heads = 16;
  s.num_kv_heads = 2;
  s.head_dim = 256;
  s.dtype_bytes = 2;
  s.vocab_size = 151936;
  s.tie_word_embeddings = false;
  s.shared_expert_intermediate_size = 512;
  s.attention_output_gate = true;
  // Gated DeltaNet with 16 key heads and 32 value heads of 128: key_dim 2048, value_dim 4096.
  // in_proj_qkvz: hidden x (2 key_dim + 2 value_dim); in_proj_ba: hidden x (2 x 32 value heads);
  // depthwise conv over q, k, v channels (2 key_dim + value_dim) with kernel 4; out_proj:
  // value_dim x hidden; A_log and dt_bias per value head; gated RMSNorm over the head dim.
  constexpr int64_t kKeyDim = 16 * 128;
  constexpr int64_t kValueDim = 32 * 128;
  s.linear_attention_params_per_layer = 2048 * (2 * kKeyDim + 2 * kValueDim) + 2048 * 2 * 32 +
                                        (2 * kKeyDim + kValueDim) * 4 + kValueDim * 2048 + 2 * 32 +
                                        128;
  s.linear_num_key_heads = 16;
  s.linear_num_value_heads = 32;
  s.linear_key_head_dim = 128;
  s.linear_value_head_dim = 128;
  s.linear_conv_kernel_dim = 4;
  return s;
}

}  // namespace vamp
