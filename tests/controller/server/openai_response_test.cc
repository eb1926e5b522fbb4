#include "controller/server/openai_response.h"

#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/utf8.h"

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
    std::vector<Json> calls;  // every tool_calls entry, in order
    Json last;
    bool saw_usage = false;
    for (const EngineEvent& e : Events(*ctx->tokenizer, kAgentOutput, step)) {
      for (const Json& chunk : Chunks(writer.StreamChunk(0, e))) {
        if (chunk["choices"].empty()) {
          saw_usage = chunk.contains("usage");
          continue;
        }
        const Json& delta = chunk["choices"][0]["delta"];
        reasoning += delta.value("reasoning_content", "");
        content += delta.value("content", "");
        if (delta.contains("tool_calls")) {
          ASSERT_EQ(delta["tool_calls"].size(), 1u) << "one entry per call and chunk";
          calls.push_back(delta["tool_calls"][0]);
        }
        last = chunk;
      }
    }
    EXPECT_EQ(reasoning, "\nWeather needs a lookup \xE2\x98\x80\n") << step;
    EXPECT_EQ(content, "\n\n") << step;  // what follows </think>, before the call
    // OpenAI's streaming shape: the first entry names the call (id, type, name; arguments "" when
    // more entries follow), the others only add to its arguments.
    ASSERT_FALSE(calls.empty()) << step;
    std::string arguments;
    for (size_t i = 0; i < calls.size(); ++i) {
      const Json& c = calls[i];
      EXPECT_EQ(c["index"], 0);
      EXPECT_EQ(c.contains("id"), i == 0) << step << " " << c;
      EXPECT_EQ(c.contains("type"), i == 0) << step << " " << c;
      EXPECT_EQ(c["function"].contains("name"), i == 0) << step << " " << c;
      arguments += c["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["type"], "function");
    if (calls.size() > 1) {
      EXPECT_EQ(calls[0]["function"]["arguments"], "") << step;
    }
    // In small events the arguments arrive in pieces; in one event the call comes whole.
    if (step < 200) {
      EXPECT_GT(calls.size(), 2u) << step;
    } else {
      EXPECT_EQ(calls.size(), 1u);
    }
    EXPECT_EQ(arguments, "{\"city\":\"Z\xC3\xBCrich\"}") << step;
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
  for (const EngineEvent& e : events) writer.Append(0, e);
  absl::StatusOr<std::string> body = writer.Finish();
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
      for (const Json& chunk : Chunks(writer.StreamChunk(0, e))) {
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
  for (const EngineEvent& e : events) writer.Append(0, e);
  const Json j = Json::parse(*writer.Finish());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_THAT(j["choices"][0]["message"]["content"].get<std::string>(),
              ::testing::HasSubstr("<tool_call>"));
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

// A completion's SSE output: the concatenated text per choice index, and the parsed chunks.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, Json> finish_reason;
  std::optional<Json> usage;
  bool done = false;
};
void Collect(const std::string& sse, Streamed* out) {
  if (absl::StrContains(sse, "data: [DONE]")) out->done = true;
  for (const Json& chunk : Chunks(sse)) {
    if (chunk["choices"].empty()) {
      out->usage = chunk["usage"];
      continue;
    }
    const Json& c = chunk["choices"][0];
    out->text[c["index"].get<int>()] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) out->finish_reason[c["index"].get<int>()] = c["finish_reason"];
  }
}

TEST(OpenAiResponseWriterTest, StopStringEndsTheTextAndIsNeverPartlyStreamed) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  ResponseOptions options;
  options.include_usage = true;
  options.stop = {"STOP", "\n\n"};
  for (size_t step : {1, 2, 3, 100}) {
    OpenAiResponseWriter writer(ctx, options, 11, 100);
    Streamed s;
    std::vector<EngineEvent> events = Events(*ctx->tokenizer, "one ST two STOP three", step);
    int completion = 0;
    for (EngineEvent& e : events) {
      completion += static_cast<int>(e.token_ids.size());
      e.completion_tokens = completion;
      e.prompt_tokens = 3;
      const std::string sse = writer.StreamChunk(0, e);
      EXPECT_FALSE(absl::StrContains(sse, "STO")) << step;
      Collect(sse, &s);
      if (writer.done()) {
        // The choice ended at the event that completed the stop string, before the engine did.
        // "one ST two STOP" are 15 byte tokens: usage counts the events' tokens up to there.
        EXPECT_EQ(completion, std::min<int>(21, (15 + step - 1) / step * step)) << step;
        EXPECT_EQ(e.finished, step > 15) << step;
        break;
      }
    }
    EXPECT_TRUE(writer.choice_done(0));
    EXPECT_EQ(s.text[0], "one ST two ") << step;
    EXPECT_EQ(s.finish_reason[0], "stop");
    ASSERT_TRUE(s.usage.has_value());
    EXPECT_EQ((*s.usage)["completion_tokens"], std::min<int>(21, (15 + step - 1) / step * step));
    EXPECT_TRUE(s.done);
  }
}

