// The OpenAI HTTP frontend (controller/server/http_frontend.h) over a serving engine whose agents
// are in-process fakes: routes and methods, OpenAI-shaped 4xx bodies that name the parameter,
// API keys (the API needs one, /health and /metrics do not), unary and streamed completions, and
// what it answers while no model is served.
#include "controller/server/http_frontend.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "controller/serving/serving_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/controller/serving/fake_agent_service.h"
#include "tokenizer/tokenizer.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kKey[] = "test-key-0123456789";

class HttpFrontendTest : public ::testing::Test {
 protected:
  HttpFrontendTest() : agents_({testing::FakeRankSpec{}}) {}

  void SetUp() override {
    ASSERT_TRUE(agents_.status().ok()) << agents_.status();
    agents_.agent(0).SetSampledToken('a');
    ServingEngineOptions engine;
    engine.scheduler.max_model_len = 512;
    engine.arbiter = "static";
    engine.ranks = agents_.init_responses();
    engine.model_name = "fake-model";
    absl::StatusOr<std::unique_ptr<ServingEngine>> started =
        ServingEngine::Start(agents_.group(), engine);
    ASSERT_TRUE(started.ok()) << started.status();
    auto context = std::make_shared<ServingContext>();
    context->engine = *std::move(started);
    context->model = ServedModel{"fake-model", 512, 256};
    absl::StatusOr<std::unique_ptr<ByteTokenizer>> tokenizer = ByteTokenizer::Create(256);
    ASSERT_TRUE(tokenizer.ok());
    context->tokenizer = *std::move(tokenizer);
    context_ = std::move(context);
  }

  void TearDown() override {
    if (frontend_ != nullptr) frontend_->Stop();
    if (context_ != nullptr) context_->engine->Stop();
  }

  // Starts the frontend; `api_keys` empty: open.
  void Start(std::vector<std::string> api_keys = {}) {
    HttpFrontendOptions options;
    options.server.address = "127.0.0.1:0";
    options.server.threads = 1;
    options.api_keys = std::move(api_keys);
    options.last_error = [this] {
      absl::MutexLock lock(&mu_);
      return last_error_;
    };
    absl::StatusOr<std::unique_ptr<HttpFrontend>> frontend =
        HttpFrontend::Start(options, [this]() -> std::shared_ptr<const ServingContext> {
          absl::MutexLock lock(&mu_);
          return serving_ ? context_ : nullptr;
        });
    ASSERT_TRUE(frontend.ok()) << frontend.status();
    frontend_ = *std::move(frontend);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", frontend_->port());
    client_->set_read_timeout(30, 0);
  }

  // The model is no longer served (the controller lost its agents), for this reason.
  void StopServing(std::string reason) {
    absl::MutexLock lock(&mu_);
    serving_ = false;
    last_error_ = std::move(reason);
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path, headers, body, "application/json");
  }

  // The "error" object of an OpenAI error body.
  static Json Error(const httplib::Result& r) {
    Json body = Json::parse(r->body, nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("error")) << r->body;
    return body.is_object() ? body.value("error", Json::object()) : Json::object();
  }

  testing::FakeAgentGroup agents_;
  std::shared_ptr<ServingContext> context_;
  std::unique_ptr<HttpFrontend> frontend_;
  std::unique_ptr<httplib::Client> client_;
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

