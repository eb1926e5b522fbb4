// The controller on its own (no agents registered): every frontend answers, reports that the model
// is not served yet, and bad configuration fails start-up naming the field.
#include "controller/server/controller_server.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "common/grpc_server.h"
#include "controller/server/controller_config.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/common/metrics_scrape.h"
#include "vamp/v1/admin.grpc.pb.h"
#include "vamp/v1/agent.grpc.pb.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<CommandLine> Flags(std::vector<std::string> extra) {
  std::vector<std::string> args = {"vamp-controller",
                                   "--grpc_address=127.0.0.1:0",
                                   "--admin_address=127.0.0.1:0",
                                   "--http_address=127.0.0.1:0",
                                   "--metrics_address=127.0.0.1:0",
                                   std::string("--model_path=") + VAMP_TEST_DATA_DIR +
                                       "/tiny-qwen3-moe"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(ControllerConfigSchema(), static_cast<int>(argv.size()), argv.data());
}

// An agent that registers and then lies in its Init answer: about its KV blocks, or with an offload
// geometry under which its pool would reach 2^29 blocks.
class LyingAgent final : public vamp::v1::Agent::Service {
 public:
  enum class Lie { kInitKvBlocks, kOffloadGeometry };
  explicit LyingAgent(Lie lie) : lie_(lie) {}

  grpc::Status Init(grpc::ServerContext*, const vamp::v1::InitRequest*,
                    vamp::v1::InitResponse* response) override {
    response->set_num_layers(2);
    response->set_num_experts(8);
    response->set_experts_per_group(1);
    response->set_vocab_size(256);
    response->set_eos_token_id(1);
    response->set_max_position_embeddings(64);
    vamp::v1::RankMemory& m = *response->mutable_memory();
    m.set_device("cpu");
    m.set_device_total_bytes(uint64_t{1} << 30);
    m.set_kv_pool_bytes(1 << 20);
    m.set_kv_blocks(lie_ == Lie::kInitKvBlocks ? 2147483647 : 100);
    m.set_page_bytes(4096);
    m.set_max_offload_groups(2);
    vamp::v1::OffloadGeometry& g = *response->mutable_offload();
    // Honest: 10 KiB blocks. The lie: 1-byte blocks, 256 MiB of KV per group.
    g.set_kv_block_bytes(lie_ == Lie::kOffloadGeometry ? 1 : 10 << 10);
    g.set_kv_pages_per_group(lie_ == Lie::kOffloadGeometry ? 65536 : 16);
    absl::MutexLock lock(&mu_);
    ++inits_;
    return grpc::Status::OK;
  }
  grpc::Status GetStats(grpc::ServerContext*, const vamp::v1::GetStatsRequest*,
                        vamp::v1::GetStatsResponse* response) override {
    response->mutable_memory()->set_device("cpu");
    return grpc::Status::OK;
  }
  int inits() {
    absl::MutexLock lock(&mu_);
    return inits_;
  }

 private:
  const Lie lie_;
  absl::Mutex mu_;
  int inits_ ABSL_GUARDED_BY(mu_) = 0;
};

