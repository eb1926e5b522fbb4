// The qwen3_moe model against HF transformers goldens, and its weight loading: both expert
// layouts, bf16 checkpoints, tensor-parallel shards, dummy weights, dense layers and bad
// checkpoints.
#include "engine/model/qwen3_moe.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "engine/model/model_loader.h"
#include "gtest/gtest.h"
#include "kernels/cpu/copy.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/tiny_model.h"

namespace vamp {
namespace {

using testing::LoadGoldens;
using testing::LogitsMatch;
using testing::ReadFile;
using testing::SafetensorsBuilder;
using testing::TinyFusedModelDir;
using testing::TinyModelDir;
using testing::WriteFile;

struct Loaded {
  ModelConfig config;
  std::unique_ptr<HostExpertBuffers> experts;
  std::unique_ptr<CausalLm> model;
};

absl::StatusOr<Loaded> Load(const std::string& dir, ParallelConfig parallel = {},
                            LoadFormat format = LoadFormat::kAuto, uint64_t seed = 0) {
  Loaded out;
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  out.config = *config;
  auto layout = ExpertLayoutFor(out.config, parallel);
  if (!layout.ok()) return layout.status();
  out.experts = std::make_unique<HostExpertBuffers>(out.config.num_hidden_layers,
                                                    out.config.num_experts, *layout);
  LoadOptions options;
  options.model_path = dir;
  options.format = format;
  options.dummy_seed = seed;
  options.parallel = parallel;
  auto model = LoadModel(out.config, options, *out.experts);
  if (!model.ok()) return model.status();
  out.model = std::move(*model);
  return out;
}

// One sequence, prefilled in one step into a fresh contiguous KV buffer; logits of every position.
std::vector<float> RunPrompt(Loaded& m, const std::vector<int32_t>& tokens) {
  const int64_t n = tokens.size(), bs = 16, blocks = (n + bs - 1) / bs;
  const ModelConfig& c = m.config;
  BlockMajorKvLayout layout{bs, c.num_hidden_layers, m.model->kv_heads_per_rank(), c.head_dim};
  std::vector<float> kv(blocks * layout.BlockElements());
  KvCacheView view =
      layout.View(kv.data(), blocks, m.model->attention_layers(), c.num_hidden_layers);
  std::vector<int64_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int32_t> table(blocks), rows(n), qsl = {0, int32_t(n)}, lens = {int32_t(n)};
  std::iota(table.begin(), table.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.positions = positions;
  batch.slot_mapping = positions;  // identity block table: slot == position
  batch.query_start_loc = qsl;
  batch.seq_lens = lens;
  batch.max_seq_len = n;
  batch.block_tables = table;
  batch.block_table_stride = blocks;
  batch.logits_indices = rows;
  std::vector<float> logits(n * c.vocab_size);
  absl::Status s = m.model->Forward(batch, view, m.experts.get(), nullptr, logits.data());
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

TEST(Qwen3MoeTest, LogitsMatchHfTransformersGoldens) {
  const auto goldens = LoadGoldens();
  ASSERT_EQ(goldens.prompts.size(), 4u);
  double max_err = 0;
  for (const std::string& dir : {TinyModelDir(), TinyFusedModelDir()}) {
    auto m = Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->config.vocab_size, goldens.vocab);
    for (size_t i = 0; i < goldens.prompts.size(); ++i) {
      const auto logits = RunPrompt(*m, goldens.prompts[i]);
      ASSERT_EQ(logits.size(), goldens.logits[i].size());
      EXPECT_TRUE(LogitsMatch(logits.data(), goldens.logits[i].data(), logits.size()))
          << dir << " prompt " << i;
      for (size_t j = 0; j < logits.size(); ++j) {
        const double want = goldens.logits[i][j];
        max_err = std::max(max_err, std::abs(logits[j] - want) / std::max(1.0, std::abs(want)));
      }
    }
  }
  // For the record: the largest |got - want| / max(1, |want|) seen.
  RecordProperty("max_scaled_error", std::to_string(max_err));
  std::printf("max |got - want| / max(1, |want|) over all golden logits: %.3g\n", max_err);
}

// Every non-expert weight and every expert shard of `a` and `b` is bitwise equal.
void ExpectSameWeights(const Loaded& a, const Loaded& b) {
  std::map<std::string, std::vector<float>> wa;
  a.model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
    wa[std::string(name)].assign(d.begin(), d.end());
  });
  size_t seen = 0;
  b.model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
    auto it = wa.find(std::string(name));
    ASSERT_NE(it, wa.end()) << name;
    ASSERT_EQ(it->second.size(), d.size()) << name;
    EXPECT_EQ(0, std::memcmp(it->second.data(), d.data(), d.size() * sizeof(float))) << name;
    ++seen;
  });
  EXPECT_EQ(seen, wa.size());
  const auto layout = a.experts->layout();
  for (int l = 0; l < a.config.num_hidden_layers; ++l) {
    for (int e = 0; e < a.config.num_experts; ++e) {
      ASSERT_NE(a.experts->shard(l, e), nullptr);
      ASSERT_NE(b.experts->shard(l, e), nullptr);
      EXPECT_EQ(0, std::memcmp(a.experts->shard(l, e), b.experts->shard(l, e), layout.Bytes()))
          << "layer " << l << " expert " << e;
    }
  }
}

