#include "sim/calibration.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace vamp::sim {

int64_t SimModelShape::ExpertBytes() const {
  return 3LL * hidden * (moe_intermediate / tp_size) * dtype_bytes;
}

int64_t SimModelShape::KvBytesPerToken() const {
  return 2LL * num_kv_layers * KvHeadsPerRank() * head_dim * dtype_bytes;
}

namespace {

// Per rank, the weights of a layer's router (replicated) and shared expert (split), in elements.
int64_t MlpDenseElements(const SimModelShape& m) {
  const int64_t router = static_cast<int64_t>(m.hidden) * m.num_experts;
  const int64_t shared = 3LL * m.hidden * (m.shared_expert_intermediate / m.tp_size);
  return router + shared;
}

}  // namespace

int64_t SimModelShape::KvLayerDenseBytes() const {
  const int64_t q = static_cast<int64_t>(QHeadsPerRank()) * head_dim;
  const int64_t kv = static_cast<int64_t>(KvHeadsPerRank()) * head_dim;
  const int64_t q_proj = (attention_output_gate ? 2 : 1) * q;  // q and its output gate
  const int64_t attention = static_cast<int64_t>(hidden) * (q_proj + q + 2 * kv);  // q, o, k, v
  return (attention + MlpDenseElements(*this)) * dtype_bytes;
}

int64_t SimModelShape::LinearLayerDenseBytes() const {
  const int64_t key_width = static_cast<int64_t>(LinearKeyHeadsPerRank()) * linear_key_head_dim;
  const int64_t value_heads = LinearValueHeadsPerRank();
  const int64_t value_width = value_heads * linear_value_head_dim;
  const int64_t in_proj_qkvz = 2 * key_width + 2 * value_width;
  const int64_t in_proj_ba = 2 * value_heads;
  const int64_t projections = static_cast<int64_t>(hidden) * (in_proj_qkvz + in_proj_ba) +
                              value_width * hidden;  // out_proj
  return (projections + MlpDenseElements(*this)) * dtype_bytes;
}

int64_t SimModelShape::RecurrentStateBytesPerLayer() const {
  if (linear_value_heads == 0 || linear_conv_kernel == 0) return 0;
  const int64_t key_heads = LinearKeyHeadsPerRank();
  const int64_t value_heads = LinearValueHeadsPerRank();
  const int64_t conv_channels =
      2 * key_heads * linear_key_head_dim + value_heads * linear_value_head_dim;
  const int64_t floats = (linear_conv_kernel - 1) * conv_channels +
                         value_heads * linear_value_head_dim * linear_key_head_dim;
  return floats * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<Calibration> CalibrationPreset(const std::string& name) {
  Calibration c;
  if (name == "qwen3-30b-a3b") return c;
  if (name == "qwen3-next-80b-a3b-h100-tp2") {
    // The paper's H100 platform (Table I: 94 GiB H100 PCIe cards, i.e. H100 NVL with HBM3 at
    // 3.9 TB/s and 835 dense bf16 TFLOP/s against the H200's 4.8 TB/s and 989 TFLOP/s): the H200
    // throughputs scaled by those ratios, PCIe Gen5 pinned copies at 50 GB/s, and TP all-reduces
    // over PCIe.
    absl::StatusOr<Calibration> tp2 = CalibrationPreset("qwen3-next-80b-a3b-tp2");
    if (!tp2.ok()) return tp2.status();
    c = *tp2;
    c.model.name = name;
    HardwareCalibration& h = c.hardware;
    const HardwareCalibration h200;
    constexpr double kBandwidth = 3.9 / 4.8;
    constexpr double kFlops = 835.0 / 989.0;
    h.name = "h100-pcie";
    h.weight_read_bytes_per_s = h200.weight_read_bytes_per_s * kBandwidth;
    h.kv_read_bytes_per_s = h200.kv_read_bytes_per_s * kBandwidth;
    h.moe_flops_per_s = h200.moe_flops_per_s * kFlops;
    h.dense_flops_per_s = h200.dense_flops_per_s * kFlops;
    h.attention_flops_per_s = h200.attention_flops_per_s * kFlops;
    h.h2d_bytes_per_s = 50e9;
    h.routed_h2d_bytes_per_s = h200.routed_h2d_bytes_per_s * 50e9 / h200.h2d_bytes_per_s;
    // The chunked delta rule is bound by its SMs (a sequence's chunks run one after another):
    // scaled as the tensor-core throughput (as many SMs, a lower clock). The recurrent one is
    // bound by its state traffic: scaled as HBM.
    h.delta_rule_prefill_us_per_token_head = h200.delta_rule_prefill_us_per_token_head / kFlops;
    h.delta_rule_decode_us_per_seq_head = h200.delta_rule_decode_us_per_seq_head / kBandwidth;
    h.allreduce_us = 25;
    // No NVLink between the two PCIe cards: NCCL's bus bandwidth over PCIe Gen5 peer-to-peer.
    h.allreduce_bytes_per_s = 25e9;
    return c;
  }
  if (name == "qwen3-next-80b-a3b-24l") {
    // tests/data/qwen3-next-80b-a3b-24l: the full model's layers, 24 of them (6 full attention, 18
    // Gated DeltaNet), on one GPU.
    absl::StatusOr<Calibration> tp2 = CalibrationPreset("qwen3-next-80b-a3b-tp2");
    if (!tp2.ok()) return tp2.status();
    c = *tp2;
    c.model.name = name;
    c.model.num_layers = 24;
    c.model.num_kv_layers = 6;
    c.model.tp_size = 1;
    return c;
  }
  if (name == "qwen3-next-80b-a3b-tp2") {
    SimModelShape& m = c.model;
    m.name = name;
    m.hidden = 2048;
    m.moe_intermediate = 512;
    m.num_experts = 512;
    m.top_k = 10;
    m.shared_expert_intermediate = 512;
    m.num_layers = 48;
    m.num_kv_layers = 12;  // full attention in 1 of 4 layers
    // Gated DeltaNet in the other 36 (tests/data/qwen3-next-80b-a3b/config.json): 37.7 MiB of
    // state per sequence per rank at TP2, 201 KV blocks of 16 tokens per snapshot.
    m.linear_key_heads = 16;
    m.linear_value_heads = 32;
    m.linear_key_head_dim = 128;
    m.linear_value_head_dim = 128;
    m.linear_conv_kernel = 4;
    m.num_q_heads = 16;
    m.num_kv_heads = 2;
    m.head_dim = 256;
    m.attention_output_gate = true;
    m.tp_size = 2;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown calibration preset '", name,
                   "' (known: qwen3-30b-a3b, qwen3-next-80b-a3b-tp2, qwen3-next-80b-a3b-h100-tp2, "
                   "qwen3-next-80b-a3b-24l)"));
}

