#include "tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <fstream>

#include "controller/frontend/openai_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/utf8.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// GPT-2's byte-level alphabet: how byte b is written in a vocabulary.
std::string ByteLevel(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int n = 0;
    char32_t cp = b;
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!printable) {
      for (int x = 0; x < b; ++x) {
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
      }
      cp = 256 + n;
    }
    AppendUtf8(cp, &out);
  }
  return out;
}

// 256 byte tokens (id = byte), then merged tokens in merge order, then added tokens.
Json SmallTokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevel(std::string(1, static_cast<char>(b)))] = b;
  Json m = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(ByteLevel(a + b))) vocab[ByteLevel(a + b)] = next++;
    m.push_back({ByteLevel(a), ByteLevel(b)});
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 1000}, {"content", "<|end|>"}, {"special", true}},
            {{"id", 1001}, {"content", "<think>"}, {"special", false}},
            {{"id", 1002}, {"content", "</think>"}, {"special", false}}}},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

std::unique_ptr<HfTokenizer> Load(const Json& j) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromJson(j.dump(), "tok.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(HfTokenizerTest, MergesByRankLeftmostFirst) {
  auto t = Load(SmallTokenizer({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}}));
  ASSERT_NE(t, nullptr);
  const int32_t he = t->TokenId("he"), hello = t->TokenId("hello"), aa = t->TokenId("aa");
  EXPECT_EQ(t->Encode("hello"), (std::vector<int32_t>{hello}));
  EXPECT_EQ(t->Encode("hel"), (std::vector<int32_t>{he, 'l'}));
  EXPECT_EQ(t->Encode("aaa"), (std::vector<int32_t>{aa, 'a'}));  // leftmost pair first
  // Pre-tokenization isolates " hello" and "!": the space stays a byte (no merge for it).
  EXPECT_EQ(t->Encode("hello hello!"), (std::vector<int32_t>{hello, ' ', hello, '!'}));
  EXPECT_EQ(t->Decode(t->Encode("hello hello!")), "hello hello!");
}

TEST(HfTokenizerTest, AddedTokensBeforeBpeAndSpecialOnesSkippedInDecode) {
  auto t = Load(SmallTokenizer({{"h", "e"}}));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("he<|end|>he<think>"),
            (std::vector<int32_t>{t->TokenId("he"), 1000, t->TokenId("he"), 1001}));
  EXPECT_EQ(t->Decode({'a', 1000, 'b', 1001}), "ab<think>");
  EXPECT_EQ(t->Decode({'a', 1000, 'b'}, /*skip_special_tokens=*/false), "a<|end|>b");
  EXPECT_EQ(t->Decode({5000, -1, 'x'}), "x");  // unknown ids: nothing
  EXPECT_TRUE(t->has_think_tags());
  EXPECT_FALSE(t->has_tool_call_tags());
  EXPECT_EQ(t->max_token_id(), 1002);
}

TEST(HfTokenizerTest, NfcAndInvalidUtf8) {
  auto t = Load(SmallTokenizer({}));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("e\xCC\x81"), (std::vector<int32_t>{0xC3, 0xA9}));   // é composed
  EXPECT_EQ(t->Encode("\xFF"), (std::vector<int32_t>{0xEF, 0xBF, 0xBD}));  // U+FFFD
  EXPECT_EQ(t->Decode({0xE2, 0x82}), "\xEF\xBF\xBD");  // a cut character decodes to U+FFFD
}

