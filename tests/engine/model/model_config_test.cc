// config.json parsing: the tiny checkpoint's config, HF variants, and errors naming the field.
#include "engine/model/model_config.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/tiny_model.h"

namespace vamp {
namespace {

nlohmann::json TinyConfig() {
  return nlohmann::json::parse(testing::ReadFile(testing::TinyModelDir() + "/config.json"));
}

TEST(ModelConfigTest, ParsesTheTinyCheckpointConfig) {
  auto c = LoadModelConfig(testing::TinyModelDir());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(c->architecture_name, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c->vocab_size, 256);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->moe_intermediate_size, 24);
  EXPECT_EQ(c->num_experts, 16);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_position_embeddings, 1024);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2}));
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(c->IsMoeLayer(l));

  const ModelShape shape = c->ToModelShape(4);
  EXPECT_TRUE(shape.Validate().ok()) << shape.Validate();
  EXPECT_EQ(shape.moe_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(shape.ExpertBytesPerRank(1), 3 * 24 * 64 * 4);
  EXPECT_EQ(shape.ExpertBytesPerRank(2), 3 * 12 * 64 * 4);
}

TEST(ModelConfigTest, Qwen3_30BConfigGivesTheMemoryLayersPreset) {
  // The fuzz seed holds the HF config of Qwen3-30B-A3B; its shape must be the memory layer's
  // hand-written preset.
  auto c =
      LoadModelConfig(testing::SourceDir() + "/tests/fuzz/corpus_model_config/qwen3_30b_a3b.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelShape got = c->ToModelShape(2);
  const ModelShape want = Qwen3_30B_A3B_Shape();
  EXPECT_TRUE(got.Validate().ok()) << got.Validate();
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.moe_intermediate_size, want.moe_intermediate_size);
  EXPECT_EQ(got.num_experts, want.num_experts);
  EXPECT_EQ(got.num_experts_per_token, want.num_experts_per_token);
  EXPECT_EQ(got.moe_layers, want.moe_layers);
  EXPECT_EQ(got.attention_layers, want.attention_layers);
  EXPECT_EQ(got.num_q_heads, want.num_q_heads);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.dense_intermediate_size, want.dense_intermediate_size);
  for (int tp : {1, 2, 4}) {
    EXPECT_EQ(got.ExpertBytesPerRank(tp), want.ExpertBytesPerRank(tp));
    EXPECT_EQ(got.KvBytesPerTokenPerRank(tp), want.KvBytesPerTokenPerRank(tp));
    EXPECT_EQ(got.NonExpertWeightBytesPerRank(tp), want.NonExpertWeightBytesPerRank(tp));
  }
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->max_position_embeddings, 40960);
}

TEST(ModelConfigTest, AcceptsHfVariants) {
  auto j = TinyConfig();
  j.erase("architectures");  // model_type alone selects the architecture
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  j["eos_token_id"] = {2, 7};
  j["head_dim"] = nullptr;  // null means unset: hidden / heads
  j["mlp_only_layers"] = {1};
  j["intermediate_size"] = 96;
  j["decoder_sparse_step"] = 1;
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FALSE(c->IsMoeLayer(1));
  EXPECT_TRUE(c->IsMoeLayer(2));
  EXPECT_EQ(c->ToModelShape(2).dense_intermediate_size, 96);

  j["decoder_sparse_step"] = 2;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_FALSE(c->IsMoeLayer(1));  // listed in mlp_only_layers
  EXPECT_FALSE(c->IsMoeLayer(2));
}

struct BadCase {
  std::string what;
  std::function<void(nlohmann::json&)> edit;
  std::string expect;  // substring of the error message
};

TEST(ModelConfigTest, BadConfigsNameTheField) {
  const std::vector<BadCase> cases = {
      {"unknown architecture", [](auto& j) { j["architectures"] = {"LlamaForCausalLM"}; },
       "field 'architectures' names no supported architecture: [LlamaForCausalLM]"},
      {"unknown model_type",
       [](auto& j) {
         j.erase("architectures");
         j["model_type"] = "gpt2";
       },
       "field 'model_type' 'gpt2' is not supported"},
      {"mismatched model_type", [](auto& j) { j["model_type"] = "mixtral"; },
       "field 'model_type' 'mixtral' does not match"},
      {"missing hidden_size", [](auto& j) { j.erase("hidden_size"); },
       "field 'hidden_size' is missing"},
      {"string hidden_size", [](auto& j) { j["hidden_size"] = "64"; },
       "field 'hidden_size' must be an integer"},
      {"negative vocab", [](auto& j) { j["vocab_size"] = -1; }, "field 'vocab_size'"},
      {"float layers", [](auto& j) { j["num_hidden_layers"] = 2.5; }, "field 'num_hidden_layers'"},
      {"top-k above experts", [](auto& j) { j["num_experts_per_tok"] = 17; },
       "field 'num_experts_per_tok' must be an integer in [1, 16]"},
      {"missing experts", [](auto& j) { j.erase("num_experts"); },
       "field 'num_experts' is missing"},
      {"kv heads", [](auto& j) { j["num_key_value_heads"] = 3; },
       "field 'num_key_value_heads' (3) must divide num_attention_heads (4)"},
      {"odd head_dim", [](auto& j) { j["head_dim"] = 15; }, "field 'head_dim' must be even"},
      {"activation", [](auto& j) { j["hidden_act"] = "gelu"; }, "field 'hidden_act' 'gelu'"},
      {"bool as string", [](auto& j) { j["norm_topk_prob"] = "true"; },
       "field 'norm_topk_prob' must be true or false"},
      {"rope scaling",
       [](auto& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
       },
       "field 'rope_scaling' rope type 'yarn' is not supported"},
      {"eps", [](auto& j) { j["rms_norm_eps"] = -1; }, "field 'rms_norm_eps'"},
      {"mlp_only range", [](auto& j) { j["mlp_only_layers"] = {5}; }, "field 'mlp_only_layers'"},
      {"dense without width",
       [](auto& j) {
         j["mlp_only_layers"] = {0};
         j.erase("intermediate_size");
       },
       "field 'intermediate_size' is missing"},
      {"attention bias", [](auto& j) { j["attention_bias"] = true; },
       "field 'attention_bias' true is not supported"},
      {"architectures type", [](auto& j) { j["architectures"] = "Qwen3MoeForCausalLM"; },
       "field 'architectures' must be a list"},
  };
  for (const BadCase& c : cases) {
    auto j = TinyConfig();
    c.edit(j);
    auto parsed = ParseModelConfig(j.dump(), "m/config.json");
    ASSERT_FALSE(parsed.ok()) << c.what;
    EXPECT_NE(std::string(parsed.status().message()).find(c.expect), std::string::npos)
        << c.what << ": " << parsed.status();
    EXPECT_EQ(std::string(parsed.status().message()).rfind("m/config.json: ", 0), 0u)
        << c.what << ": the source file leads the message";
  }
}

TEST(ModelConfigTest, MalformedTextIsAnErrorNotACrash) {
  for (const std::string text : {"", "{", "[1, 2]", "null", "{\"hidden_size\": }", "\xff\xfe"}) {
    auto parsed = ParseModelConfig(text);
    EXPECT_FALSE(parsed.ok()) << text;
  }
  auto missing = LoadModelConfig("/nonexistent/dir");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vamp