// Regression: an agent reporting kv_blocks = 2^31 - 1 crashed the controller with std::bad_alloc.
// Its reports, the offload geometry every later pool size comes from included, are checked and
// the agent refused; the controller keeps answering.
TEST(ControllerServerTest, LyingAgentIsRefusedNotFatal) {
  for (LyingAgent::Lie lie : {LyingAgent::Lie::kOffloadGeometry, LyingAgent::Lie::kInitKvBlocks}) {
    absl::StatusOr<CommandLine> cli = Flags({"--insecure_no_auth"});
    ASSERT_TRUE(cli.ok()) << cli.status();
    absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
    ASSERT_TRUE(server.ok()) << server.status();
    LyingAgent agent(lie);
    absl::StatusOr<std::unique_ptr<GrpcServer>> agent_server =
        GrpcServer::Start("127.0.0.1:0", {&agent});
    ASSERT_TRUE(agent_server.ok()) << agent_server.status();
    auto registry = vamp::v1::AgentRegistry::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));
    vamp::v1::RegisterRequest request;
    request.set_rank(0);
    request.set_agent_address("127.0.0.1:" + std::to_string((*agent_server)->port()));
    grpc::ClientContext ctx;
    vamp::v1::RegisterResponse response;
    ASSERT_TRUE(registry->Register(&ctx, request, &response).ok());
    // The controller initialises the agent and checks its answer.
    for (int i = 0; i < 500 && agent.inits() == 0; ++i) absl::SleepFor(absl::Milliseconds(20));
    ASSERT_GT(agent.inits(), 0);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_FALSE((*server)->serving());
    // Refused for that lie, named.
    auto admin = vamp::v1::Admin::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->admin_port()),
                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext status_ctx;
    vamp::v1::GetStatusResponse status;
    ASSERT_TRUE(admin->GetStatus(&status_ctx, {}, &status).ok());
    EXPECT_THAT(status.last_error(),
                HasSubstr(lie == LyingAgent::Lie::kOffloadGeometry ? "offload.kv_block_bytes"
                                                                   : "memory.kv_blocks"));
    httplib::Client http("127.0.0.1", (*server)->http_port());
    auto h = http.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 503);
    (*server)->Shutdown();
    (*agent_server)->Shutdown(0);
  }
}

