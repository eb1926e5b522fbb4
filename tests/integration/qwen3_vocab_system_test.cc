// The whole system with a real tokenizer: vamp-controller and a spawned CPU agent serving a tiny
// qwen3_moe with Qwen3's vocabulary (tests/data/tiny-qwen3-vocab, dummy weights) and Qwen3's
// tokenizer.json and chat template (placed by scripts/fetch-tokenizers.sh, the CTest fixture).
// Prompts must tokenize exactly as the reference does (the goldens' token counts come back as
// usage.prompt_tokens), and streamed output of arbitrary token ids must arrive as well-formed
// UTF-8 that adds up to the unary response.
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "tokenizer/utf8.h"
#include "controller/server/controller_config.h"
#include "controller/server/controller_server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::ordered_json;

Json Goldens() {
  std::ifstream in(std::string(VAMP_TEST_DATA_DIR) + "/tokenizer/qwen3-goldens.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

class Qwen3VocabSystemTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::vector<std::string> args = {
        "vamp-controller",
        "--grpc_address=127.0.0.1:0",
        "--admin_address=127.0.0.1:0",
        "--http_address=127.0.0.1:0",
        "--metrics_address=",
        std::string("--model_path=") + VAMP_TEST_DATA_DIR + "/tiny-qwen3-vocab",
        "--load_format=dummy",
        "--spawn_agents=1",
        std::string("--agent_binary=") + VAMP_BINARY_DIR + "/agent/vamp-agent",
        "--agent_host_memory_bytes=536870912",
        "--agent_host_page_bytes=4096",
        "--step_timeout_s=20",
        "--log_level=warning"};
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    absl::StatusOr<CommandLine> cli =
        ParseCommandLine(ControllerConfigSchema(), static_cast<int>(argv.size()), argv.data());
    ASSERT_TRUE(cli.ok()) << cli.status();
    absl::StatusOr<std::unique_ptr<ControllerServer>> server =
        ControllerServer::Start(cli->config);
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_TRUE((*server)->WaitUntilServing(absl::Seconds(120))) << "agent never came up";
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) server_->Shutdown();
    delete server_;
    server_ = nullptr;
  }

  Json Post(const std::string& path, const Json& body, int* status) {
    httplib::Client http("127.0.0.1", server_->http_port());
    http.set_read_timeout(120);
    auto r = http.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << "HTTP request failed";
    if (!r) return {};
    *status = r->status;
    return Json::parse(r->body);
  }

  // The SSE chunks of a streamed request (without [DONE]); each must be well-formed UTF-8.
  std::vector<Json> Stream(const std::string& path, Json body) {
    body["stream"] = true;
    httplib::Client http("127.0.0.1", server_->http_port());
    http.set_read_timeout(120);
    std::string all;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      all.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    EXPECT_TRUE(http.send(req, res, error));
    EXPECT_EQ(res.status, 200);
    std::vector<Json> chunks;
    for (absl::string_view event : absl::StrSplit(all, "\n\n", absl::SkipEmpty())) {
      if (absl::StartsWith(event, ":")) continue;  // keep-alive
      EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
      event.remove_prefix(6);
      if (event == "[DONE]") continue;
      EXPECT_TRUE(IsValidUtf8(event));
      chunks.push_back(Json::parse(event));
    }
    return chunks;
  }

  static ControllerServer* server_;
};

ControllerServer* Qwen3VocabSystemTest::server_ = nullptr;

TEST_F(Qwen3VocabSystemTest, PromptsTokenizeLikeTheReference) {
  const Json goldens = Goldens();
  int status = 0;
  // Completions: text through the tokenizer.
  for (int i : {5, 95, 120}) {
    const Json& s = goldens["strings"][i];
    if (!s.contains("text") || s["ids"].empty()) continue;
    Json r = Post("/v1/completions",
                  {{"prompt", s["text"]}, {"max_tokens", 2}, {"temperature", 0}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["usage"]["prompt_tokens"], s["ids"].size()) << s.dump();
  }
  // Chat: the model's template, with and without tools and thinking.
  for (int i : {2, 5, 12, 16, 18}) {
    const Json& c = goldens["conversations"][i];
    Json body = {{"messages", c["messages"]}, {"max_tokens", 2}, {"temperature", 0}};
    if (c.contains("tools")) body["tools"] = c["tools"];
    if (c.contains("kwargs")) body["chat_template_kwargs"] = c["kwargs"];
    Json r = Post("/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["usage"]["prompt_tokens"], c["ids"].size()) << "conversation " << i;
    EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  }
}

TEST_F(Qwen3VocabSystemTest, StreamedTextIsWholeCharactersAndAddsUpToTheUnaryText) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool chat = path == "/v1/chat/completions";
    Json body = {{"max_tokens", 48}, {"temperature", 0}, {"ignore_eos", true}};
    if (chat) {
      body["messages"] = {{{"role", "user"}, {"content", "你好，讲个故事 🎉"}}};
      body["chat_template_kwargs"] = {{"enable_thinking", false}};
    } else {
      body["prompt"] = "Once upon a time 日本語";
    }
    int status = 0;
    const Json unary = Post(path, body, &status);
    ASSERT_EQ(status, 200) << unary.dump();
    std::string streamed, want;
    for (const Json& chunk : Stream(path, body)) {
      if (chunk["choices"].empty()) continue;
      const Json& choice = chunk["choices"][0];
      if (chat) {
        streamed += choice["delta"].value("reasoning_content", "");
        streamed += choice["delta"].value("content", "");
      } else {
        streamed += choice["text"].get<std::string>();
      }
    }
    const Json& message = unary["choices"][0];
    if (chat) {
      if (message["message"].contains("reasoning_content")) {
        want += message["message"]["reasoning_content"].get<std::string>();
      }
      if (message["message"]["content"].is_string()) {
        want += message["message"]["content"].get<std::string>();
      }
    } else {
      want = message["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, want) << path;
    EXPECT_EQ(unary["usage"]["completion_tokens"], 48);
  }
}

TEST_F(Qwen3VocabSystemTest, UnsupportedFieldsAre400NamingThem) {
  int status = 0;
  const Json messages = {{{"role", "user"}, {"content", "hi"}}};
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, Json>>{{"response_format", {{"type", "json_object"}}},
                                                 {"logit_bias", {{"100", 5}}}}) {
    Json r = Post("/v1/chat/completions", {{"messages", messages}, {field, value}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(r["error"]["param"], field);
  }
  Json r = Post("/v1/chat/completions",
                {{"messages", messages},
                 {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
                &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "tool_choice.function.name");
}

}  // namespace
}  // namespace vamp