TEST(HfTokenizerTest, UnusableFilesNameTheField) {
  struct Case {
    std::function<void(Json&)> edit;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
      {[](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       "pre_tokenizer[0].pattern"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer[0].behavior"},
      {[](Json& j) { j["model"]["vocab"].erase(ByteLevel("a")); }, "model.vocab"},
      {[](Json& j) {
         j["model"]["merges"] = Json::array({Json::array({ByteLevel("q"), ByteLevel("z")})});
       },
       "model.merges[0]"},
      {[](Json& j) { j["model"]["merges"] = Json::array({"a b c"}); }, "model.merges[0]"},
      {[](Json& j) { j["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip"},
      {[](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder"},
      {[](Json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      // Found by fuzz_tokenizer_json: non-string "type" fields must not throw.
      {[](Json& j) { j["model"]["type"] = 5; }, "model.type"},
      {[](Json& j) { j["pre_tokenizer"]["type"] = 7; }, "pre_tokenizer[0]"},
      {[](Json& j) {
         j["normalizer"] = {{"type", {1}}};
       },
       "normalizer"},
  };
  for (const Case& c : cases) {
    Json j = SmallTokenizer({{"a", "b"}});
    c.edit(j);
    absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromJson(j.dump(), "tok.json");
    ASSERT_FALSE(t.ok()) << c.field;
    EXPECT_THAT(t.status().message(), HasSubstr(std::string("tok.json: ") + c.field));
  }
  EXPECT_FALSE(HfTokenizer::FromJson("{not json", "tok.json").ok());
  EXPECT_FALSE(HfTokenizer::FromJson("[]", "tok.json").ok());
}

class ModelFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("vamp_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ModelFolderTest, NoTokenizerJsonKeepsTheByteFallback) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadModelTokenizer(dir_.string(), 256);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name(), "byte-fallback");
}

TEST_F(ModelFolderTest, LoadsTokenizerAndTemplate) {
  Write("tokenizer.json", SmallTokenizer({{"h", "i"}}).dump());
  Write("tokenizer_config.json",
        Json({{"eos_token", "<|end|>"},
              {"chat_template",
               "{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"
               "{% if add_generation_prompt %}[assistant]{% endif %}"}})
            .dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadModelTokenizer(dir_.string(), 2000);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatTemplateInput input;
  input.messages = {{"user", "hi"}};
  EXPECT_EQ(*(*t)->ApplyChatTemplate(input), "[user]hi<|end|>[assistant]");
  // Ids beyond the model's vocabulary: refused.
  EXPECT_THAT(LoadModelTokenizer(dir_.string(), 1000).status().message(), HasSubstr("vocab_size"));
}

TEST_F(ModelFolderTest, TemplateThatOpensThinkingStartsTheOutputInReasoning) {
  Write("tokenizer.json", SmallTokenizer({}).dump());
  Write("tokenizer_config.json", Json({{"chat_template",
                                        "{% for m in messages %}{{ m.content }}{% endfor %}"
                                        "{% if add_generation_prompt %}<think>\n{% endif %}"}})
                                     .dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadModelTokenizer(dir_.string(), 2000);
  ASSERT_TRUE(t.ok()) << t.status();
  const ServedModel model{"m", 1000, 2000};
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "<think>a</think>hi"}]})", model, **t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.parse_reasoning);
  EXPECT_TRUE(r->response.reasoning_open);
  r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false})", model,
      **t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->response.reasoning_open);
}

TEST_F(ModelFolderTest, BrokenFilesFailNamingTheFile) {
  Write("tokenizer.json", "{broken");
  EXPECT_THAT(LoadModelTokenizer(dir_.string(), 2000).status().message(),
              HasSubstr("tokenizer.json"));
  Write("tokenizer.json", SmallTokenizer({}).dump());
  Write("tokenizer_config.json", R"({"chat_template": "{% for x in y %}unclosed"})");
  EXPECT_THAT(LoadModelTokenizer(dir_.string(), 2000).status().message(),
              HasSubstr("tokenizer_config.json chat_template"));
  Write("tokenizer_config.json", R"({"chat_template": "{{ x | no_such_filter }}"})");
  EXPECT_THAT(LoadModelTokenizer(dir_.string(), 2000).status().message(),
              HasSubstr("no_such_filter"));
}

}  // namespace
}  // namespace vamp