TEST(ControllerServerTest, AnswersEverywhereBeforeAgentsArrive) {
  absl::StatusOr<CommandLine> cli = Flags({"--arbiter=static", "--insecure_no_auth"});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->serving());

  auto admin = vamp::v1::Admin::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->admin_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  vamp::v1::GetStatusResponse status;
  ASSERT_TRUE(admin->GetStatus(&ctx, {}, &status).ok());
  EXPECT_EQ(status.policy(), "static");
  EXPECT_FALSE(status.serving());
  grpc::ClientContext offload_ctx;
  vamp::v1::ForceRemapRequest one;
  one.set_num_groups(1);
  vamp::v1::ForceRemapResponse remapped;
  EXPECT_EQ(admin->ForceOffload(&offload_ctx, one, &remapped).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // gRPC health: the process answers, the Serving service is NOT_SERVING until agents serve.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckRequest hreq;
  hreq.set_service("vamp.v1.Serving");
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  auto serving = vamp::v1::Serving::NewStub(channel);
  grpc::ClientContext gctx;
  vamp::v1::GenerateRequest greq;
  greq.add_prompt_token_ids(1);
  auto reader = serving->Generate(&gctx, greq);
  vamp::v1::GenerateResponse gresp;
  while (reader->Read(&gresp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto h = http.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  auto c = http.Post("/v1/completions", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 503);
  EXPECT_THAT(c->body, HasSubstr("not being served yet"));
  auto missing = http.Get("/v2/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(nlohmann::json::parse(missing->body)["error"]["code"], 404);

  for (int port : {(*server)->metrics_port(), (*server)->http_port()}) {
    absl::StatusOr<std::string> body = testing::ScrapeMetrics(port);
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_THAT(*body, HasSubstr("vamp_controller_build_info{version=\"0.1.0\"} 1"));
    absl::Status check = testing::PromtoolCheckMetrics(*body);
    if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
    EXPECT_TRUE(check.ok()) << check;
  }
}

TEST(ControllerServerTest, BadConfigNamesField) {
  absl::StatusOr<CommandLine> range = Flags({"--max_offload_ratio=1.5"});
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(range.status().message(), HasSubstr("'max_offload_ratio'"));

  const char* argv[] = {"vamp-controller", "--grpc_address=127.0.0.1:0"};
  absl::StatusOr<CommandLine> no_model = ParseCommandLine(ControllerConfigSchema(), 2, argv);
  ASSERT_TRUE(no_model.ok());
  absl::StatusOr<std::unique_ptr<ControllerServer>> server =
      ControllerServer::Start(no_model->config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("model_path"));

  absl::StatusOr<CommandLine> bad_token = Flags({"--auth_token_file=/nonexistent/token"});
  ASSERT_TRUE(bad_token.ok());
  server = ControllerServer::Start(bad_token->config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("auth_token_file"));
}

// A model folder whose tokenizer.json cannot be used stops start-up naming the file and
// the field, before anything listens; the agents never get the model.
TEST(ControllerServerTest, UnusableTokenizerStopsStartUpNamingFileAndField) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("vamp_bad_tokenizer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(VAMP_TEST_DATA_DIR) + "/tiny-qwen3-moe/config.json",
                             dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer.json")
      << R"({"model": {"type": "Unigram", "vocab": []}, "pre_tokenizer": null})";
  absl::StatusOr<CommandLine> cli =
      Flags({"--insecure_no_auth", "--model_path=" + dir.string()});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("model_path"));
  EXPECT_THAT(server.status().message(), HasSubstr("tokenizer.json: model.type"));
  std::filesystem::remove_all(dir);
}

// Agents started elsewhere register with a token, or the operator says explicitly that
// any process may register.
TEST(ControllerServerTest, ExternalAgentsNeedTokenOrExplicitInsecureFlag) {
  absl::StatusOr<CommandLine> cli = Flags({});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("auth_token_file"));
  EXPECT_THAT(server.status().message(), HasSubstr("insecure_no_auth"));

  cli = Flags({"--insecure_no_auth"});
  ASSERT_TRUE(cli.ok()) << cli.status();
  server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Shutdown();

  // With a token file, a registration needs its token.
  const std::string token_file = ::testing::TempDir() + "/controller_token";
  std::ofstream(token_file) << "controller-test-token\n";
  cli = Flags({"--auth_token_file=" + token_file});
  ASSERT_TRUE(cli.ok()) << cli.status();
  server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  auto registry = vamp::v1::AgentRegistry::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));
  for (const std::string& token : {std::string(), std::string("controller-test-tokeX"),
                                   std::string("controller-test-token")}) {
    vamp::v1::RegisterRequest request;
    request.set_rank(0);
    request.set_agent_address("127.0.0.1:1");
    request.set_auth_token(token);
    grpc::ClientContext ctx;
    vamp::v1::RegisterResponse response;
    EXPECT_EQ(
        registry->Register(&ctx, request, &response).error_code(),
        token == "controller-test-token" ? grpc::StatusCode::OK : grpc::StatusCode::UNAUTHENTICATED)
        << token;
  }
}

// Regression: gRPC Serving ignored --api_key_file; it requires the same keys as HTTP.
TEST(ControllerServerTest, GrpcServingRequiresTheHttpApiKeys) {
  const std::string keys = ::testing::TempDir() + "/controller_api_keys";
  std::ofstream(keys) << "# clients\nkey-one-123456\nkey-two-123456\n";
  absl::StatusOr<CommandLine> cli = Flags({"--insecure_no_auth", "--api_key_file=" + keys});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  auto serving = vamp::v1::Serving::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                          grpc::InsecureChannelCredentials()));
  // Keyless, wrong-key and right-key calls; with the right key the call gets as far as the model,
  // which is not served yet (no agents).
  for (const auto& [key, code] : std::vector<std::pair<std::string, grpc::StatusCode>>{
           {"", grpc::StatusCode::UNAUTHENTICATED},
           {"key-one-12345X", grpc::StatusCode::UNAUTHENTICATED},
           {"key-two-123456", grpc::StatusCode::UNAVAILABLE}}) {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    vamp::v1::GenerateRequest request;
    request.add_prompt_token_ids(1);
    auto reader = serving->Generate(&ctx, request);
    vamp::v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), code) << "key '" << key << "'";
    grpc::ClientContext list_ctx;
    if (!key.empty()) list_ctx.AddMetadata("authorization", "Bearer " + key);
    vamp::v1::ListModelsResponse models;
    EXPECT_EQ(serving->ListModels(&list_ctx, {}, &models).error_code(),
              code == grpc::StatusCode::UNAUTHENTICATED ? code : grpc::StatusCode::OK)
        << "key '" << key << "'";
  }
  // HTTP agrees.
  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto keyless = http.Post("/v1/completions", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(keyless);
  EXPECT_EQ(keyless->status, 401);
}