TEST(OpenAiResponseWriterTest, UnaryStopStringAndEcho) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  ResponseOptions options;
  options.stop = {"\n"};
  options.echo = {"Q: "};
  OpenAiResponseWriter writer(ctx, options, 12, 100);
  for (const EngineEvent& e : Events(*ctx->tokenizer, "answer\nmore", 4)) {
    writer.Append(0, e);
    if (writer.done()) break;
  }
  ASSERT_TRUE(writer.done());
  const Json j = Json::parse(*writer.Finish());
  EXPECT_EQ(j["choices"][0]["text"], "Q: answer");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiResponseWriterTest, ChoicesAreIndexedAndUsageCountsThePromptOnce) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  ResponseOptions options;
  options.n = 3;
  options.include_usage = true;
  options.echo = {">"};
  OpenAiResponseWriter streamed(ctx, options, 13, 100);
  OpenAiResponseWriter unary(ctx, options, 14, 100);
  const std::vector<std::string> texts = {"a", "bb", "ccc"};
  std::vector<std::vector<EngineEvent>> events;
  for (const std::string& t : texts) events.push_back(Events(*ctx->tokenizer, t, 1));
  Streamed s;
  // Interleaved by index, as the engine's events arrive.
  for (size_t k = 0; k < 3; ++k) {
    for (int i = 0; i < 3; ++i) {
      if (k >= events[i].size()) continue;
      EXPECT_FALSE(s.done);
      Collect(streamed.StreamChunk(i, events[i][k]), &s);
      unary.Append(i, events[i][k]);
    }
  }
  EXPECT_TRUE(s.done);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.text[i], ">" + texts[i]);
    EXPECT_EQ(s.finish_reason[i], "stop");
  }
  ASSERT_TRUE(s.usage.has_value());
  EXPECT_EQ((*s.usage)["prompt_tokens"], 3);
  EXPECT_EQ((*s.usage)["completion_tokens"], 6);
  EXPECT_EQ((*s.usage)["total_tokens"], 9);
  ASSERT_TRUE(unary.done());
  const Json j = Json::parse(*unary.Finish());
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], ">" + texts[i]);
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
}

