// Qwen3's tokenizer and chat template against goldens from the reference implementation
// (tests/data/tokenizer/qwen3-goldens.json, made by make_qwen3_goldens.mjs with
// @huggingface/transformers). Needs tests/data/qwen3-30b-a3b/tokenizer.json, which the CTest
// fixture (scripts/fetch-tokenizers.sh) places there before these tests run.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "controller/frontend/openai_api.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/hf_tokenizer.h"

namespace vamp {
namespace {

using Json = nlohmann::ordered_json;

const std::string kModel = std::string(VAMP_TEST_DATA_DIR) + "/qwen3-30b-a3b";

const HfTokenizer& Qwen3() {
  static const HfTokenizer* t = [] {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> loaded = HfTokenizer::FromModelFolder(kModel);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status()
                    << " (scripts/fetch-tokenizers.sh places Qwen3's tokenizer there)";
      std::abort();
    }
    return loaded->release();
  }();
  return *t;
}

const Json& Goldens() {
  static const Json* g = [] {
    // VAMP_TOKENIZER_GOLDENS: another file of the same format, for ad-hoc differential runs
    // (e.g. thousands of random strings from the reference).
    const char* override_path = std::getenv("VAMP_TOKENIZER_GOLDENS");
    std::ifstream in(override_path != nullptr
                         ? std::string(override_path)
                         : std::string(VAMP_TEST_DATA_DIR) + "/tokenizer/qwen3-goldens.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return new Json(Json::parse(ss.str()));
  }();
  return *g;
}

std::string Input(const Json& s) {
  if (s.contains("text")) return s["text"].get<std::string>();
  return absl::HexStringToBytes(s["hex"].get<std::string>());
}

TEST(Qwen3TokenizerGoldenTest, EncodesAndDecodesEveryStringLikeTheReference) {
  const HfTokenizer& t = Qwen3();
  const Json& strings = Goldens()["strings"];
  ASSERT_GE(strings.size(), std::getenv("VAMP_TOKENIZER_GOLDENS") != nullptr ? 1u : 200u);
  int encode_ok = 0, decode_ok = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const Json& s = strings[i];
    const std::string input = Input(s);
    const std::vector<int32_t> want = s["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = t.Encode(input);
    EXPECT_EQ(got, want) << "string " << i << ": " << s.dump();
    encode_ok += got == want;
    const std::string decoded = t.Decode(want, /*skip_special_tokens=*/false);
    EXPECT_EQ(decoded, s["decoded"].get<std::string>()) << "string " << i;
    decode_ok += decoded == s["decoded"].get<std::string>();
    // Streaming, one token at a time: whole characters only, and the same text in the end.
    StreamDecoder stream(&t, /*skip_special_tokens=*/false);
    std::string streamed;
    for (int32_t id : want) {
      const std::string chunk = stream.Next({id});
      streamed += chunk;
    }
    streamed += stream.Finish();
    EXPECT_EQ(streamed, decoded) << "string " << i;
  }
  std::cout << "[ goldens ] encode " << encode_ok << "/" << strings.size() << ", decode "
            << decode_ok << "/" << strings.size() << "\n";
}

TEST(Qwen3TokenizerGoldenTest, RendersEveryConversationLikeTheReference) {
  const HfTokenizer& t = Qwen3();
  const Json& conversations = Goldens()["conversations"];
  ASSERT_GE(conversations.size(), 30u);
  const ServedModel model{"qwen3", 40960, 151936};
  int ok = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    const Json& c = conversations[i];
    Json body = {{"model", "qwen3"}, {"messages", c["messages"]}, {"max_tokens", 1}};
    if (c.contains("tools")) body["tools"] = c["tools"];
    if (c.contains("kwargs")) body["chat_template_kwargs"] = c["kwargs"];
    body["add_generation_prompt"] = c["add_generation_prompt"];
    absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(body.dump(), model, t);
    ASSERT_TRUE(r.ok()) << "conversation " << i << ": " << r.status();
    const std::string text = t.Decode(r->prompts[0], /*skip_special_tokens=*/false);
    EXPECT_EQ(text, c["text"].get<std::string>()) << "conversation " << i;
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(r->prompts[0], want) << "conversation " << i;
    ok += text == c["text"].get<std::string>() && r->prompts[0] == want;
  }
  std::cout << "[ goldens ] conversations " << ok << "/" << conversations.size() << "\n";
}

TEST(Qwen3ChatRequestTest, ToolChoiceDecidesParsingAndOpensTheReply) {
  const HfTokenizer& t = Qwen3();
  const ServedModel model{"qwen3", 40960, 151936};
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}])";
  auto parse = [&](const std::string& extra) {
    return ParseChatCompletionRequest(
        R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": )" + tools +
            extra + "}",
        model, t);
  };
  absl::StatusOr<OpenAiRequest> r = parse("");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.parse_tool_calls);
  EXPECT_TRUE(r->response.parse_reasoning);
  EXPECT_FALSE(r->response.reasoning_open);  // Qwen3's prompt does not open <think> itself
  EXPECT_EQ(r->response.assistant_prefix, "");
  r = parse(R"(, "tool_choice": "none")");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->response.parse_tool_calls);
  r = parse(R"(, "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": false})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->response.assistant_prefix, "<tool_call>\n");
  std::string text = t.Decode(r->prompts[0], false);
  EXPECT_TRUE(absl::EndsWith(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"))
      << text;
  r = parse(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  text = t.Decode(r->prompts[0], false);
  EXPECT_TRUE(absl::EndsWith(
      text, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "))
      << text;
  // The template's own variables cannot be overridden through chat_template_kwargs.
  r = parse(R"(, "chat_template_kwargs": {"messages": []})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(std::string(*r.status().GetPayload(kParamPayload)), "chat_template_kwargs.messages");
}

TEST(Qwen3ChatRequestTest, DeveloperMessagesAreTheSystemPrompt) {
  const HfTokenizer& t = Qwen3();
  const ServedModel model{"qwen3", 40960, 151936};
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": "Hi"}]})",
      model, t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(t.Decode(r->prompts[0], false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(Qwen3ChatRequestTest, EosAndTagsAreWhereTheModelExpectsThem) {
  const HfTokenizer& t = Qwen3();
  EXPECT_EQ(t.TokenId("<|im_end|>"), 151645);
  EXPECT_EQ(t.TokenId("<think>"), 151667);
  EXPECT_EQ(t.TokenId("<tool_call>"), 151657);
  EXPECT_TRUE(t.has_think_tags());
  EXPECT_TRUE(t.has_tool_call_tags());
  EXPECT_EQ(t.max_token_id(), 151668);
  // <|im_end|> is special (dropped from output text), <think> is not.
  EXPECT_EQ(t.Decode({151667, 9707, 151668, 151645}), "<think>Hello</think>");
}

}  // namespace
}  // namespace vamp