// Regression: a two-line or non-ASCII token made agents abort in a loop and gRPC print the secret.
// Every token file is one validated line, and a bad one fails start-up naming the file only.
TEST(ControllerServerTest, BadTokenFilesFailStartUpNamingTheFileNotTheSecret) {
  const std::string dir = ::testing::TempDir();
  struct Case {
    std::string name, content, field;
  };
  for (const Case& c : std::vector<Case>{
           {"two_lines", "first-secret-line\nsecond-secret-line\n", "auth_token_file"},
           {"non_ascii", "caf\xc3\xa9-secret-token\n", "auth_token_file"},
           {"control", "tab\tsecret-token\n", "auth_token_file"},
           {"short", "secret\n", "auth_token_file"},
           {"empty", "\n\n", "auth_token_file"},
           {"key_non_ascii", "good-key-12345\nbad-key-\xff-secret\n", "api_key_file"}}) {
    const std::string path = dir + "/bad_" + c.name;
    std::ofstream(path, std::ios::binary) << c.content;
    absl::StatusOr<CommandLine> cli = Flags({"--insecure_no_auth", "--" + c.field + "=" + path});
    ASSERT_TRUE(cli.ok()) << cli.status();
    absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
    ASSERT_FALSE(server.ok()) << c.name;
    const std::string message(server.status().message());
    EXPECT_THAT(message, HasSubstr(c.field)) << c.name;
    EXPECT_THAT(message, HasSubstr(path)) << c.name;
    EXPECT_THAT(message, ::testing::Not(HasSubstr("secret"))) << c.name << ": " << message;
  }
}

namespace targets_file {

// The targets file's groups, or nullopt when it is missing or not a JSON array (a torn write).
std::optional<nlohmann::json> ReadTargets(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return std::nullopt;
  return j;
}

// The agent targets ("host:port") the file lists.
std::vector<std::string> AgentTargets(const nlohmann::json& groups) {
  std::vector<std::string> out;
  for (const auto& g : groups) {
    if (g["labels"]["vamp_role"] == "agent") out.push_back(g["targets"][0].get<std::string>());
  }
  return out;
}

}  // namespace targets_file