// A batch of 2 prompts x n = 2: choice i answers prompt i / 2 and echoes it; streamed chunks
// arrive interleaved by index in whatever order the engine sends them; usage counts each
// prompt's tokens once (3 + 5) and sums every completion; cached tokens are per prompt.
TEST(OpenAiResponseWriterTest, BatchChoicesAreIndexedByPromptThenChoice) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  ResponseOptions options;
  options.num_prompts = 2;
  options.n = 2;
  options.include_usage = true;
  options.echo = {"P0:", "P1:"};
  OpenAiResponseWriter streamed(ctx, options, 21, 100);
  OpenAiResponseWriter unary(ctx, options, 22, 100);
  const std::vector<std::string> texts = {"a", "bb", "ccc", "dddd"};
  std::vector<std::vector<EngineEvent>> events;
  for (int i = 0; i < 4; ++i) {
    events.push_back(Events(*ctx->tokenizer, texts[i], 1));
    for (EngineEvent& e : events.back()) {
      e.prompt_tokens = i < 2 ? 3 : 5;
      e.cached_prompt_tokens = i == 1 ? 2 : (i == 3 ? 4 : 0);
    }
  }
  Streamed s;
  std::vector<int> order;  // choices of chunks as sent
  // Later choices first, then interleaved: the writer keeps every choice apart.
  for (size_t k = 0; k < 4; ++k) {
    for (int i = 3; i >= 0; --i) {
      if (k >= events[i].size()) continue;
      EXPECT_FALSE(s.done);
      const std::string sse = streamed.StreamChunk(i, events[i][k]);
      for (const Json& chunk : Chunks(sse)) {
        if (!chunk["choices"].empty()) order.push_back(chunk["choices"][0]["index"].get<int>());
      }
      Collect(sse, &s);
      unary.Append(i, events[i][k]);
    }
  }
  EXPECT_TRUE(s.done);
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1, 0, 3, 2, 1, 3, 2, 3}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.text[i], (i < 2 ? "P0:" : "P1:") + texts[i]) << i;
    EXPECT_EQ(s.finish_reason[i], "stop");
  }
  ASSERT_TRUE(s.usage.has_value());
  EXPECT_EQ((*s.usage)["prompt_tokens"], 8);
  EXPECT_EQ((*s.usage)["completion_tokens"], 10);
  EXPECT_EQ((*s.usage)["total_tokens"], 18);
  EXPECT_EQ((*s.usage)["prompt_tokens_details"]["cached_tokens"], 6);
  ASSERT_TRUE(unary.done());
  const Json j = Json::parse(*unary.Finish());
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], (i < 2 ? "P0:" : "P1:") + texts[i]);
  }
  EXPECT_EQ(j["usage"], *s.usage);
}

TEST(OpenAiResponseWriterTest, LogprobsInOpenAisShapes) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  auto with_logprobs = [](std::vector<EngineEvent> events) {
    for (EngineEvent& e : events) {
      for (int32_t t : e.token_ids) e.logprobs.push_back(-0.5f * static_cast<float>(t % 3));
    }
    return events;
  };
  const std::vector<EngineEvent> events = with_logprobs(Events(*ctx->tokenizer, "ab\xC3\xA9", 2));
  // Completions, unary: tokens, token_logprobs, top_logprobs (the token itself), text_offset.
  ResponseOptions options;
  options.logprobs = true;
  OpenAiResponseWriter unary(ctx, options, 15, 100);
  for (const EngineEvent& e : events) unary.Append(0, e);
  const Json j = Json::parse(*unary.Finish());
  const Json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), 4u);
  EXPECT_EQ(lp["tokens"][0], "a");
  EXPECT_FLOAT_EQ(lp["token_logprobs"][0].get<float>(), -0.5f * ('a' % 3));
  EXPECT_EQ(lp["text_offset"], Json({0, 1, 2, 3}));
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["b"].get<float>(), -0.5f * ('b' % 3));
  // Completions, streamed: text_offset counts from the start of the choice's text, across chunks
  // (regression: each chunk restarted at 0).
  OpenAiResponseWriter streamed_text(ctx, options, 18, 100);
  Json offsets = Json::array();
  for (const EngineEvent& e : events) {
    for (const Json& chunk : Chunks(streamed_text.StreamChunk(0, e))) {
      for (const Json& o : chunk["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
    }
  }
  EXPECT_EQ(offsets, Json({0, 1, 2, 3}));
  // Chat, streamed: per chunk, content entries with the token's bytes.
  options.chat = true;
  OpenAiResponseWriter streamed(ctx, options, 16, 100);
  std::vector<Json> entries;
  for (const EngineEvent& e : events) {
    for (const Json& chunk : Chunks(streamed.StreamChunk(0, e))) {
      for (const Json& entry : chunk["choices"][0]["logprobs"]["content"]) entries.push_back(entry);
    }
  }
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0]["token"], "a");
  EXPECT_EQ(entries[2]["bytes"], Json({0xC3}));  // half of a character: its own byte
  EXPECT_TRUE(entries[3]["top_logprobs"].empty());
  // Not asked for: null, as before.
  OpenAiResponseWriter plain(ctx, ResponseOptions{}, 17, 100);
  for (const EngineEvent& e : events) plain.Append(0, e);
  EXPECT_TRUE(Json::parse(*plain.Finish())["choices"][0]["logprobs"].is_null());
}