TEST(Qwen3MoeTest, BothExpertLayoutsLoadToTheSameWeights) {
  auto per_expert = Load(TinyModelDir());
  auto fused = Load(TinyFusedModelDir());
  ASSERT_TRUE(per_expert.ok()) << per_expert.status();
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectSameWeights(*per_expert, *fused);
  // And the shard layout is [gate rows | up rows | down]: check against the raw per-expert tensors.
  auto file = SafetensorsFile::Open(TinyModelDir() + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  const int64_t H = 64, I = 24;
  const float* shard = per_expert->experts->shard(2, 5);
  for (const auto& [name, offset, count] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"gate_proj", 0, I * H}, {"up_proj", I * H, I * H}, {"down_proj", 2 * I * H, H * I}}) {
    const TensorInfo* t = (*file)->Find("model.layers.2.mlp.experts.5." + name + ".weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(0, std::memcmp(shard + offset, t->data, count * sizeof(float))) << name;
  }
}

// Rewrites the tiny checkpoint into `dir` with `edit` applied to the builder (after all tensors
// are added) and `config_edit` to config.json.
std::string RewriteCheckpoint(
    const std::string& name, const std::function<void(const TensorInfo&, SafetensorsBuilder&)>& add,
    const std::function<void(nlohmann::json&)>& config_edit = nullptr) {
  const std::string dir = testing::ScratchDir() + "/" + name;
  std::filesystem::create_directories(dir);
  auto config = nlohmann::json::parse(ReadFile(TinyModelDir() + "/config.json"));
  if (config_edit) config_edit(config);
  WriteFile(dir + "/config.json", config.dump());
  auto file = SafetensorsFile::Open(TinyModelDir() + "/model.safetensors");
  EXPECT_TRUE(file.ok());
  SafetensorsBuilder builder;
  for (const TensorInfo& t : (*file)->tensors()) add(t, builder);
  WriteFile(dir + "/model.safetensors", builder.Build());
  return dir;
}

void CopyTensor(const TensorInfo& t, SafetensorsBuilder& b) {
  b.Add(t.name, "F32", t.shape, t.data, t.num_bytes);
}