TEST_F(HttpFrontendTest, RoutesAndMethods) {
  Start();
  httplib::Result health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Json::parse(health->body)["status"], "serving");

  httplib::Result models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  const Json list = Json::parse(models->body);
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "fake-model");
  EXPECT_EQ(list["data"][0]["max_model_len"], 512);

  httplib::Result one = client_->Get("/v1/models/fake-model");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(Json::parse(one->body)["object"], "model");

  httplib::Result metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("vamp_kv_pool_blocks"));

  httplib::Result unknown = client_->Get("/v2/anything");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_THAT(Error(unknown)["message"].get<std::string>(), HasSubstr("no route for GET /v2"));
  httplib::Result targets = client_->Get("/metrics/targets");
  ASSERT_TRUE(targets);
  EXPECT_EQ(targets->status, 404) << "no targets callback, no route";

  httplib::Result get_completions = client_->Get("/v1/completions");
  ASSERT_TRUE(get_completions);
  EXPECT_EQ(get_completions->status, 405);
  EXPECT_EQ(get_completions->get_header_value("Allow"), "POST");
  httplib::Result post_models = Post("/v1/models", "{}");
  ASSERT_TRUE(post_models);
  EXPECT_EQ(post_models->status, 405);
  EXPECT_EQ(post_models->get_header_value("Allow"), "GET");
}

TEST_F(HttpFrontendTest, BadRequestsGetOpenAiErrorsNamingTheParameter) {
  Start();
  httplib::Result bad_json = Post("/v1/completions", "{\"prompt\": ");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_EQ(Error(bad_json)["type"], "invalid_request_error");
  EXPECT_EQ(Error(bad_json)["code"], 400);

  httplib::Result bad_field = Post("/v1/completions", R"({"prompt": "hi", "max_tokens": -1})");
  ASSERT_TRUE(bad_field);
  EXPECT_EQ(bad_field->status, 400);
  EXPECT_EQ(Error(bad_field)["param"], "max_tokens");

  httplib::Result bad_chat = Post("/v1/chat/completions", R"({"messages": "not a list"})");
  ASSERT_TRUE(bad_chat);
  EXPECT_EQ(bad_chat->status, 400);
  EXPECT_EQ(Error(bad_chat)["param"], "messages");

  httplib::Result other_model = Post("/v1/completions", R"({"model": "gpt-9", "prompt": "hi"})");
  ASSERT_TRUE(other_model);
  EXPECT_EQ(other_model->status, 404);
  EXPECT_EQ(Error(other_model)["param"], "model");
  EXPECT_EQ(Error(other_model)["type"], "not_found_error");

  httplib::Result missing = client_->Get("/v1/models/gpt-9");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(Error(missing)["param"], "model");
  EXPECT_THAT(Error(missing)["message"].get<std::string>(), HasSubstr("'gpt-9' does not exist"));
}

TEST_F(HttpFrontendTest, ServesUnaryAndStreamedCompletions) {
  Start();
  httplib::Result unary = Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 3})");
  ASSERT_TRUE(unary);
  ASSERT_EQ(unary->status, 200) << unary->body;
  const Json body = Json::parse(unary->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "fake-model");
  EXPECT_EQ(body["choices"][0]["text"], "aaa") << "the fake agent samples 'a'";
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);

  httplib::Result streamed = Post("/v1/completions",
                                  R"({"prompt": "hello", "max_tokens": 2, "stream": true,
                                      "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_THAT(streamed->body, HasSubstr("\"text\":\"a\""));
  EXPECT_THAT(streamed->body, HasSubstr("\"completion_tokens\":2"));
  EXPECT_THAT(streamed->body, HasSubstr("data: [DONE]\n\n"));

  httplib::Result chat = Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2, "seed": 3})");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  const Json chat_body = Json::parse(chat->body);
  ASSERT_EQ(chat_body["choices"].size(), 2u) << "n choices, one engine request each";
  EXPECT_EQ(chat_body["choices"][1]["message"]["content"], "aa");
  EXPECT_EQ(chat_body["usage"]["completion_tokens"], 4) << "summed over the choices";
}

