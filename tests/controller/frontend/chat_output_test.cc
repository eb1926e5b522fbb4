#include "controller/frontend/chat_output.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

ResponseOptions Qwen3(bool tools) {
  ResponseOptions o;
  o.chat = true;
  o.parse_reasoning = true;
  o.parse_tool_calls = tools;
  return o;
}

TEST(ChatOutputTest, ReasoningNeedsBothTagsLikeVllm) {
  ChatOutput o = ParseChatOutput("<think>\nplan\n</think>\n\nanswer", Qwen3(false));
  EXPECT_EQ(o.reasoning_content, "\nplan\n");
  EXPECT_EQ(o.content, "\n\nanswer");
  o = ParseChatOutput("<think>cut off", Qwen3(false));
  EXPECT_FALSE(o.reasoning_content.has_value());
  EXPECT_EQ(o.content, "<think>cut off");
  o = ParseChatOutput("<think>all thought</think>", Qwen3(false));
  EXPECT_EQ(o.reasoning_content, "all thought");
  EXPECT_FALSE(o.content.has_value());
  o = ParseChatOutput("plain", Qwen3(false));
  EXPECT_FALSE(o.reasoning_content.has_value());
  EXPECT_EQ(o.content, "plain");
}

TEST(ChatOutputTest, ReasoningOpenedByThePromptEndsAtTheCloseTag) {
  ResponseOptions o = Qwen3(false);
  o.reasoning_open = true;  // e.g. Qwen3-Thinking-2507: "<|im_start|>assistant\n<think>\n"
  ChatOutput out = ParseChatOutput("plan\n</think>\n\nanswer", o);
  EXPECT_EQ(out.reasoning_content, "plan\n");
  EXPECT_EQ(out.content, "\n\nanswer");
  for (size_t step : {1, 3, 100}) {
    ChatStreamParser p(o);
    std::string reasoning, content;
    for (const std::string piece : {std::string("plan\n</th"), std::string("ink>\n\nanswer")}) {
      for (size_t i = 0; i < piece.size(); i += step) {
        ChatDelta d = p.Next(piece.substr(i, step));
        reasoning += d.reasoning_content;
        content += d.content;
      }
    }
    ChatDelta d = p.Finish();
    reasoning += d.reasoning_content;
    content += d.content;
    EXPECT_EQ(reasoning, "plan\n") << step;
    EXPECT_EQ(content, "\n\nanswer") << step;
  }
}

TEST(ChatOutputTest, ToolCallsLikeTheHermesParser) {
  ChatOutput o = ParseChatOutput(
      "<think>r</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
      "</tool_call>",
      Qwen3(true));
  EXPECT_EQ(o.reasoning_content, "r");
  EXPECT_EQ(o.content, "\n\nLet me check.\n");
  ASSERT_EQ(o.tool_calls.size(), 2u);
  EXPECT_EQ(o.tool_calls[0].name, "get_weather");
  EXPECT_EQ(o.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_THAT(o.tool_calls[0].id, ::testing::StartsWith("call_"));
  EXPECT_NE(o.tool_calls[0].id, o.tool_calls[1].id);
  EXPECT_EQ(o.tool_calls[1].arguments, "{}");
  // An unterminated last block still counts; a malformed one leaves everything as content.
  o = ParseChatOutput("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", Qwen3(true));
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_FALSE(o.content.has_value());
  o = ParseChatOutput("x<tool_call>{\"name\": 3}</tool_call>", Qwen3(true));
  EXPECT_TRUE(o.tool_calls.empty());
  EXPECT_EQ(o.content, "x<tool_call>{\"name\": 3}</tool_call>");
  // Tools not asked for: the text is content.
  o = ParseChatOutput("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", Qwen3(false));
  EXPECT_TRUE(o.tool_calls.empty());
}

TEST(ChatOutputTest, PrefixOpensTheCallAndParallelFalseKeepsOne) {
  ResponseOptions o = Qwen3(true);
  o.assistant_prefix = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
  o.parallel_tool_calls = false;
  ChatOutput out = ParseChatOutput(
      "{\"x\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", o);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "f");
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"x\":1}");
}

// Streams `text` in pieces of `step` bytes and collects what comes out.
ChatOutput Stream(const std::string& text, const ResponseOptions& o, size_t step,
                  bool check_tags = true) {
  ChatStreamParser p(o);
  ChatOutput out;
  std::string reasoning, content;
  auto take = [&](const ChatDelta& d) {
    reasoning += d.reasoning_content;
    content += d.content;
    for (const auto& c : d.tool_calls) {
      EXPECT_EQ(c.index, static_cast<int>(out.tool_calls.size()));
      out.tool_calls.push_back(c.call);
    }
    // No partial tag is ever sent.
    for (const char* tag : {"<think", "</think", "<tool_call", "</tool_call"}) {
      if (!check_tags) break;
      EXPECT_EQ(d.content.find(tag), std::string::npos) << d.content;
      EXPECT_EQ(d.reasoning_content.find(tag), std::string::npos) << d.reasoning_content;
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(p.Next(text.substr(i, step)));
  take(p.Finish());
  if (!reasoning.empty()) out.reasoning_content = reasoning;
  if (!content.empty()) out.content = content;
  return out;
}

TEST(ChatStreamParserTest, AnySplitGivesTheUnaryResult) {
  const std::string text =
      "<think>\nplan it\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"東京\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
      "\"arguments\": {}}\n</tool_call>";
  const ChatOutput want = ParseChatOutput(text, Qwen3(true));
  for (size_t step : {1, 2, 3, 5, 7, 11, 64, 1000}) {
    const ChatOutput got = Stream(text, Qwen3(true), step);
    EXPECT_EQ(got.reasoning_content, want.reasoning_content) << step;
    EXPECT_EQ(got.content, want.content) << step;
    ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << step;
    for (size_t k = 0; k < got.tool_calls.size(); ++k) {
      EXPECT_EQ(got.tool_calls[k].name, want.tool_calls[k].name);
      EXPECT_EQ(got.tool_calls[k].arguments, want.tool_calls[k].arguments);
    }
  }
}

TEST(ChatStreamParserTest, PlainTextAndLookalikesPassThrough) {
  for (const std::string text :
       {"just text", "a < b and <thinking> </tool", "<thin", "<tool_cal"}) {
    const ChatOutput got = Stream(text, Qwen3(true), 1, /*check_tags=*/false);
    EXPECT_EQ(got.content, text);
    EXPECT_FALSE(got.reasoning_content.has_value());
    EXPECT_TRUE(got.tool_calls.empty());
  }
  // Cut off while thinking: streamed as reasoning (the unary rule would call it content).
  EXPECT_EQ(Stream("<think>unfinished", Qwen3(false), 3).reasoning_content, "unfinished");
  // A malformed block goes out as text.
  EXPECT_EQ(Stream("<tool_call>oops</tool_call>", Qwen3(true), 2, /*check_tags=*/false).content,
            "<tool_call>oops</tool_call>");
}

TEST(ChatStreamParserTest, ForcedCallPrefixIsNotSentAsText) {
  ResponseOptions o = Qwen3(true);
  o.assistant_prefix = "<tool_call>\n";
  const ChatOutput got =
      Stream("{\"name\": \"f\", \"arguments\": {\"a\": [1]}}\n</tool_call>", o, 4);
  EXPECT_FALSE(got.content.has_value());
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].arguments, "{\"a\":[1]}");
}

}  // namespace
}  // namespace vamp
