#include "controller/frontend/openai_api.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using ::testing::HasSubstr;

class OpenAiApiTest : public ::testing::Test {
 protected:
  void SetUp() override { tokenizer_ = *ByteTokenizer::Create(256); }
  ServedModel model_{"tiny", 64, 256};
  std::unique_ptr<ByteTokenizer> tokenizer_;

  absl::Status Completion(const std::string& body) {
    return ParseCompletionRequest(body, model_, *tokenizer_).status();
  }
  // The field the error names, from the payload.
  std::string Param(const absl::Status& s) {
    auto p = s.GetPayload(kParamPayload);
    return p.has_value() ? std::string(*p) : "";
  }
};

TEST_F(OpenAiApiTest, CompletionWithTextAndSampling) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(
      R"({"model": "tiny", "prompt": "Hi", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
          "top_k": 7, "seed": 42, "stream": true, "stream_options": {"include_usage": true},
          "stop_token_ids": [2], "ignore_eos": true, "cache_salt": "s1"})",
      model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->chat);
  EXPECT_EQ(r->prompts[0], (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(r->sampling.max_tokens, 5);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_EQ(r->sampling.top_k, 7);
  EXPECT_EQ(r->sampling.seed, 42u);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->sampling.ignore_eos);
  EXPECT_EQ(r->sampling.stop_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(r->cache_salt, "s1");
}

TEST_F(OpenAiApiTest, StopStringsChoicesAndEcho) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(
      R"({"prompt": "Hi", "stop": "\n", "n": 3, "echo": true})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response.stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(r->response.n, 3);
  EXPECT_EQ(r->response.echo, std::vector<std::string>{"Hi"});
  r = ParseCompletionRequest(R"({"prompt": [72, 105], "stop": ["a", "bc"], "echo": true})",
                             model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r->response.echo, std::vector<std::string>{"Hi"});  // token ids echo as their text
  r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "stop": null, "n": 2})", model_,
      *tokenizer_, RequestLimits{.max_n = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.stop.empty());
  EXPECT_EQ(r->response.n, 2);
  absl::StatusOr<OpenAiRequest> over = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "n": 3})", model_, *tokenizer_,
      RequestLimits{.max_n = 2});
  EXPECT_EQ(Param(over.status()), "n");
  EXPECT_THAT(over.status().message(), HasSubstr("--max_n"));
}

TEST_F(OpenAiApiTest, PenaltiesMinPAndMinTokensReachTheSamplingParams) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(
      R"({"prompt": "Hi", "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
          "repetition_penalty": 1.2, "min_tokens": 3, "max_tokens": 8})",
      model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r->sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r->sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(r->sampling.min_tokens, 3);
}