// --metrics_targets_file: the /metrics/targets JSON (Prometheus file_sd) at start, rewritten when
// an agent registers and when it goes away (its group cannot be brought up and it refuses
// connections), always whole: a reader polling the file never sees a torn one, and no temporary
// file is left behind.
TEST(ControllerServerTest, MetricsTargetsFileFollowsAgentsAndIsWrittenAtomically) {
  using targets_file::AgentTargets;
  using targets_file::ReadTargets;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("vamp_targets_file_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "vamp-targets.json";
  absl::StatusOr<CommandLine> cli =
      Flags({"--insecure_no_auth", "--replica=r1", "--metrics_targets_file=" + file.string()});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();

  // At start: the controller alone, the same JSON as GET /metrics/targets.
  std::optional<nlohmann::json> at_start = ReadTargets(file);
  ASSERT_TRUE(at_start.has_value());
  ASSERT_EQ(at_start->size(), 1u);
  EXPECT_EQ((*at_start)[0]["targets"][0], "127.0.0.1:" + std::to_string((*server)->metrics_port()));
  EXPECT_EQ((*at_start)[0]["labels"]["replica"], "r1");
  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto served = http.Get("/metrics/targets");
  ASSERT_TRUE(served);
  EXPECT_EQ(nlohmann::json::parse(served->body), *at_start);

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, torn{0};
  std::thread reader([&] {
    while (!stop.load()) {
      if (!ReadTargets(file).has_value()) ++torn;
      ++reads;
    }
  });

  // A live agent (it fails Init, so the model is not served, but it answers): registered.
  LyingAgent agent(LyingAgent::Lie::kInitKvBlocks);
  absl::StatusOr<std::unique_ptr<GrpcServer>> agent_server =
      GrpcServer::Start("127.0.0.1:0", {&agent});
  ASSERT_TRUE(agent_server.ok()) << agent_server.status();
  const std::string agent_address = "127.0.0.1:" + std::to_string((*agent_server)->port());
  auto registry = vamp::v1::AgentRegistry::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));
  vamp::v1::RegisterRequest request;
  request.set_rank(0);
  request.set_agent_address(agent_address);
  request.set_metrics_address("127.0.0.1:19400");
  {
    grpc::ClientContext ctx;
    vamp::v1::RegisterResponse response;
    ASSERT_TRUE(registry->Register(&ctx, request, &response).ok());
  }
  std::optional<nlohmann::json> registered = ReadTargets(file);
  ASSERT_TRUE(registered.has_value());
  EXPECT_THAT(AgentTargets(*registered), ::testing::ElementsAre("127.0.0.1:19400"));
  for (int i = 0; i < 500 && agent.inits() == 0; ++i) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GT(agent.inits(), 0);
  absl::SleepFor(absl::Milliseconds(1500));  // the failed bring-up probed it: it answers
  EXPECT_THAT(AgentTargets(*ReadTargets(file)), ::testing::ElementsAre("127.0.0.1:19400"));

  // The agent goes away: when the controller next tries the registered set (within seconds),
  // it cannot connect, and the file drops the agent.
  (*agent_server)->Shutdown(0);
  bool dropped = false;
  for (int i = 0; i < 300 && !dropped; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    std::optional<nlohmann::json> now = ReadTargets(file);
    dropped = now.has_value() && AgentTargets(*now).empty() && now->size() == 1;
  }
  EXPECT_TRUE(dropped) << "the targets file still lists the agent that went away";
  auto admin = vamp::v1::Admin::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->admin_port()), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    vamp::v1::GetStatusResponse status;
    ASSERT_TRUE(admin->GetStatus(&ctx, {}, &status).ok());
    ASSERT_EQ(status.agents_size(), 1);
    EXPECT_EQ(status.agents(0).agent_address(), agent_address);
    EXPECT_EQ(status.agents(0).metrics_address(), "127.0.0.1:19400");
    EXPECT_TRUE(status.agents(0).gone());
  }

  // It registers again (a restarted agent, at a new metrics port): back in the file.
  request.set_metrics_address("127.0.0.1:19401");
  {
    grpc::ClientContext ctx;
    vamp::v1::RegisterResponse response;
    ASSERT_TRUE(registry->Register(&ctx, request, &response).ok());
  }
  EXPECT_THAT(AgentTargets(*ReadTargets(file)), ::testing::ElementsAre("127.0.0.1:19401"));
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(torn.load(), 0) << "a reader saw a missing or partial targets file";
  (*server)->Shutdown();
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(left, ::testing::ElementsAre("vamp-targets.json")) << "temporary files left over";
  std::filesystem::remove_all(dir);
}

// An unwritable --metrics_targets_file stops start-up naming the field.
TEST(ControllerServerTest, UnwritableMetricsTargetsFileNamesTheField) {
  absl::StatusOr<CommandLine> cli =
      Flags({"--insecure_no_auth", "--metrics_targets_file=/nonexistent-dir/targets.json"});
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("metrics_targets_file"));
  EXPECT_THAT(server.status().message(), HasSubstr("/nonexistent-dir/targets.json"));
}

}  // namespace
}  // namespace vamp