// A batch of prompts runs prompts x n engine requests: choices indexed prompt_index * n + j, each
// echoing its prompt; usage counts each prompt once; streamed chunks carry every index.
TEST_F(HttpFrontendTest, ServesBatchesOfPromptsWithNChoicesEach) {
  Start();
  httplib::Result unary = Post("/v1/completions", R"({"prompt": [[104, 105], [1, 2, 3]], "n": 2,
                                                      "max_tokens": 2, "echo": true})");
  ASSERT_TRUE(unary);
  ASSERT_EQ(unary->status, 200) << unary->body;
  const Json body = Json::parse(unary->body);
  ASSERT_EQ(body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"],
              (i < 2 ? std::string("hi") : std::string("\x01\x02\x03")) + "aa");
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5) << "2 + 3, each prompt once";
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);

  httplib::Result streamed = Post("/v1/completions", R"({"prompt": ["a", "b", "c"], "n": 1,
      "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::map<int, std::string> texts;
  std::optional<Json> usage;
  for (absl::string_view line : absl::StrSplit(streamed->body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::ConsumePrefix(&line, "data: ")) << line;
    if (line == "[DONE]") continue;
    const Json chunk = Json::parse(line);
    if (chunk["choices"].empty()) {
      usage = chunk["usage"];
      continue;
    }
    texts[chunk["choices"][0]["index"].get<int>()] +=
        chunk["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(texts, (std::map<int, std::string>{{0, "aa"}, {1, "aa"}, {2, "aa"}}));
  ASSERT_TRUE(usage.has_value());
  EXPECT_EQ((*usage)["prompt_tokens"], 3);
  EXPECT_EQ((*usage)["completion_tokens"], 6);

  // 5 prompts x n 16 = 80 choices: more than the default 64 one request may start.
  httplib::Result too_many =
      Post("/v1/completions", R"({"prompt": ["a", "b", "c", "d", "e"], "n": 16})");
  ASSERT_TRUE(too_many);
  EXPECT_EQ(too_many->status, 400);
  EXPECT_EQ(Error(too_many)["param"], "n");
  EXPECT_THAT(Error(too_many)["message"].get<std::string>(), HasSubstr("80 choices exceed the 64"));
}

TEST_F(HttpFrontendTest, TheApiNeedsAKeyHealthAndMetricsDoNot) {
  Start({kKey});
  const std::string body = R"({"prompt": "hello", "max_tokens": 1})";
  httplib::Result none = Post("/v1/completions", body);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_THAT(Error(none)["message"].get<std::string>(), HasSubstr("API key"));
  httplib::Result wrong =
      Post("/v1/completions", body, {{"Authorization", "Bearer not-the-key-at-all"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  httplib::Result no_scheme = Post("/v1/completions", body, {{"Authorization", kKey}});
  ASSERT_TRUE(no_scheme);
  EXPECT_EQ(no_scheme->status, 401) << "the key alone is not 'Bearer <key>'";
  httplib::Result models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401) << "listing models needs the key too";

  const httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kKey}};
  httplib::Result right = Post("/v1/completions", body, auth);
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  httplib::Result health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
}

TEST_F(HttpFrontendTest, WhileNoModelIsServedItSaysWhy) {
  Start();
  StopServing("agent rank 0 failed Init: no config.json");
  httplib::Result health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  const Json h = Json::parse(health->body);
  EXPECT_EQ(h["status"], "not serving");
  EXPECT_EQ(h["error"], "agent rank 0 failed Init: no config.json");

  httplib::Result completion = Post("/v1/completions", R"({"prompt": "hello"})");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 503);
  EXPECT_THAT(Error(completion)["message"].get<std::string>(),
              HasSubstr("Last error: agent rank 0 failed Init"));

  httplib::Result models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_TRUE(Json::parse(models->body)["data"].empty());
  httplib::Result one = client_->Get("/v1/models/fake-model");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 404);
  EXPECT_THAT(Error(one)["message"].get<std::string>(), HasSubstr("no model is served yet"));
}

TEST_F(HttpFrontendTest, HealthIsNotServingWhileDraining) {
  Start();
  context_->engine->Drain();
  httplib::Result health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  httplib::Result completion = Post("/v1/completions", R"({"prompt": "hello"})");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 503);
  EXPECT_THAT(Error(completion)["message"].get<std::string>(), HasSubstr("draining"));
  context_->engine->Undrain();
  health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

}  // namespace
}  // namespace vamp