TEST_F(OpenAiApiTest, LogprobsOfTheChosenTokens) {
  absl::StatusOr<OpenAiRequest> r =
      ParseCompletionRequest(R"({"prompt": "Hi", "logprobs": 0})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.logprobs);
  EXPECT_EQ(r->response.num_top_logprobs, 0);
  // Completions' logprobs count the alternatives (up to 5), asked of the agents.
  r = ParseCompletionRequest(R"({"prompt": "Hi", "logprobs": 5})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.logprobs);
  EXPECT_EQ(r->response.num_top_logprobs, 5);
  EXPECT_EQ(r->sampling.num_top_logprobs, 5);
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  r = ParseChatCompletionRequest("{" + messages + R"(, "logprobs": true, "top_logprobs": 0})",
                                 model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.logprobs);
  r = ParseChatCompletionRequest("{" + messages + R"(, "logprobs": true, "top_logprobs": 20})",
                                 model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response.num_top_logprobs, 20);
  EXPECT_EQ(r->sampling.num_top_logprobs, 20);
  r = ParseChatCompletionRequest("{" + messages + R"(, "logprobs": false})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->response.logprobs);
  // With penalties, min_p and min_tokens: the agents report the raw model's logprobs (vLLM's
  // default), so they combine.
  r = ParseChatCompletionRequest(
      "{" + messages +
          R"(, "logprobs": true, "top_logprobs": 2, "min_p": 0.1, "presence_penalty": 1,
              "frequency_penalty": 0.5, "repetition_penalty": 1.2, "min_tokens": 2})",
      model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.logprobs);
  EXPECT_EQ(r->sampling.num_top_logprobs, 2);
  EXPECT_EQ(r->sampling.presence_penalty, 1.0f);
  EXPECT_EQ(r->sampling.min_tokens, 2);
  const std::pair<const char*, const char*> bad[] = {
      {R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs"},  // OpenAI's limit
      {R"(, "top_logprobs": 0})", "top_logprobs"},                     // without logprobs
      {R"(, "logprobs": 1})", "logprobs"}};                            // chat's is a bool
  for (const auto& [fields, param] : bad) {
    absl::StatusOr<OpenAiRequest> e =
        ParseChatCompletionRequest("{" + messages + fields, model_, *tokenizer_);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << fields;
    EXPECT_EQ(Param(e.status()), param) << fields;
  }
}

TEST_F(OpenAiApiTest, CompletionDefaultsAndTokenPrompt) {
  absl::StatusOr<OpenAiRequest> r =
      ParseCompletionRequest(R"({"prompt": [[1, 2, 3]]})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "tiny");
  EXPECT_EQ(r->prompts[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r->sampling.max_tokens, kDefaultCompletionMaxTokens);
  EXPECT_FALSE(r->stream);
}

// A prompt array of strings or of token-id arrays is a batch: one prompt each, echoed each, its
// choices counted against --max_batch_prompts (prompts x n).
TEST_F(OpenAiApiTest, CompletionBatchesOfStringsAndTokenArrays) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(
      R"({"prompt": ["Hi", "Yo!"], "n": 2, "echo": true})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[0], (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(r->prompts[1], (std::vector<int32_t>{'Y', 'o', '!'}));
  EXPECT_EQ(r->response.num_prompts, 2);
  EXPECT_EQ(r->response.n, 2);
  EXPECT_EQ(r->response.echo, (std::vector<std::string>{"Hi", "Yo!"}));
  r = ParseCompletionRequest(R"({"prompt": [[72, 105], [5]], "echo": true})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts, (std::vector<std::vector<int32_t>>{{72, 105}, {5}}));
  EXPECT_EQ(r->response.echo, (std::vector<std::string>{"Hi", "\x05"}));
  // Without echo, no texts; a single prompt stays a single prompt.
  r = ParseCompletionRequest(R"({"prompt": [7, 8]})", model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts, (std::vector<std::vector<int32_t>>{{7, 8}}));
  EXPECT_EQ(r->response.num_prompts, 1);
  EXPECT_TRUE(r->response.echo.empty());

  // The limits: prompts, then prompts x n, each named in the error.
  RequestLimits limits;
  limits.max_n = 4;
  limits.max_batch_prompts = 6;
  EXPECT_TRUE(
      ParseCompletionRequest(R"({"prompt": ["a", "b", "c"], "n": 2})", model_, *tokenizer_, limits)
          .ok());
  absl::Status s = ParseCompletionRequest(R"({"prompt": ["a", "b", "c", "d", "e", "f", "g"]})",
                                          model_, *tokenizer_, limits)
                       .status();
  EXPECT_EQ(Param(s), "prompt");
  EXPECT_THAT(s.message(),
              HasSubstr("at most 6 prompts (the server's --max_batch_prompts), got 7"));
  s = ParseCompletionRequest(R"({"prompt": ["a", "b"], "n": 4})", model_, *tokenizer_, limits)
          .status();
  EXPECT_EQ(Param(s), "n");
  EXPECT_THAT(s.message(), HasSubstr("2 prompts x n 4 = 8 choices exceed the 6"));
  EXPECT_EQ(HttpStatusFor(s), 400);

  // Mixed kinds are refused naming the element (the fuzzer's [[2, 2], 3] once threw from the
  // JSON library, ending the process).
  for (const char* body : {R"({"prompt": [[2, 2], 3]})", R"({"prompt": [[2, 2], "a"]})",
                           R"({"prompt": ["a", [2]]})", R"({"prompt": [[2], null]})"}) {
    s = ParseCompletionRequest(body, model_, *tokenizer_).status();
    EXPECT_EQ(Param(s), "prompt") << body;
    EXPECT_THAT(s.message(), HasSubstr("element 1 must be a")) << body;
  }
}

// echo with logprobs needs agents that compute prompt log-probabilities: refused naming echo
// without them; with them, every prompt's token ids go to the response writer.
TEST_F(OpenAiApiTest, EchoWithLogprobsNeedsAgentsThatScoreThePrompt) {
  absl::Status refused = ParseCompletionRequest(R"({"prompt": "Hi", "echo": true, "logprobs": 2})",
                                                model_, *tokenizer_)
                             .status();
  EXPECT_EQ(Param(refused), "echo");
  EXPECT_THAT(refused.message(), HasSubstr("this deployment's agents cannot compute"));
  ServedModel scoring = model_;
  scoring.prompt_logprobs = true;
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(
      R"({"prompt": ["Hi", "Yo!"], "echo": true, "logprobs": 2})", scoring, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response.echo_token_ids, r->prompts);
  EXPECT_EQ(r->response.num_top_logprobs, 2);
  EXPECT_EQ(r->sampling.num_top_logprobs, 2);
  // Without logprobs (or without echo), nothing to score.
  r = ParseCompletionRequest(R"({"prompt": "Hi", "echo": true})", scoring, *tokenizer_);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->response.echo_token_ids.empty());
  r = ParseCompletionRequest(R"({"prompt": "Hi", "logprobs": 1})", scoring, *tokenizer_);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->response.echo_token_ids.empty());
}

TEST_F(OpenAiApiTest, ErrorsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {"{", "body", "not valid JSON"},
      {"[1]", "body", "must be a JSON object"},
      {R"({"max_tokens": 3})", "prompt", "is required"},
      {R"({"prompt": ""})", "prompt", "must not be empty"},
      {R"({"prompt": [1, 999]})", "prompt", "token id 999 at index 1 is outside"},
      {R"({"prompt": {"a": 1}})", "prompt", "must be a string, an array of token ids, or"},
      {R"({"prompt": ["a", [1]]})", "prompt", "element 1 must be a string like element 0"},
      {R"({"prompt": [[1], "a"]})", "prompt", "element 1 must be a token-id array like element 0"},
      {R"({"prompt": [[1], [2, "x"]]})", "prompt", "element 1 must be an array of token ids"},
      {R"({"prompt": [[1], [2, 999]]})", "prompt", "element 1 token id 999 at index 1 is outside"},
      {R"({"prompt": ["a", ""]})", "prompt", "element 1 must not be empty"},
      {R"({"prompt": ["a", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]})",
       "prompt", "element 1 is 64 tokens"},
      {R"({"prompt": ["a", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"],
           "max_tokens": 5})",
       "max_tokens", "the 62-token prompt (element 1) leaves 2 of 64"},
      {R"({"prompt": ["x"], "n": 17})", "n", "must be an integer in [1, 16]"},
      {R"({"prompt": "x", "temperature": 3})", "temperature", "must be in [0, 2]"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature", "must be a number"},
      {R"({"prompt": "x", "top_p": 0})", "top_p", "must be in"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "must be in [1, 64]"},
      {R"({"prompt": "x", "n": 17})", "n", "must be an integer in [1, 16]"},
      {R"({"prompt": "x", "n": 0})", "n", "must be an integer in [1, 16]"},
      {R"({"prompt": "x", "stop": [""]})", "stop", "element 0 must be a non-empty string"},
      {R"({"prompt": "x", "stop": 5})", "stop", "must be a string or an array of strings"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "stop", "element 1"},
      {R"({"prompt": "x", "echo": 1})", "echo", "must be true or false"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed with stream = true"},
      {R"({"prompt": "x", "stop_token_ids": [300]})", "stop_token_ids", "outside the vocabulary"},
      {R"({"prompt": "x", "logprobs": 6})", "logprobs", "must be in [0, 5]"},
      {R"({"prompt": "x", "logprobs": 0, "echo": true})", "echo", "echo with logprobs"},
      {R"({"prompt": "x", "top_logprobs": 2})", "top_logprobs", "chat field"},
      {R"({"prompt": "x", "min_tokens": 5, "max_tokens": 4})", "min_tokens",
       "must be <= max_tokens (4), got 5"},
      {R"({"prompt": "x", "min_p": 1.5})", "min_p", "must be in [0, 1]"},
      {R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty", "must be in"},
      {R"({"prompt": "x", "frequency_penalty": -3})", "frequency_penalty", "must be in [-2, 2]"},
      {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty", "must be in [-2, 2]"},
      {R"({"prompt": "x", "logit_bias": {"5": 10}})", "logit_bias", "not supported"},
      {R"({"prompt": "x", "response_format": {"type": "json_object"}})", "response_format",
       "only {\"type\": \"text\"}"},
      {R"({"prompt": "x", "guided_json": {}})", "guided_json", "not supported"},
      {R"({"prompt": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"})",
       "prompt", "at least one must be left for output"},
      {R"({"prompt": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "max_tokens": 5})",
       "max_tokens", "5 output tokens do not fit"},
  };
  for (const Case& c : cases) {
    absl::Status s = Completion(c.body);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(Param(s), c.param) << c.body;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.body;
    EXPECT_EQ(HttpStatusFor(s), 400);
  }
}

// Regression: ids past 32 bits were cut to in-vocabulary ids (4294967301 became 5) in prompts and
// stop_token_ids. They are refused naming the field and the id as sent.
TEST_F(OpenAiApiTest, TokenIdsPast32BitsAreRefusedNotTruncated) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": [1, 4294967301]})", "prompt", "token id 4294967301 at index 1"},
      {R"({"prompt": [-4294967291]})", "prompt", "token id -4294967291 at index 0"},
      {R"({"prompt": [9223372036854775813]})", "prompt", "token id 9223372036854775813"},
      {R"({"prompt": [18446744073709551621]})", "prompt", "token ids"},
      {R"({"prompt": [1], "stop_token_ids": [4294967301]})", "stop_token_ids",
       "token id 4294967301 at index 0"},
      {R"({"prompt": [1], "stop_token_ids": [2, -1]})", "stop_token_ids", "token id -1 at index 1"},
      {R"({"prompt": [1], "stop_token_ids": [1.5]})", "stop_token_ids", "not an integer"},
  };
  for (const Case& c : cases) {
    absl::Status s = Completion(c.body);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(Param(s), c.param) << c.body;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.body;
    EXPECT_EQ(HttpStatusFor(s), 400) << c.body;
  }
  absl::Status chat = ParseChatCompletionRequest(
                          R"({"messages": [{"role": "user", "content": "hi"}],
                              "stop_token_ids": [4294967301]})",
                          model_, *tokenizer_)
                          .status();
  EXPECT_EQ(Param(chat), "stop_token_ids");
  EXPECT_EQ(HttpStatusFor(chat), 400);
  absl::StatusOr<OpenAiRequest> ok =
      ParseCompletionRequest(R"({"prompt": [0, 255], "stop_token_ids": [5]})", model_, *tokenizer_);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->prompts[0], (std::vector<int32_t>{0, 255}));
  EXPECT_EQ(ok->sampling.stop_token_ids, (std::vector<int32_t>{5}));
}