TEST(Qwen3MoeTest, ShardedCheckpointsLoadFromTheIndexOrTheDirectory) {
  // Split the per-expert checkpoint into two files: layers 0-1 and everything else.
  const std::string dir = testing::ScratchDir() + "/sharded";
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/config.json", ReadFile(TinyModelDir() + "/config.json"));
  auto file = SafetensorsFile::Open(TinyModelDir() + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  SafetensorsBuilder first, second;
  nlohmann::json index;
  for (const TensorInfo& t : (*file)->tensors()) {
    const bool in_first =
        t.name.rfind("model.layers.0.", 0) == 0 || t.name.rfind("model.layers.1.", 0) == 0;
    CopyTensor(t, in_first ? first : second);
    index["weight_map"][t.name] = in_first ? "part-1.safetensors" : "part-2.safetensors";
  }
  WriteFile(dir + "/part-1.safetensors", first.Build());
  WriteFile(dir + "/part-2.safetensors", second.Build());
  auto reference = Load(TinyModelDir());
  ASSERT_TRUE(reference.ok());
  {
    auto m = Load(dir);  // no index: every *.safetensors file
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectSameWeights(*reference, *m);
  }
  WriteFile(dir + "/model.safetensors.index.json", index.dump());
  // A stray file the index does not name is ignored when there is an index.
  WriteFile(dir + "/stray.safetensors", "garbage");
  {
    auto m = Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectSameWeights(*reference, *m);
  }
  // The index may only name files inside the directory.
  index["weight_map"]["lm_head.weight"] = "../tiny-qwen3-moe/model.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", index.dump());
  auto escaped = Load(dir);
  ASSERT_FALSE(escaped.ok());
  EXPECT_NE(std::string(escaped.status().message()).find("names a bad file"), std::string::npos)
      << escaped.status();
  // A tensor in two files is an error naming it and both files.
  std::filesystem::remove(dir + "/model.safetensors.index.json");
  std::filesystem::remove(dir + "/stray.safetensors");
  WriteFile(dir + "/part-3.safetensors", first.Build());
  auto duplicated = Load(dir);
  ASSERT_FALSE(duplicated.ok());
  EXPECT_NE(std::string(duplicated.status().message()).find("appears in both"), std::string::npos)
      << duplicated.status();
}

TEST(Qwen3MoeTest, Bf16AndF16CheckpointsLoadAsRoundedFloat32) {
  for (const std::string dtype : {"BF16", "F16"}) {
    const std::string dir =
        RewriteCheckpoint("tiny-" + dtype, [&](const TensorInfo& t, SafetensorsBuilder& b) {
          std::vector<float> f(t.num_elements);
          std::memcpy(f.data(), t.data, t.num_bytes);
          std::vector<uint16_t> h(f.size());
          if (dtype == "BF16") {
            kernels::cpu::FloatToBf16(f.data(), f.size(), h.data());
          } else {
            kernels::cpu::FloatToFp16(f.data(), f.size(), h.data());
          }
          b.Add(t.name, dtype, t.shape, h.data(), h.size() * 2);
        });
    auto m16 = Load(dir);
    auto m32 = Load(TinyModelDir());
    ASSERT_TRUE(m16.ok()) << m16.status();
    ASSERT_TRUE(m32.ok());
    std::map<std::string, std::vector<float>> w32;
    m32->model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
      w32[std::string(name)].assign(d.begin(), d.end());
    });
    m16->model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
      const auto& ref = w32[std::string(name)];
      ASSERT_EQ(ref.size(), d.size());
      for (size_t i = 0; i < d.size(); ++i) {
        // bf16 keeps 8 mantissa bits, fp16 11: relative rounding error below 2^-8 / 2^-11.
        const double rel = dtype == "BF16" ? 1.0 / 256 : 1.0 / 2048;
        ASSERT_NEAR(d[i], ref[i], std::abs(ref[i]) * rel + 1e-7) << name << " " << i;
      }
    });
    // The 16-bit model still computes sensible logits (close to, not equal to, the goldens).
    const auto goldens = LoadGoldens();
    const auto logits = RunPrompt(*m16, goldens.prompts[1]);
    double max_diff = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      max_diff = std::max(max_diff, double(std::abs(logits[i] - goldens.logits[1][i])));
    }
    EXPECT_LT(max_diff, 0.5) << dtype;
    EXPECT_GT(max_diff, 0.0) << dtype << ": rounding must change something";
  }
}