// echo with logprobs: each choice's logprobs cover its prompt's tokens, then the output's, in
// completions' shapes: the first prompt token with null logprob and top_logprobs (OpenAI's),
// every other with its log-probability and a map of it and its alternatives; text_offset counts
// from the start of the echoed prompt. Streamed, the prompt's come in each choice's first chunk.
// Without the prompt's (an agent that sent none), logprobs are null, not partial.
TEST(OpenAiResponseWriterTest, EchoWithLogprobsCoversThePromptThenTheOutput) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  ResponseOptions options;
  options.logprobs = true;
  options.num_top_logprobs = 1;
  options.num_prompts = 2;
  options.echo = {"Hi!", "Yo"};
  options.echo_token_ids = {{'H', 'i', '!'}, {'Y', 'o'}};
  // Prompt events: choice 0 (prompt "Hi!") and choice 1 (prompt "Yo"), outputs "ab" and "c".
  auto output = [&](const std::string& text, std::vector<float> prompt_lps,
                    std::vector<int32_t> prompt_alt_ids) {
    std::vector<EngineEvent> events = Events(*ctx->tokenizer, text, 1);
    for (EngineEvent& e : events) {
      e.logprobs = {-0.5f};
      e.top_token_ids = {'z'};
      e.top_logprobs = {-3.0f};
    }
    events[0].has_prompt_logprobs = true;
    events[0].prompt_logprobs = prompt_lps;
    events[0].prompt_top_token_ids = prompt_alt_ids;
    for (float lp : prompt_lps) events[0].prompt_top_logprobs.push_back(lp - 1);
    return events;
  };
  const std::vector<std::vector<EngineEvent>> events = {output("ab", {-1.0f, -2.0f}, {'q', 'r'}),
                                                        output("c", {-4.0f}, {'s'})};
  OpenAiResponseWriter unary(ctx, options, 31, 100);
  OpenAiResponseWriter streamed(ctx, options, 32, 100);
  std::map<int, Json> chunks_logprobs;  // per choice: the streamed arrays, concatenated
  for (int i = 0; i < 2; ++i) {
    for (const EngineEvent& e : events[i]) {
      unary.Append(i, e);
      for (const Json& chunk : Chunks(streamed.StreamChunk(i, e))) {
        if (chunk["choices"].empty()) continue;
        const Json& lp = chunk["choices"][0]["logprobs"];
        Json& all = chunks_logprobs[i];
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          if (!all.contains(key)) all[key] = Json::array();
          for (const Json& v : lp[key]) all[key].push_back(v);
        }
      }
    }
  }
  const Json j = Json::parse(*unary.Finish());
  const Json& lp0 = j["choices"][0]["logprobs"];
  EXPECT_EQ(j["choices"][0]["text"], "Hi!ab");
  EXPECT_EQ(lp0["tokens"], Json({"H", "i", "!", "a", "b"}));
  EXPECT_EQ(lp0["token_logprobs"], Json({nullptr, -1.0, -2.0, -0.5, -0.5}));
  EXPECT_TRUE(lp0["top_logprobs"][0].is_null());
  EXPECT_EQ(lp0["top_logprobs"][1], Json({{"i", -1.0}, {"q", -2.0}}));
  EXPECT_EQ(lp0["top_logprobs"][2], Json({{"!", -2.0}, {"r", -3.0}}));
  EXPECT_EQ(lp0["top_logprobs"][3], Json({{"a", -0.5}, {"z", -3.0}}));
  EXPECT_EQ(lp0["text_offset"], Json({0, 1, 2, 3, 4}));
  const Json& lp1 = j["choices"][1]["logprobs"];
  EXPECT_EQ(lp1["tokens"], Json({"Y", "o", "c"}));
  EXPECT_EQ(lp1["token_logprobs"], Json({nullptr, -4.0, -0.5}));
  EXPECT_EQ(lp1["text_offset"], Json({0, 1, 2}));
  EXPECT_EQ(chunks_logprobs[0], lp0);
  EXPECT_EQ(chunks_logprobs[1], lp1);

  // An agent that sent no prompt log-probabilities: null.
  std::vector<EngineEvent> missing = events[0];
  missing[0].has_prompt_logprobs = false;
  options.num_prompts = 1;
  OpenAiResponseWriter partial(ctx, options, 33, 100);
  for (const EngineEvent& e : missing) partial.Append(0, e);
  EXPECT_TRUE(Json::parse(*partial.Finish())["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponseWriterTest, TopLogprobsInOpenAisShapes) {
  auto ctx = Context(*ByteTokenizer::Create(256));
  // k = 2 alternatives per token: the token itself (-0.25) and 'z' (-2), or 'y' then the token
  // for 'z' (whose string repeats in the completions map: the first entry stays).
  std::vector<EngineEvent> events = Events(*ctx->tokenizer, "abz", 2);
  for (EngineEvent& e : events) {
    for (int32_t t : e.token_ids) {
      e.logprobs.push_back(t == 'z' ? -1.5f : -0.25f);
      const std::vector<int32_t> ids =
          t == 'z' ? std::vector<int32_t>{'y', 'z'} : std::vector<int32_t>{t, 'z'};
      const std::vector<float> lps =
          t == 'z' ? std::vector<float>{-0.5f, -1.5f} : std::vector<float>{-0.25f, -2.0f};
      e.top_token_ids.insert(e.top_token_ids.end(), ids.begin(), ids.end());
      e.top_logprobs.insert(e.top_logprobs.end(), lps.begin(), lps.end());
    }
  }
  // Completions, unary: each map holds the chosen token and both alternatives.
  ResponseOptions options;
  options.logprobs = true;
  options.num_top_logprobs = 2;
  OpenAiResponseWriter unary(ctx, options, 15, 100);
  for (const EngineEvent& e : events) unary.Append(0, e);
  const Json lp = Json::parse(*unary.Finish())["choices"][0]["logprobs"];
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0], Json({{"a", -0.25}, {"z", -2.0}}));
  EXPECT_EQ(lp["top_logprobs"][1], Json({{"b", -0.25}, {"z", -2.0}}));
  EXPECT_EQ(lp["top_logprobs"][2], Json({{"y", -0.5}, {"z", -1.5}}));
  EXPECT_EQ(lp["token_logprobs"], Json({-0.25, -0.25, -1.5}));
  // Chat, streamed: each content entry lists the alternatives with their bytes, in order.
  options.chat = true;
  OpenAiResponseWriter streamed(ctx, options, 16, 100);
  std::vector<Json> entries;
  for (const EngineEvent& e : events) {
    for (const Json& chunk : Chunks(streamed.StreamChunk(0, e))) {
      for (const Json& entry : chunk["choices"][0]["logprobs"]["content"]) entries.push_back(entry);
    }
  }
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[2]["token"], "z");
  EXPECT_EQ(entries[2]["top_logprobs"],
            Json::parse(R"([{"token": "y", "logprob": -0.5, "bytes": [121]},
                            {"token": "z", "logprob": -1.5, "bytes": [122]}])"));
  EXPECT_EQ(entries[0]["top_logprobs"][0]["token"], "a");
  // Alternatives missing for a token (an agent that sent none): logprobs null, not partial.
  std::vector<EngineEvent> short_events = events;
  short_events[0].top_token_ids.pop_back();
  OpenAiResponseWriter partial(ctx, options, 17, 100);
  for (const EngineEvent& e : short_events) partial.Append(0, e);
  EXPECT_TRUE(Json::parse(*partial.Finish())["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace vamp
