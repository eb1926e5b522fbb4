#include "controller/frontend/chat_output.h"

#include <set>
#include <string>
#include <vector>

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
    for (const std::string& piece : {std::string("plan\n</th"), std::string("ink>\n\nanswer")}) {
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

// Streams `text` in pieces of `step` bytes and collects what comes out: a call's first piece
// (id and name) starts it, later pieces (neither) add to its arguments. `pieces`, when set,
// receives each call's number of pieces.
ChatOutput Stream(const std::string& text, const ResponseOptions& o, size_t step,
                  bool check_tags = true, std::vector<int>* pieces = nullptr) {
  ChatStreamParser p(o);
  ChatOutput out;
  std::string reasoning, content;
  std::vector<int> counts;
  auto take = [&](const ChatDelta& d) {
    reasoning += d.reasoning_content;
    content += d.content;
    std::set<int> seen;
    for (const auto& c : d.tool_calls) {
      EXPECT_TRUE(seen.insert(c.index).second) << "two pieces of call " << c.index;
      if (!c.call.id.empty()) {
        EXPECT_EQ(c.index, static_cast<int>(out.tool_calls.size()));
        EXPECT_FALSE(c.call.name.empty());
        out.tool_calls.push_back(c.call);
        counts.push_back(1);
        continue;
      }
      EXPECT_TRUE(c.call.name.empty());
      ASSERT_EQ(c.index + 1, static_cast<int>(out.tool_calls.size())) << "a piece of a past call";
      out.tool_calls.back().arguments += c.call.arguments;
      ++counts.back();
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
  if (pieces != nullptr) *pieces = counts;
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

// Calls in Qwen3's order stream as OpenAI's do: the first piece names the call with arguments "",
// later pieces carry the arguments as they are generated (the model's text, whitespace between
// tokens dropped), adding up to the unary arguments.
TEST(ChatStreamParserTest, ArgumentsStreamPieceByPiece) {
  const std::string text =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a \\\"b\\\" </c>\", "
      "\"limit\": 1.50, \"tags\": [\"x\", {}]}}\n</tool_call>";
  const ChatOutput want = ParseChatOutput(text, Qwen3(true));
  ASSERT_EQ(want.tool_calls.size(), 1u);
  EXPECT_EQ(want.tool_calls[0].arguments,
            "{\"query\":\"a \\\"b\\\" </c>\",\"limit\":1.50,\"tags\":[\"x\",{}]}");
  for (size_t step : {1, 2, 3, 8, 13}) {
    std::vector<int> pieces;
    const ChatOutput got = Stream(text, Qwen3(true), step, true, &pieces);
    ASSERT_EQ(got.tool_calls.size(), 1u) << step;
    EXPECT_EQ(got.tool_calls[0].name, "search");
    EXPECT_EQ(got.tool_calls[0].arguments, want.tool_calls[0].arguments) << step;
    EXPECT_FALSE(got.content.has_value()) << step;
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_GT(pieces[0], 2) << step;  // the name, then the arguments in several pieces
  }
  // The first piece: id and name with arguments "", as soon as the arguments value opens.
  ChatStreamParser p(Qwen3(true));
  EXPECT_TRUE(p.Next("<tool_call>\n{\"name\": \"search\", \"argu").tool_calls.empty());
  ChatDelta d = p.Next("ments\": {\"q");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].call.name, "search");
  EXPECT_THAT(d.tool_calls[0].call.id, ::testing::StartsWith("call_"));
  EXPECT_EQ(d.tool_calls[0].call.arguments, "");
  EXPECT_TRUE(p.called_tools());
  d = p.Next("uery\": 7}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].call.id.empty());
  EXPECT_EQ(d.tool_calls[0].call.arguments, "{\"query\":7}");
  EXPECT_TRUE(p.Finish().empty());
}

// Blocks in another order, or with scalar arguments, cannot stream: they go out whole, as before;
// output cut off inside streamed arguments ends the call with what was generated.
TEST(ChatStreamParserTest, OtherBlocksGoOutWholeAndCutOffArgumentsEndTheCall) {
  const std::string text =
      "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>"
      "<tool_call>{\"name\": \"g\", \"arguments\": \"raw\"}</tool_call>";
  const ChatOutput want = ParseChatOutput(text, Qwen3(true));
  ASSERT_EQ(want.tool_calls.size(), 2u);
  EXPECT_EQ(want.tool_calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(want.tool_calls[1].arguments, "\"raw\"");
  for (size_t step : {1, 4, 100}) {
    std::vector<int> pieces;
    const ChatOutput got = Stream(text, Qwen3(true), step, true, &pieces);
    ASSERT_EQ(got.tool_calls.size(), 2u) << step;
    EXPECT_EQ(got.tool_calls[0].name, "f");
    EXPECT_EQ(got.tool_calls[0].arguments, want.tool_calls[0].arguments);
    EXPECT_EQ(got.tool_calls[1].name, "g");
    EXPECT_EQ(got.tool_calls[1].arguments, want.tool_calls[1].arguments);
    EXPECT_EQ(pieces, (std::vector<int>{1, 1})) << step;
  }
  const ChatOutput cut =
      Stream("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, ", Qwen3(true), 3);
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].arguments, "{\"a\":[1,");
}

}  // namespace
}  // namespace vamp