namespace {

template <typename T>
absl::Status ReadField(const nlohmann::json& object, const std::string& section, const char* field,
                       T* out, const std::string& path) {
  if (!object.contains(field)) return absl::OkStatus();
  const nlohmann::json& v = object[field];
  const std::string where = absl::StrCat(path, ": field '", section, ".", field, "'");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat(where, " must be a string"));
    *out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be true or false"));
    }
    *out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be a positive integer"));
    }
    *out = v.get<T>();
  } else {
    if (!v.is_number() || v.get<double>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be a non-negative number"));
    }
    *out = v.get<T>();
  }
  return absl::OkStatus();
}

absl::Status CheckKnown(const nlohmann::json& object, const std::string& section,
                        std::initializer_list<const char*> known, const std::string& path) {
  for (const auto& [key, _] : object.items()) {
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unknown field '", section, ".", key, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Calibration> LoadCalibration(const std::string& path, Calibration c) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read calibration file '", path, "'"));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  for (const auto& [key, _] : doc.items()) {
    if (key != "model" && key != "hardware" && key != "comment") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown section '", key, "'"));
    }
  }
  absl::Status s;
  if (doc.contains("model")) {
    const nlohmann::json& m = doc["model"];
    auto& o = c.model;
    s.Update(CheckKnown(m, "model",
                        {"name",
                         "hidden",
                         "moe_intermediate",
                         "num_experts",
                         "top_k",
                         "shared_expert_intermediate",
                         "num_layers",
                         "num_kv_layers",
                         "num_q_heads",
                         "num_kv_heads",
                         "head_dim",
                         "attention_output_gate",
                         "vocab",
                         "dtype_bytes",
                         "tp_size",
                         "linear_key_heads",
                         "linear_value_heads",
                         "linear_key_head_dim",
                         "linear_value_head_dim",
                         "linear_conv_kernel"},
                        path));
    s.Update(ReadField(m, "model", "name", &o.name, path));
    s.Update(ReadField(m, "model", "hidden", &o.hidden, path));
    s.Update(ReadField(m, "model", "moe_intermediate", &o.moe_intermediate, path));
    s.Update(ReadField(m, "model", "num_experts", &o.num_experts, path));
    s.Update(ReadField(m, "model", "top_k", &o.top_k, path));
    if (m.contains("shared_expert_intermediate") && m["shared_expert_intermediate"] == 0) {
      o.shared_expert_intermediate = 0;
    } else {
      s.Update(
          ReadField(m, "model", "shared_expert_intermediate", &o.shared_expert_intermediate, path));
    }
    s.Update(ReadField(m, "model", "num_layers", &o.num_layers, path));
    s.Update(ReadField(m, "model", "num_kv_layers", &o.num_kv_layers, path));
    s.Update(ReadField(m, "model", "num_q_heads", &o.num_q_heads, path));
    s.Update(ReadField(m, "model", "num_kv_heads", &o.num_kv_heads, path));
    s.Update(ReadField(m, "model", "head_dim", &o.head_dim, path));
    s.Update(ReadField(m, "model", "attention_output_gate", &o.attention_output_gate, path));
    s.Update(ReadField(m, "model", "vocab", &o.vocab, path));
    s.Update(ReadField(m, "model", "dtype_bytes", &o.dtype_bytes, path));
    s.Update(ReadField(m, "model", "tp_size", &o.tp_size, path));
    s.Update(ReadField(m, "model", "linear_key_heads", &o.linear_key_heads, path));
    s.Update(ReadField(m, "model", "linear_value_heads", &o.linear_value_heads, path));
    s.Update(ReadField(m, "model", "linear_key_head_dim", &o.linear_key_head_dim, path));
    s.Update(ReadField(m, "model", "linear_value_head_dim", &o.linear_value_head_dim, path));
    s.Update(ReadField(m, "model", "linear_conv_kernel", &o.linear_conv_kernel, path));
  }
  if (doc.contains("hardware")) {
    const nlohmann::json& h = doc["hardware"];
    auto& o = c.hardware;
    s.Update(CheckKnown(
        h, "hardware",
        {"name", "weight_read_bytes_per_s", "kv_read_bytes_per_s", "moe_flops_per_s",
         "dense_flops_per_s", "attention_flops_per_s", "h2d_bytes_per_s", "routed_h2d_bytes_per_s",
         "delta_rule_prefill_us_per_token_head", "delta_rule_decode_us_per_seq_head",
         "step_overhead_us", "layer_overhead_us", "allreduce_us", "allreduce_bytes_per_s"},
        path));
    s.Update(ReadField(h, "hardware", "name", &o.name, path));
    s.Update(ReadField(h, "hardware", "weight_read_bytes_per_s", &o.weight_read_bytes_per_s, path));
    s.Update(ReadField(h, "hardware", "kv_read_bytes_per_s", &o.kv_read_bytes_per_s, path));
    s.Update(ReadField(h, "hardware", "moe_flops_per_s", &o.moe_flops_per_s, path));
    s.Update(ReadField(h, "hardware", "dense_flops_per_s", &o.dense_flops_per_s, path));
    s.Update(ReadField(h, "hardware", "attention_flops_per_s", &o.attention_flops_per_s, path));
    s.Update(ReadField(h, "hardware", "h2d_bytes_per_s", &o.h2d_bytes_per_s, path));
    s.Update(ReadField(h, "hardware", "routed_h2d_bytes_per_s", &o.routed_h2d_bytes_per_s, path));
    s.Update(ReadField(h, "hardware", "delta_rule_prefill_us_per_token_head",
                       &o.delta_rule_prefill_us_per_token_head, path));
    s.Update(ReadField(h, "hardware", "delta_rule_decode_us_per_seq_head",
                       &o.delta_rule_decode_us_per_seq_head, path));
    s.Update(ReadField(h, "hardware", "step_overhead_us", &o.step_overhead_us, path));
    s.Update(ReadField(h, "hardware", "layer_overhead_us", &o.layer_overhead_us, path));
    s.Update(ReadField(h, "hardware", "allreduce_us", &o.allreduce_us, path));
    s.Update(ReadField(h, "hardware", "allreduce_bytes_per_s", &o.allreduce_bytes_per_s, path));
  }
  if (!s.ok()) return s;
  const SimModelShape& m = c.model;
  if (m.top_k > m.num_experts || m.num_kv_layers > m.num_layers ||
      m.moe_intermediate % m.tp_size != 0 || m.num_q_heads % m.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": model shape is inconsistent (top_k <= num_experts, num_kv_layers <= num_layers, "
        "moe_intermediate and num_q_heads divisible by tp_size)"));
  }
  if (c.hardware.weight_read_bytes_per_s <= 0 || c.hardware.h2d_bytes_per_s <= 0 ||
      c.hardware.routed_h2d_bytes_per_s <= 0 || c.hardware.moe_flops_per_s <= 0 ||
      c.hardware.kv_read_bytes_per_s <= 0 || c.hardware.dense_flops_per_s <= 0 ||
      c.hardware.attention_flops_per_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": hardware bandwidths and throughputs must be positive"));
  }
  return c;
}

}  // namespace vamp::sim
