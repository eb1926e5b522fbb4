// Shared helpers of the qwen3_next tests: the tiny config (the one
// tests/data/make_tiny_qwen3_next.py gives HF transformers), HF's tensor names and shapes for a
// config (written from HF's module definitions, independently of the model's loader), a
// checkpoint writer filling them with the dummy source's values, and a stepper that runs
// sequences through a model with paged KV and recurrent-state slots the way the runner does.
#ifndef VAMP_TESTS_ENGINE_MODEL_TINY_QWEN3_NEXT_H_
#define VAMP_TESTS_ENGINE_MODEL_TINY_QWEN3_NEXT_H_

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "engine/model/weight_source.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/tiny_model.h"

namespace vamp::testing {

inline std::string TinyQwen3NextDir() { return TestDataDir() + "/tiny-qwen3-next"; }

// 4 layers, full attention in layers 1 and 3 (interval 2, so each kind follows the other), layer
// 2 a dense MLP; every width distinct from the others so that a swapped dimension cannot load.
inline nlohmann::json TinyQwen3NextConfig() {
  return {
      {"architectures", {"Qwen3NextForCausalLM"}},
      {"model_type", "qwen3_next"},
      {"vocab_size", 256},
      {"hidden_size", 64},
      {"intermediate_size", 96},
      {"num_hidden_layers", 4},
      {"full_attention_interval", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 32},
      {"partial_rotary_factor", 0.25},
      {"rope_theta", 10000.0},
      {"linear_num_key_heads", 2},
      {"linear_num_value_heads", 4},
      {"linear_key_head_dim", 16},
      {"linear_value_head_dim", 8},
      {"linear_conv_kernel_dim", 4},
      {"num_experts", 16},
      {"num_experts_per_tok", 4},
      {"moe_intermediate_size", 24},
      {"shared_expert_intermediate_size", 40},
      {"norm_topk_prob", true},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", {2}},
      {"hidden_act", "silu"},
      {"max_position_embeddings", 1024},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
}

using TensorList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every tensor of HF Qwen3NextForCausalLM's state dict for `c` (experts per expert or fused).
inline TensorList Qwen3NextHfTensors(const ModelConfig& c, bool fused_experts) {
  const int64_t H = c.hidden_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t kd = c.linear_num_key_heads * c.linear_key_head_dim;
  const int64_t vd = c.linear_num_value_heads * c.linear_value_head_dim;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size, Id = c.intermediate_size;
  TensorList t = {{"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}};
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {V, H}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back({p + "input_layernorm.weight", {H}});
    t.push_back({p + "post_attention_layernorm.weight", {H}});
    if (c.IsFullAttentionLayer(l)) {
      t.push_back({p + "self_attn.q_proj.weight", {c.num_attention_heads * hd * 2, H}});
      t.push_back({p + "self_attn.k_proj.weight", {c.num_key_value_heads * hd, H}});
      t.push_back({p + "self_attn.v_proj.weight", {c.num_key_value_heads * hd, H}});
      t.push_back({p + "self_attn.o_proj.weight", {H, c.num_attention_heads * hd}});
      t.push_back({p + "self_attn.q_norm.weight", {hd}});
      t.push_back({p + "self_attn.k_norm.weight", {hd}});
    } else {
      t.push_back({p + "linear_attn.in_proj_qkvz.weight", {2 * kd + 2 * vd, H}});
      t.push_back({p + "linear_attn.in_proj_ba.weight", {2 * c.linear_num_value_heads, H}});
      t.push_back({p + "linear_attn.conv1d.weight", {2 * kd + vd, 1, c.linear_conv_kernel_dim}});
      t.push_back({p + "linear_attn.dt_bias", {c.linear_num_value_heads}});
      t.push_back({p + "linear_attn.A_log", {c.linear_num_value_heads}});
      t.push_back({p + "linear_attn.norm.weight", {c.linear_value_head_dim}});
      t.push_back({p + "linear_attn.out_proj.weight", {H, vd}});
    }
    if (c.IsMoeLayer(l)) {
      t.push_back({p + "mlp.gate.weight", {E, H}});
      if (fused_experts) {
        t.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * I, H}});
        t.push_back({p + "mlp.experts.down_proj", {E, H, I}});
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
          t.push_back({ep + "gate_proj.weight", {I, H}});
          t.push_back({ep + "up_proj.weight", {I, H}});
          t.push_back({ep + "down_proj.weight", {H, I}});
        }
      }
      if (Is > 0) {
        t.push_back({p + "mlp.shared_expert.gate_proj.weight", {Is, H}});
        t.push_back({p + "mlp.shared_expert.up_proj.weight", {Is, H}});
        t.push_back({p + "mlp.shared_expert.down_proj.weight", {H, Is}});
        t.push_back({p + "mlp.shared_expert_gate.weight", {1, H}});
      }
    } else {
      t.push_back({p + "mlp.gate_proj.weight", {Id, H}});
      t.push_back({p + "mlp.up_proj.weight", {Id, H}});
      t.push_back({p + "mlp.down_proj.weight", {H, Id}});
    }
  }
  return t;
}