TEST(Qwen3MoeTest, TensorParallelShardsPartitionTheFullWeights) {
  auto full = Load(TinyModelDir());
  ASSERT_TRUE(full.ok());
  std::map<std::string, std::vector<float>> w;
  full->model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
    w[std::string(name)].assign(d.begin(), d.end());
  });
  const int64_t H = 64, I = 24, hd = 16;
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      auto shard = Load(TinyModelDir(), ParallelConfig{r, tp});
      ASSERT_TRUE(shard.ok()) << shard.status();
      EXPECT_EQ(shard->model->kv_heads_per_rank(), 2 / std::min(tp, 2));
      std::map<std::string, std::vector<float>> s;
      shard->model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
        s[std::string(name)].assign(d.begin(), d.end());
      });
      // q rows of this rank's heads come first in the fused qkv matrix.
      const auto& qkv_full = w["model.layers.1.self_attn.qkv_proj.weight"];
      const auto& qkv = s["model.layers.1.self_attn.qkv_proj.weight"];
      const int64_t q_rows = 4 / tp * hd;
      ASSERT_EQ(0, std::memcmp(qkv.data(), qkv_full.data() + r * q_rows * H, q_rows * H * 4));
      // k rows: KV head r * 2 / tp (replicated when tp > 2).
      const int64_t kv_head = tp <= 2 ? r : r * 2 / tp;
      ASSERT_EQ(0, std::memcmp(qkv.data() + q_rows * H,
                               qkv_full.data() + (4 * hd + kv_head * hd) * H, hd * H * 4));
      // Expert gate rows and down columns.
      const int64_t Il = I / tp;
      if (I % tp == 0) {
        const float* e_full = full->experts->shard(0, 7);
        const float* e_shard = shard->experts->shard(0, 7);
        ASSERT_EQ(0, std::memcmp(e_shard, e_full + r * Il * H, Il * H * 4));
        for (int64_t row = 0; row < H; ++row) {
          ASSERT_EQ(0, std::memcmp(e_shard + 2 * Il * H + row * Il,
                                   e_full + 2 * I * H + row * I + r * Il, Il * 4));
        }
      }
    }
  }
  // Sizes that do not split: the error names the field.
  for (const auto& [tp, field] : std::vector<std::pair<int, std::string>>{
           {3, "num_attention_heads"}, {5, "moe_intermediate_size"}}) {
    auto bad = Load(TinyModelDir(), ParallelConfig{0, tp});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(std::string(bad.status().message()).find("config field '" + field + "'"),
              std::string::npos)
        << bad.status();
  }
}

TEST(Qwen3MoeTest, DummyWeightsHaveRealShapesAndAreSeededAndShardConsistent) {
  auto a = Load(TinyModelDir(), {}, LoadFormat::kDummy, 7);
  auto b = Load(TinyModelDir(), {}, LoadFormat::kDummy, 7);
  auto c = Load(TinyModelDir(), {}, LoadFormat::kDummy, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ExpectSameWeights(*a, *b);
  std::vector<float> ea(a->experts->shard(1, 3), a->experts->shard(1, 3) + 100);
  std::vector<float> ec(c->experts->shard(1, 3), c->experts->shard(1, 3) + 100);
  EXPECT_NE(ea, ec);
  // Rank 1 of 2 holds the second half of the gate rows of the unsharded dummy expert.
  auto r1 = Load(TinyModelDir(), {1, 2}, LoadFormat::kDummy, 7);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(0,
            std::memcmp(r1->experts->shard(1, 3), a->experts->shard(1, 3) + 12 * 64, 12 * 64 * 4));
  // Finite logits of a sensible scale.
  const auto logits = RunPrompt(*a, {1, 2, 3, 4, 5});
  for (float v : logits) ASSERT_TRUE(std::isfinite(v) && std::abs(v) < 100) << v;
}

TEST(Qwen3MoeTest, DenseMlpLayerEqualsAOneExpertMoeLayer) {
  // Layer 1 as a dense MLP whose weights are expert 0 of layer 1, against the same model with one
  // expert (top-1, weight exactly 1): the same arithmetic, so bit-identical logits.
  auto edit_moe1 = [](nlohmann::json& c) {
    c["num_experts"] = 1;
    c["num_experts_per_tok"] = 1;
  };
  auto keep_expert0 = [](const TensorInfo& t, SafetensorsBuilder& b) {
    const std::string& n = t.name;
    if (n.find(".mlp.experts.") != std::string::npos &&
        n.find(".mlp.experts.0.") == std::string::npos) {
      return;
    }
    if (n.find(".mlp.gate.weight") != std::string::npos) {
      b.AddF32(n, {1, 64}, std::vector<float>(64, 0.5f));
      return;
    }
    CopyTensor(t, b);
  };
  const std::string moe_dir = RewriteCheckpoint("one-expert", keep_expert0, edit_moe1);
  const std::string dense_dir = RewriteCheckpoint(
      "dense-layer1",
      [&](const TensorInfo& t, SafetensorsBuilder& b) {
        const std::string prefix = "model.layers.1.mlp.";
        if (t.name.rfind(prefix + "experts.0.", 0) == 0) {
          const std::string proj = t.name.substr((prefix + "experts.0.").size());
          b.Add(prefix + proj, "F32", t.shape, t.data, t.num_bytes);  // mlp.gate_proj.weight ...
          return;
        }
        if (t.name == prefix + "gate.weight") return;
        if (t.name.rfind(prefix + "experts.", 0) == 0) return;
        keep_expert0(t, b);
      },
      [&](nlohmann::json& c) {
        edit_moe1(c);
        c["mlp_only_layers"] = {1};
        c["intermediate_size"] = 24;
      });
  auto moe = Load(moe_dir);
  auto dense = Load(dense_dir);
  ASSERT_TRUE(moe.ok()) << moe.status();
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->model->moe_layers(), (std::vector<int>{0, 2}));
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 200, 41};
  EXPECT_EQ(RunPrompt(*moe, prompt), RunPrompt(*dense, prompt));
}

