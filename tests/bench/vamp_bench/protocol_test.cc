// vamp-bench's wire formats from canned bytes: SSE split anywhere, completion chunks (tokens,
// finish, usage, errors, [DONE]), the request body, and the Prometheus text format.
#include "bench/vamp_bench/protocol.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What vamp-controller's OpenAiResponseWriter sends for a 3-token streamed completion.
constexpr char kStream[] =
    "data: {\"id\":\"cmpl-1\",\"created\":1,\"model\":\"m\",\"object\":\"text_completion\","
    "\"choices\":[{\"index\":0,\"finish_reason\":null,\"token_ids\":[5,6],\"text\":\"ab\"}]}\n\n"
    "data: {\"id\":\"cmpl-1\",\"created\":1,\"model\":\"m\",\"object\":\"text_completion\","
    "\"choices\":[{\"index\":0,\"finish_reason\":\"length\",\"token_ids\":[7],\"text\":\"c\"}]}"
    "\n\n"
    "data: {\"id\":\"cmpl-1\",\"created\":1,\"model\":\"m\",\"object\":\"text_completion\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,\"total_tokens\":43,"
    "\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n"
    "data: [DONE]\n\n";

std::vector<std::string> Events(const std::string& bytes, size_t piece) {
  SseParser p;
  std::vector<std::string> out;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    p.Feed(absl::string_view(bytes).substr(i, piece),
           [&](absl::string_view d) { out.emplace_back(d); });
  }
  return out;
}

TEST(SseParserTest, SameEventsWhereverTheBytesAreSplit) {
  const std::vector<std::string> whole = Events(kStream, 1 << 20);
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(whole[3], "[DONE]");
  for (size_t piece : {1, 2, 3, 7, 64}) EXPECT_EQ(Events(kStream, piece), whole) << piece;
}

TEST(SseParserTest, CrlfCommentsMultiLineDataAndOtherFields) {
  const std::string bytes =
      ": keep-alive\r\n\r\nevent: x\r\nid: 3\r\ndata: a\r\ndata:b\r\n\r\ndata: tail";
  EXPECT_THAT(Events(bytes, 1), ElementsAre("a\nb"));
  SseParser p;
  p.Feed("data: tail", [](absl::string_view) { FAIL() << "incomplete event dispatched"; });
  EXPECT_EQ(p.buffered(), 10u);
}

TEST(CompletionChunkTest, TokensFinishUsageAndDone) {
  const std::vector<std::string> e = Events(kStream, 1 << 20);
  absl::StatusOr<CompletionChunk> a = ParseCompletionChunk(e[0]);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->token_ids, ElementsAre(5, 6));
  EXPECT_EQ(a->finish_reason, "");
  absl::StatusOr<CompletionChunk> b = ParseCompletionChunk(e[1]);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->finish_reason, "length");
  absl::StatusOr<CompletionChunk> u = ParseCompletionChunk(e[2]);
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->has_usage);
  EXPECT_EQ(u->prompt_tokens, 40);
  EXPECT_EQ(u->completion_tokens, 3);
  EXPECT_EQ(u->cached_tokens, 32);
  EXPECT_TRUE(u->token_ids.empty());
  absl::StatusOr<CompletionChunk> d = ParseCompletionChunk(e[3]);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->done);
}

TEST(CompletionChunkTest, ErrorsAndGarbage) {
  absl::StatusOr<CompletionChunk> c = ParseCompletionChunk(
      "{\"choices\":[{\"index\":0,\"finish_reason\":\"abort\",\"token_ids\":[],"
      "\"error\":\"agent 0 failed\"}]}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->error, "agent 0 failed");
  c = ParseCompletionChunk("{\"error\":{\"message\":\"prompt: too long\",\"code\":400}}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->error, "prompt: too long");
  c = ParseCompletionChunk("not json");
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not json"));
  EXPECT_FALSE(ParseCompletionChunk("{\"choices\":[{\"token_ids\":[\"x\"]}]}").ok());
}

TEST(CompletionRequestBodyTest, StreamingExactLengthTokenPrompt) {
  nlohmann::json j = nlohmann::json::parse(CompletionRequestBody({3, 1, 4}, 16, ""));
  EXPECT_EQ(j["prompt"], nlohmann::json({3, 1, 4}));
  EXPECT_EQ(j["max_tokens"], 16);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_FALSE(j.contains("model"));
  j = nlohmann::json::parse(CompletionRequestBody({}, 1, "qwen \"3\""));
  EXPECT_EQ(j["model"], "qwen \"3\"");
}

TEST(PrometheusTextTest, ParsesSamplesLabelsAndSpecialValues) {
  absl::StatusOr<std::vector<PromSample>> s = ParsePrometheusText(
      "# HELP vamp_kv_pool_blocks KV blocks\n"
      "# TYPE vamp_kv_pool_blocks gauge\n"
      "vamp_kv_pool_blocks 1024\n"
      "vamp_arbiter_decisions_total{action=\"offload\"} 3 1700000000000\n"
      "vamp_x{a=\"q\\\"uote\",b=\"n\\\\l\"} NaN\n"
      "vamp_y +Inf\n\n");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[0].name, "vamp_kv_pool_blocks");
  EXPECT_EQ((*s)[0].value, 1024);
  EXPECT_EQ((*s)[1].labels.at("action"), "offload");
  EXPECT_EQ((*s)[1].value, 3);
  EXPECT_EQ((*s)[2].labels.at("a"), "q\"uote");
  EXPECT_EQ((*s)[2].labels.at("b"), "n\\l");
  EXPECT_TRUE(std::isnan((*s)[2].value));
  EXPECT_TRUE(std::isinf((*s)[3].value));
  absl::StatusOr<std::vector<PromSample>> bad = ParsePrometheusText("ok 1\nbroken{a=\"x} 2\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
  EXPECT_FALSE(ParsePrometheusText("novalue\n").ok());
}

}  // namespace
}  // namespace vamp::bench