// The values the dummy source gives tensor `name` of `shape`.
inline std::vector<float> DummyValues(uint64_t seed, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  auto source = CreateDummyWeightSource(seed);
  std::vector<DimRange> ranges;
  int64_t n = 1;
  for (int64_t d : shape) {
    ranges.push_back({0, d});
    n *= d;
  }
  std::vector<float> v(n);
  EXPECT_TRUE(source->Read(name, shape, ranges, v.data()).ok()) << name;
  return v;
}

// Writes `config` and a float32 checkpoint of HF's tensors holding the dummy source's values for
// `seed` (so it loads to exactly the weights --load-format dummy gives), plus `extra` tensors.
inline std::string WriteQwen3NextCheckpoint(const std::string& name, const nlohmann::json& config,
                                            uint64_t seed, bool fused_experts,
                                            const TensorList& extra = {}) {
  const std::string dir = ScratchDir() + "/" + name;
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/config.json", config.dump());
  auto parsed = ParseModelConfig(config.dump());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  SafetensorsBuilder builder;
  TensorList tensors = Qwen3NextHfTensors(*parsed, fused_experts);
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  for (const auto& [tensor, shape] : tensors) {
    builder.AddF32(tensor, shape, DummyValues(seed, tensor, shape));
  }
  WriteFile(dir + "/model.safetensors", builder.Build());
  return dir;
}

// A loaded model with all-resident experts.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<HostExpertBuffers> experts;
  std::unique_ptr<CausalLm> model;
};

inline absl::StatusOr<LoadedModel> LoadFrom(const ModelConfig& config, WeightSource& source,
                                            ParallelConfig parallel = {}) {
  LoadedModel out;
  out.config = config;
  auto layout = ExpertLayoutFor(config, parallel);
  if (!layout.ok()) return layout.status();
  out.experts =
      std::make_unique<HostExpertBuffers>(config.num_hidden_layers, config.num_experts, *layout);
  auto model = LoadModelFromSource(config, parallel, source, *out.experts);
  if (!model.ok()) return model.status();
  out.model = std::move(*model);
  return out;
}

inline absl::StatusOr<LoadedModel> LoadDummy(const nlohmann::json& config, uint64_t seed,
                                             ParallelConfig parallel = {}) {
  auto parsed = ParseModelConfig(config.dump());
  if (!parsed.ok()) return parsed.status();
  auto source = CreateDummyWeightSource(seed);
  return LoadFrom(*parsed, *source, parallel);
}

inline absl::StatusOr<LoadedModel> LoadCheckpoint(const std::string& dir,
                                                  ParallelConfig parallel = {}) {
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  auto source = OpenSafetensorsCheckpoint(dir);
  if (!source.ok()) return source.status();
  return LoadFrom(*config, **source, parallel);
}

// Runs steps over sequences the way the runner does: sequence s owns KV blocks
// [s * blocks_per_seq, (s + 1) * blocks_per_seq) and, unless a step says otherwise, state slot s;
// each step appends tokens after the context the sequence has so far and returns the logits of
// every new token.
class SequenceStepper {
 public:
  struct Work {
    int32_t seq = 0;
    std::vector<int32_t> tokens;
    int32_t state_slot = -1;  // -1: the sequence's own slot
    // Copy the sequence's state after this many of the step's tokens into `capture` (0: none).
    int32_t capture_after = 0;
    const StateSnapshotView* capture = nullptr;
  };