TEST_F(OpenAiApiTest, UnknownModelIs404WithOpenAiErrorBody) {
  absl::Status s = Completion(R"({"model": "gpt-9", "prompt": "x"})");
  EXPECT_EQ(HttpStatusFor(s), 404);
  nlohmann::json body = nlohmann::json::parse(ErrorBody(s));
  EXPECT_EQ(body["error"]["param"], "model");
  EXPECT_EQ(body["error"]["type"], "not_found_error");
  EXPECT_EQ(body["error"]["code"], 404);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("'gpt-9' is not served"));
}

TEST_F(OpenAiApiTest, ChatUsesTemplateAndValidatesMessages) {
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Yo"}]}],
          "max_completion_tokens": 3})",
      model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->chat);
  EXPECT_EQ(r->prompts[0], tokenizer_->Encode("<|user|>\nYo\n<|assistant|>\n"));
  EXPECT_EQ(r->sampling.max_tokens, 3);
  // Chat requests without a limit run to the context length (the scheduler's default).
  absl::StatusOr<OpenAiRequest> unlimited = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "Yo"}]})", model_, *tokenizer_);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_FALSE(unlimited->sampling.max_tokens.has_value());

  absl::Status bad_role = ParseChatCompletionRequest(
      R"({"messages": [{"role": "robot", "content": "x"}]})", model_, *tokenizer_).status();
  EXPECT_EQ(Param(bad_role), "messages[0].role");
  absl::Status no_content = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})", model_,
      *tokenizer_).status();
  EXPECT_EQ(Param(no_content), "messages[1].content");
  absl::Status empty =
      ParseChatCompletionRequest(R"({"messages": []})", model_, *tokenizer_).status();
  EXPECT_EQ(Param(empty), "messages");
}

