#include "controller/openai_response.h"

#include "absl/strings/str_split.h"
#include "controller/frontend/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::json;

// Bytes in, bytes out, with Qwen3's output conventions switched on.
class TaggedByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(absl::string_view text) const override {
    return bytes_->Encode(text);
  }
  void AppendTokenBytes(int32_t id, bool skip, std::string* out) const override {
    bytes_->AppendTokenBytes(id, skip, out);
  }
  absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplateInput& in) const override {
    return bytes_->ApplyChatTemplate(in);
  }
  std::string name() const override { return "tagged-bytes"; }
  bool has_think_tags() const override { return true; }
  bool has_tool_call_tags() const override { return true; }

 private:
  std::unique_ptr<ByteTokenizer> bytes_ = *ByteTokenizer::Create(256);
};

std::shared_ptr<const ServingContext> Context(std::shared_ptr<const Tokenizer> tokenizer) {
  auto c = std::make_shared<ServingContext>();
  c->model = ServedModel{"m", 1000, 256};
  c->tokenizer = std::move(tokenizer);
  return c;
}

// The events of generating `text` in pieces of `step` tokens, the last one finishing.
std::vector<EngineEvent> Events(const Tokenizer& t, const std::string& text, size_t step) {
  const std::vector<int32_t> ids = t.Encode(text);
  std::vector<EngineEvent> events;
  for (size_t i = 0; i < ids.size(); i += step) {
    EngineEvent e;
    e.token_ids.assign(ids.begin() + i, ids.begin() + std::min(ids.size(), i + step));
    events.push_back(e);
  }
  events.back().finished = true;
  events.back().finish_reason = FinishReason::kStop;
  events.back().prompt_tokens = 3;
  events.back().completion_tokens = static_cast<int32_t>(ids.size());
  return events;
}

std::vector<Json> Chunks(const std::string& sse) {
  std::vector<Json> out;
  for (absl::string_view line : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(line, "data: ")) << line;
    line.remove_prefix(6);
    if (line == "[DONE]") continue;
    EXPECT_TRUE(IsValidUtf8(line));
    out.push_back(Json::parse(line));
  }
  return out;
}

const char kAgentOutput[] =
    "<think>\nWeather needs a lookup \xE2\x98\x80\n</think>\n\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xC3\xBCrich\"}}\n</tool_call>";

TEST(OpenAiResponseWriterTest, StreamedChatSplitsReasoningAndToolCalls) {
  auto ctx = Context(std::make_shared<TaggedByteTokenizer>());
  ResponseOptions options;
  options.chat = true;
  options.include_usage = true;
  options.parse_reasoning = true;
  options.parse_tool_calls = true;
  for (size_t step : {1, 2, 5, 200}) {
    OpenAiResponseWriter writer(ctx, options, 7, 100);
    std::string reasoning, content;
    std::vector<Json> calls;
    Json last;
    bool saw_usage = false;
    for (const EngineEvent& e : Events(*ctx->tokenizer, kAgentOutput, step)) {
      for (const Json& chunk : Chunks(writer.StreamChunk(e))) {
        if (chunk["choices"].empty()) {
          saw_usage = chunk.contains("usage");
          continue;
        }
        const Json& delta = chunk["choices"][0]["delta"];
        reasoning += delta.value("reasoning_content", "");
        content += delta.value("content", "");
        if (delta.contains("tool_calls")) {
          for (const Json& c : delta["tool_calls"]) calls.push_back(c);
        }
        last = chunk;
      }
    }
    EXPECT_EQ(reasoning, "\nWeather needs a lookup \xE2\x98\x80\n") << step;
    EXPECT_EQ(content, "\n\n") << step;  // what follows </think>, before the call
    ASSERT_EQ(calls.size(), 1u) << step;
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(Json::parse(calls[0]["function"]["arguments"].get<std::string>()),
              Json({{"city", "Z\xC3\xBCrich"}}));
    EXPECT_EQ(last["choices"][0]["finish_reason"], "tool_calls") << step;
    EXPECT_TRUE(saw_usage);
  }
}

TEST(OpenAiResponseWriterTest, UnaryChatHasReasoningAndToolCalls) {
  auto ctx = Context(std::make_shared<TaggedByteTokenizer>());
  ResponseOptions options;
  options.chat = true;
  options.parse_reasoning = true;
  options.parse_tool_calls = true;
  OpenAiResponseWriter writer(ctx, options, 8, 100);
  std::vector<EngineEvent> events = Events(*ctx->tokenizer, kAgentOutput, 3);
  for (const EngineEvent& e : events) writer.Append(e);
  absl::StatusOr<std::string> body = writer.Finish(events.back());
  ASSERT_TRUE(body.ok());
  const Json j = Json::parse(*body);
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "\nWeather needs a lookup \xE2\x98\x80\n");
  EXPECT_EQ(choice["message"]["content"], "\n\n");  // as vLLM's hermes parser: text before the call
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
}

TEST(OpenAiResponseWriterTest, StreamedTextNeverSplitsACharacter) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD";
  for (bool chat : {false, true}) {
    OpenAiResponseWriter writer(ctx, chat, /*include_usage=*/false, 9, 100);
    std::string all;
    for (const EngineEvent& e : Events(*ctx->tokenizer, text, 1)) {
      for (const Json& chunk : Chunks(writer.StreamChunk(e))) {
        const Json& choice = chunk["choices"][0];
        const std::string piece = chat ? choice["delta"]["content"].get<std::string>()
                                       : choice["text"].get<std::string>();
        EXPECT_TRUE(IsValidUtf8(piece));
        all += piece;
      }
    }
    EXPECT_EQ(all, text);
  }
}

TEST(OpenAiResponseWriterTest, ToolCallsNotAskedForStayContent) {
  auto ctx = Context(std::make_shared<TaggedByteTokenizer>());
  // The old constructor: reasoning parsed (model-wide), tool calls not (no request options).
  OpenAiResponseWriter writer(ctx, /*chat=*/true, /*include_usage=*/false, 10, 100);
  std::vector<EngineEvent> events = Events(*ctx->tokenizer, kAgentOutput, 4);
  for (const EngineEvent& e : events) writer.Append(e);
  const Json j = Json::parse(*writer.Finish(events.back()));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_THAT(j["choices"][0]["message"]["content"].get<std::string>(),
              ::testing::HasSubstr("<tool_call>"));
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace vamp
