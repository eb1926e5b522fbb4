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

// ---- qwen3_next ----

// The published Qwen3-Next-80B-A3B dimensions (shared/DESIGN.md "Model shapes"), in the
// transformers 4.x form of the released checkpoints (full_attention_interval, top-level
// partial_rotary_factor and rope_theta).
nlohmann::json Qwen3Next80BConfig() {
  return {{"architectures", {"Qwen3NextForCausalLM"}},
          {"model_type", "qwen3_next"},
          {"vocab_size", 151936},
          {"hidden_size", 2048},
          {"intermediate_size", 5120},
          {"num_hidden_layers", 48},
          {"full_attention_interval", 4},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 2},
          {"head_dim", 256},
          {"partial_rotary_factor", 0.25},
          {"rope_theta", 10000000},
          {"linear_num_key_heads", 16},
          {"linear_num_value_heads", 32},
          {"linear_key_head_dim", 128},
          {"linear_value_head_dim", 128},
          {"linear_conv_kernel_dim", 4},
          {"num_experts", 512},
          {"num_experts_per_tok", 10},
          {"moe_intermediate_size", 512},
          {"shared_expert_intermediate_size", 512},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", nlohmann::json::array()},
          {"max_position_embeddings", 262144},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false},
          {"mtp_num_hidden_layers", 1}};
}

TEST(ModelConfigTest, Qwen3Next80BConfigGivesTheMemoryLayersPreset) {
  auto c = ParseModelConfig(Qwen3Next80BConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Next);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_TRUE(c->attention_output_gate);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  for (int l = 0; l < 48; ++l) EXPECT_EQ(c->IsFullAttentionLayer(l), l % 4 == 3) << l;
  const ModelShape got = c->ToModelShape(2);
  const ModelShape want = Qwen3Next_80B_A3B_Shape();
  EXPECT_TRUE(got.Validate().ok()) << got.Validate();
  EXPECT_EQ(got.moe_layers, want.moe_layers);
  EXPECT_EQ(got.attention_layers, want.attention_layers);
  EXPECT_EQ(got.shared_expert_intermediate_size, want.shared_expert_intermediate_size);
  EXPECT_EQ(got.attention_output_gate, want.attention_output_gate);
  EXPECT_EQ(got.linear_attention_params_per_layer, want.linear_attention_params_per_layer);
  for (int tp : {1, 2, 4}) {
    EXPECT_EQ(got.ExpertBytesPerRank(tp), want.ExpertBytesPerRank(tp));
    EXPECT_EQ(got.KvBytesPerTokenPerRank(tp), want.KvBytesPerTokenPerRank(tp));
    EXPECT_EQ(got.NonExpertWeightBytesPerRank(tp), want.NonExpertWeightBytesPerRank(tp));
    EXPECT_EQ(got.RecurrentStateBytesPerSeqPerRank(tp), want.RecurrentStateBytesPerSeqPerRank(tp));
  }
}

TEST(ModelConfigTest, Qwen3NextVariants) {
  // transformers 5 writes layer_types and keeps partial_rotary_factor in rope_parameters.
  auto j = Qwen3Next80BConfig();
  j.erase("full_attention_interval");
  j.erase("partial_rotary_factor");
  j.erase("rope_theta");
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  j["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 5e6}, {"partial_rotary_factor", 0.5}};
  j.erase("head_dim");        // HF's default: 256
  j.erase("norm_topk_prob");  // HF's default for qwen3_next: true
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->rotary_dim, 128);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_EQ(c->ToModelShape(2).attention_layers, (std::vector<int>{0, 2}));
  // Both forms of the layout, agreeing.
  j["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
  j["full_attention_interval"] = 2;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ToModelShape(2).attention_layers, (std::vector<int>{1}));
  // Full attention only: the linear-attention fields are not needed.
  j["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  j.erase("full_attention_interval");
  j.erase("linear_num_key_heads");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ToModelShape(2).linear_attention_params_per_layer, 0);
}

TEST(ModelConfigTest, BadQwen3NextConfigsNameTheField) {
  const std::vector<BadCase> cases = {
      {"no layout", [](auto& j) { j.erase("full_attention_interval"); },
       "field 'layer_types' is missing (and so is 'full_attention_interval')"},
      {"layer_types length", [](auto& j) { j["layer_types"] = {"full_attention"}; },
       "field 'layer_types' has 1 entries; num_hidden_layers is 48"},
      {"layer_types entry",
       [](auto& j) {
         j["num_hidden_layers"] = 2;
         j.erase("full_attention_interval");
         j["layer_types"] = {"linear_attention", "sliding_attention"};
       },
       "field 'layer_types' entry 1 is 'sliding_attention'"},
      {"layer_types not strings",
       [](auto& j) {
         j["layer_types"] = {1, 2};
       },
       "field 'layer_types' must be a list of strings"},
      {"disagreeing interval",
       [](auto& j) {
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"linear_attention", "full_attention"};
         j["full_attention_interval"] = 1;
       },
       "field 'full_attention_interval' (1) disagrees with 'layer_types'"},
      {"missing key heads", [](auto& j) { j.erase("linear_num_key_heads"); },
       "field 'linear_num_key_heads' is missing"},
      {"missing value dim", [](auto& j) { j.erase("linear_value_head_dim"); },
       "field 'linear_value_head_dim' is missing"},
      {"value heads", [](auto& j) { j["linear_num_value_heads"] = 24; },
       "field 'linear_num_value_heads' (24) must be a multiple of linear_num_key_heads (16)"},
      {"missing shared expert", [](auto& j) { j.erase("shared_expert_intermediate_size"); },
       "field 'shared_expert_intermediate_size' is missing"},
      {"odd rotary", [](auto& j) { j["partial_rotary_factor"] = 0.02; },
       "field 'partial_rotary_factor' (0.02) times head_dim (256) must give an even rotary "
       "dimension"},
      {"rotary above 1", [](auto& j) { j["partial_rotary_factor"] = 1.5; },
       "field 'partial_rotary_factor' must be a number in [0, 1]"},
      {"conv kernel", [](auto& j) { j["linear_conv_kernel_dim"] = 0; },
       "field 'linear_conv_kernel_dim' must be an integer in [1, 64]"},
      {"interval", [](auto& j) { j["full_attention_interval"] = 0; },
       "field 'full_attention_interval' must be an integer"},
  };
  for (const BadCase& c : cases) {
    auto j = Qwen3Next80BConfig();
    c.edit(j);
    auto parsed = ParseModelConfig(j.dump(), "m/config.json");
    ASSERT_FALSE(parsed.ok()) << c.what;
    EXPECT_NE(std::string(parsed.status().message()).find(c.expect), std::string::npos)
        << c.what << ": " << parsed.status();
  }
}

}  // namespace
}  // namespace vamp