TEST_F(OpenAiApiTest, ChatToolFieldsAreValidatedNotIgnored) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      // The byte fallback has no template for tool definitions.
      {R"({"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tools", "no tool-call format"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "x"}]})",
       "tools[0].type", "must be \"function\""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
           "function": {"name": ""}}]})", "tools[0].function.name", "non-empty"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"})",
       "tool_choice", "needs a non-empty tools list"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes",
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice", "must be"},
      {R"({"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name", "'g' is not one of the tools"},
      {R"({"messages": [{"role": "user", "content": "hi"},
           {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
             "function": {"arguments": "{}"}}]}]})", "messages[1].tool_calls[0].function.name",
       "must be a string"},
      {R"({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]})",
       "messages[0].tool_calls", "only allowed on assistant"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]})",
       "chat_template_kwargs", "must be an object"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true})",
       "continue_final_message", "not supported"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "functions": []})", "functions",
       "not supported"},
  };
  for (const Case& c : cases) {
    absl::Status s = ParseChatCompletionRequest(c.body, model_, *tokenizer_).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(Param(s), c.param) << c.body << " " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.body;
  }
  // tool_choice "none" without tools, and an assistant turn with null content, are fine.
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
          {"role": "user", "content": "x"}], "tool_choice": "none", "max_tokens": 2})",
      model_, *tokenizer_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->response.chat);
  EXPECT_FALSE(r->response.parse_tool_calls);
  EXPECT_FALSE(r->response.parse_reasoning);  // bytes have no <think> tags
}

}  // namespace
}  // namespace vamp