  SequenceStepper(LoadedModel& m, int32_t num_seqs, int64_t max_len = 256, int64_t block_size = 16)
      : m_(m),
        block_size_(block_size),
        blocks_per_seq_((max_len + block_size - 1) / block_size),
        context_(num_seqs, 0) {
    const ModelConfig& c = m.config;
    const std::vector<int>& layers = m.model->attention_layers();
    BlockMajorKvLayout layout{block_size, static_cast<int64_t>(layers.size()),
                              m.model->kv_heads_per_rank(), c.head_dim};
    const int64_t blocks = num_seqs * blocks_per_seq_;
    kv_.assign(blocks * layout.BlockElements(), 0.0f);
    view_ = layout.View(kv_.data(), blocks, layers, c.num_hidden_layers);
    EXPECT_TRUE(m.model->ReserveRecurrentStates(num_seqs).ok());
  }

  // The sequence starts over (context 0) at its next step.
  void Restart(int32_t seq) { context_[seq] = 0; }
  int32_t context(int32_t seq) const { return context_[seq]; }

  // A prefix-cache hit: sequence `to` takes the first `tokens` tokens of `from`'s context (a
  // multiple of the block size): a copy of their KV blocks and the state in `snapshot`, restored
  // into `to`'s slot.
  absl::Status ContinueFrom(int32_t to, int32_t from, int32_t tokens,
                            const StateSnapshotView& snapshot) {
    const int64_t block_elems = view_.block_bytes / static_cast<int64_t>(sizeof(float));
    for (int64_t b = 0; b < tokens / block_size_; ++b) {
      std::copy_n(kv_.begin() + (from * blocks_per_seq_ + b) * block_elems, block_elems,
                  kv_.begin() + (to * blocks_per_seq_ + b) * block_elems);
    }
    absl::Status s = m_.model->RestoreRecurrentState(to, snapshot, tokens);
    if (s.ok()) context_[to] = tokens;
    return s;
  }

  absl::StatusOr<std::vector<std::vector<float>>> Step(const std::vector<Work>& work,
                                                       Communicator* comm = nullptr) {
    std::vector<int32_t> tokens, qsl = {0}, lens, table, rows, slots;
    std::vector<int64_t> positions, slot_mapping;
    std::vector<StateCapture> captures;
    int32_t max_len = 0;
    for (const Work& w : work) {
      const int32_t ctx = context_[w.seq];
      for (size_t i = 0; i < w.tokens.size(); ++i) {
        const int64_t pos = ctx + static_cast<int64_t>(i);
        tokens.push_back(w.tokens[i]);
        positions.push_back(pos);
        slot_mapping.push_back((w.seq * blocks_per_seq_ + pos / block_size_) * block_size_ +
                               pos % block_size_);
        rows.push_back(static_cast<int32_t>(rows.size()));
      }
      qsl.push_back(static_cast<int32_t>(tokens.size()));
      lens.push_back(ctx + static_cast<int32_t>(w.tokens.size()));
      max_len = std::max(max_len, lens.back());
      for (int64_t j = 0; j < blocks_per_seq_; ++j) {
        table.push_back(static_cast<int32_t>(w.seq * blocks_per_seq_ + j));
      }
      slots.push_back(w.state_slot >= 0 ? w.state_slot : w.seq);
      if (w.capture != nullptr) {
        captures.push_back({static_cast<int32_t>(slots.size() - 1), w.capture_after, *w.capture});
      }
    }
    ForwardBatch batch;
    batch.token_ids = tokens;
    batch.positions = positions;
    batch.slot_mapping = slot_mapping;
    batch.query_start_loc = qsl;
    batch.seq_lens = lens;
    batch.max_seq_len = max_len;
    batch.block_tables = table;
    batch.block_table_stride = blocks_per_seq_;
    batch.logits_indices = rows;
    batch.state_slots = slots;
    batch.state_captures = captures;
    const int64_t V = m_.config.vocab_size;
    std::vector<float> logits(rows.size() * V);
    absl::Status s = m_.model->Forward(batch, view_, m_.experts.get(), comm, logits.data());
    if (!s.ok()) return s;
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < work.size(); ++i) {
      out.emplace_back(logits.begin() + qsl[i] * V, logits.begin() + qsl[i + 1] * V);
      context_[work[i].seq] = lens[i];
    }
    return out;
  }

 private:
  LoadedModel& m_;
  const int64_t block_size_;
  const int64_t blocks_per_seq_;
  std::vector<int32_t> context_;
  std::vector<float> kv_;
  KvCacheView view_;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_ENGINE_MODEL_TINY_QWEN3_NEXT_H_