TEST(Qwen3MoeTest, BadCheckpointsGiveErrorsNamingTheTensor) {
  struct Case {
    std::string name;
    std::function<void(const TensorInfo&, SafetensorsBuilder&)> add;
    std::string expect;  // substring of the error
  };
  // k_proj is [32, 64]: transposing it changes the shape (q_proj is square here).
  const std::string q = "model.layers.1.self_attn.k_proj.weight";
  const std::vector<Case> cases = {
      {"missing",
       [&](const TensorInfo& t, SafetensorsBuilder& b) {
         if (t.name != q) CopyTensor(t, b);
       },
       "no tensor '" + q + "'"},
      {"transposed",
       [&](const TensorInfo& t, SafetensorsBuilder& b) {
         if (t.name == q) {
           b.Add(t.name, "F32", {t.shape[1], t.shape[0]}, t.data, t.num_bytes);
         } else {
           CopyTensor(t, b);
         }
       },
       "tensor '" + q + "' in"},
      {"int-dtype",
       [&](const TensorInfo& t, SafetensorsBuilder& b) {
         if (t.name == q) {
           b.Add(t.name, "I32", t.shape, t.data, t.num_bytes);
         } else {
           CopyTensor(t, b);
         }
       },
       "tensor '" + q + "' has dtype I32"},
      {"no-experts",
       [&](const TensorInfo& t, SafetensorsBuilder& b) {
         if (t.name.find("layers.2.mlp.experts.") == std::string::npos) CopyTensor(t, b);
       },
       "no experts for layer 2"},
      {"transposed-expert",
       [&](const TensorInfo& t, SafetensorsBuilder& b) {
         if (t.name == "model.layers.0.mlp.experts.3.down_proj.weight") {
           b.Add(t.name, "F32", {t.shape[1], t.shape[0]}, t.data, t.num_bytes);
         } else {
           CopyTensor(t, b);
         }
       },
       "model.layers.0.mlp.experts.3.down_proj.weight"},
  };
  for (const Case& c : cases) {
    const std::string dir = RewriteCheckpoint("bad-" + c.name, c.add);
    auto m = Load(dir);
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_NE(std::string(m.status().message()).find(c.expect), std::string::npos)
        << c.name << ": " << m.status();
  }
  // A truncated file: the error names the file and says so.
  const std::string dir = RewriteCheckpoint("truncated", CopyTensor);
  std::string bytes = ReadFile(dir + "/model.safetensors");
  WriteFile(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  auto m = Load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("truncated"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace vamp
