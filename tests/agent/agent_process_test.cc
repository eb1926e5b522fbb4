// The vamp-agent process around the engine: its flags, authentication, /metrics, registration
// with the controller (and again after a controller restart), and the real binary.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "tests/common/metrics_scrape.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

// The agent's flags as its main() reads them (argv[0] added).
absl::StatusOr<AgentOptions> ParseAgentFlags(std::vector<std::string> args) {
  args.insert(args.begin(), "vamp-agent");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  absl::StatusOr<CommandLine> cli =
      ParseCommandLine(AgentConfigSchema(), static_cast<int>(argv.size()), argv.data());
  if (!cli.ok()) return cli.status();
  return AgentOptionsFromConfig(cli->config);
}

TEST(AgentTest, CudaDeviceWithoutOrdinalFollowsTheRank) {
  auto parse_insecure = [](std::vector<std::string> args) {
    args.push_back("--insecure_no_auth");
    return ParseAgentFlags(std::move(args));
  };
  struct Case {
    std::vector<std::string> args;
    int ordinal;
  };
  for (const Case& c : std::vector<Case>{{{"--device=cuda", "--rank=1"}, 1},
                                         {{"--device=cuda"}, 0},
                                         {{"--device=cuda:3", "--rank=1"}, 3},
                                         {{"--device=cuda:0", "--rank=1"}, 0}}) {
    absl::StatusOr<AgentOptions> o = parse_insecure(c.args);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->device.kind, DeviceSpec::Kind::kCuda);
    EXPECT_EQ(o->device.ordinal, c.ordinal) << c.args[0];
  }
  absl::StatusOr<AgentOptions> cpu = parse_insecure({"--device=cpu", "--rank=1"});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device.kind, DeviceSpec::Kind::kCpu);
}

// An agent runs with a token (from --auth_token_file, or from the environment of the
// controller that spawned it) unless told explicitly to run without one.
TEST(AgentTest, TokenRequiredUnlessInsecureFlag) {
  absl::StatusOr<AgentOptions> none = ParseAgentFlags({});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("auth_token_file"));
  EXPECT_THAT(none.status().message(), HasSubstr("insecure_no_auth"));
  absl::StatusOr<AgentOptions> insecure = ParseAgentFlags({"--insecure_no_auth"});
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_TRUE(insecure->auth_token.empty());

  ASSERT_EQ(::setenv("VAMP_AGENT_AUTH_TOKEN", "from-the-controller-0123", 1), 0);
  absl::StatusOr<AgentOptions> spawned = ParseAgentFlags({});
  ASSERT_TRUE(spawned.ok()) << spawned.status();
  EXPECT_EQ(spawned->auth_token, "from-the-controller-0123");
  EXPECT_EQ(std::getenv("VAMP_AGENT_AUTH_TOKEN"), nullptr) << "the token stays in the environment";

  const std::string two_lines = ::testing::TempDir() + "/agent_two_line_token";
  std::ofstream(two_lines) << "line-one-hunter2\nline-two-hunter2\n";
  absl::StatusOr<AgentOptions> bad = ParseAgentFlags({"--auth_token_file=" + two_lines});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(two_lines));
  EXPECT_THAT(bad.status().message(), ::testing::Not(HasSubstr("hunter2")));
}

TEST(AgentTest, AuthTokenRequiredWhenConfigured) {
  AgentOptions options = TinyAgentOptions();
  options.auth_token = "s3cret-token";
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  vamp::v1::GetStatsResponse stats;
  AgentClient none(agent->grpc_port());
  grpc::Status s = none.GetStats(&stats);
  EXPECT_EQ(s.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("s3cret")));
  AgentClient wrong(agent->grpc_port(), "s3cret-tokeX");
  EXPECT_EQ(wrong.GetStats(&stats).error_code(), grpc::UNAUTHENTICATED);
  vamp::v1::InitResponse init;
  EXPECT_EQ(wrong.Init(TinyInitRequest(), &init).error_code(), grpc::UNAUTHENTICATED);
  auto step = wrong.Step(vamp::v1::StepRequest());
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("invalid auth token"));
  AgentClient right(agent->grpc_port(), "s3cret-token");
  EXPECT_TRUE(right.GetStats(&stats).ok());
  EXPECT_TRUE(right.Init(TinyInitRequest(), &init).ok());
  auto ok = right.Step(vamp::v1::StepRequest());
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->error_message(), "");
  // Health stays open for probes.
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", agent->grpc_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_TRUE(health->Check(&context, {}, &response).ok());
}

TEST(AgentTest, MetricsPassPromtool) {
  AgentOptions options = TinyAgentOptions();
  options.metrics_address = "127.0.0.1:0";
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  ASSERT_GT(agent->metrics_port(), 0);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  MiniController controller;
  controller.Submit(1, LoadGoldens().prompts[1], 3);
  controller.Run(client);
  auto offload = client.Step(
      RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD, 2, 0, "m"));
  ASSERT_EQ(offload->error_message(), "");
  absl::StatusOr<std::string> body = testing::ScrapeMetrics(agent->metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("vamp_agent_initialized 1"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_offloaded_groups 2"));
  EXPECT_THAT(*body,
              HasSubstr(absl::StrCat("vamp_agent_kv_pool_blocks ", offload->memory().kv_blocks())));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_offloaded_expert_bytes 147456"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_resident_expert_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_kv_pool_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_staging_buffer_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_staging_stall_seconds_bucket"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_step_duration_seconds_count"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_remap_duration_seconds_bucket{action=\"offload\""));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_sampled_tokens_total 3"));
  absl::Status check = testing::PromtoolCheckMetrics(*body);
  if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
  EXPECT_TRUE(check.ok()) << check;
}

// A stand-in for the controller's AgentRegistry.
class FakeRegistry final : public vamp::v1::AgentRegistry::Service {
 public:
  grpc::Status Register(grpc::ServerContext* context, const vamp::v1::RegisterRequest* request,
                        vamp::v1::RegisterResponse* response) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    response->set_rank(request->rank() < 0 ? 0 : request->rank());
    response->set_world_size(1);
    response->set_controller_id(id_);
    response->set_health_service(health_service());
    return grpc::Status::OK;
  }
  std::vector<vamp::v1::RegisterRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::string health_service() const { return "vamp.controller." + id_; }
  std::string id_ = "controller-1";

 private:
  absl::Mutex mu_;
  std::vector<vamp::v1::RegisterRequest> requests_;
};

TEST(AgentTest, RegistersAndRegistersAgainAfterControllerRestart) {
  FakeRegistry registry;
  auto controller = GrpcServer::Start("127.0.0.1:0", {&registry});
  ASSERT_TRUE(controller.ok()) << controller.status();
  (*controller)->SetServing(registry.health_service(), true);
  const int port = (*controller)->port();
  AgentOptions options = TinyAgentOptions();
  options.controller_address = absl::StrCat("127.0.0.1:", port);
  options.auth_token = "tok";
  options.registration.max_backoff_ms = 200;
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->registrar()->WaitForRegistrations(1, 10000));
  auto requests = registry.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].auth_token(), "tok");
  EXPECT_EQ(requests[0].rank(), -1);
  EXPECT_EQ(requests[0].device(), "cpu");
  EXPECT_EQ(requests[0].agent_address(), absl::StrCat("127.0.0.1:", agent->grpc_port()));
  EXPECT_EQ(requests[0].device_total_bytes(), uint64_t{8} << 20);
  EXPECT_FALSE(requests[0].version().empty());

  // The controller restarts on the same port: the agent notices and registers again, asking for
  // the rank it had.
  (*controller)->Shutdown(0);
  controller->reset();
  FakeRegistry restarted;
  restarted.id_ = "controller-2";
  absl::StatusOr<std::unique_ptr<GrpcServer>> again;
  for (int i = 0; i < 50; ++i) {
    again = GrpcServer::Start(absl::StrCat("127.0.0.1:", port), {&restarted});
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  (*again)->SetServing(restarted.health_service(), true);
  ASSERT_TRUE(agent->registrar()->WaitForRegistrations(2, 15000));
  ASSERT_GE(restarted.requests().size(), 1u);
  EXPECT_EQ(restarted.requests()[0].rank(), 0);
  EXPECT_EQ(agent->registrar()->last_response().controller_id(), "controller-2");
}

TEST(AgentTest, RegistrationRetriesUntilControllerStarts) {
  const int port = testing::PickFreePort();
  AgentOptions options = TinyAgentOptions();
  options.controller_address = absl::StrCat("127.0.0.1:", port);
  options.registration.initial_backoff_ms = 50;
  options.registration.max_backoff_ms = 200;
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  EXPECT_FALSE(agent->registrar()->WaitForRegistrations(1, 500));
  FakeRegistry registry;
  auto controller = GrpcServer::Start(absl::StrCat("127.0.0.1:", port), {&registry});
  ASSERT_TRUE(controller.ok()) << controller.status();
  EXPECT_TRUE(agent->registrar()->WaitForRegistrations(1, 10000));
}

// The real binary: flags, ready file, gRPC, SIGTERM.
TEST(AgentBinaryTest, ServesWithReadyFile) {
  const std::string binary = std::string(VAMP_BINARY_DIR) + "/agent/vamp-agent";
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  const std::string dir = ::testing::TempDir() + "/vamp_agent_bin_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string ready = dir + "/ready.json";
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "bin-token\n";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string ready_flag = "--ready_file=" + ready;
    const std::string token_flag = "--auth_token_file=" + token_file;
    ::execl(binary.c_str(), binary.c_str(), "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
            "--host_page_bytes=4096", "--host_memory_bytes=8388608", "--log_level=warning",
            ready_flag.c_str(), token_flag.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  nlohmann::json ports;
  for (int i = 0; i < 200 && ports.is_null(); ++i) {
    std::ifstream in(ready);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      ports = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (ports.is_discarded()) ports = nullptr;
    }
    if (ports.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(ports.is_null()) << "no ready file";
  const int grpc_port = ports["grpc_port"].get<int>();
  EXPECT_GT(ports["metrics_port"].get<int>(), 0);
  EXPECT_EQ(ports["address"].get<std::string>(), absl::StrCat("127.0.0.1:", grpc_port));
  {
    AgentClient client(grpc_port, "bin-token");
    vamp::v1::InitResponse init;
    grpc::Status s = client.Init(TinyInitRequest(), &init);
    ASSERT_TRUE(s.ok()) << s.error_message();
    MiniController controller;
    controller.Submit(1, LoadGoldens().prompts[1], 16);
    controller.Run(client);
    EXPECT_EQ(controller.request(1).outputs, LoadGoldens().continuations[1]);
    vamp::v1::GetStatsResponse stats;
    AgentClient anonymous(grpc_port);
    EXPECT_EQ(anonymous.GetStats(&stats).error_code(), grpc::UNAUTHENTICATED);
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

TEST(AgentBinaryTest, BadFlagsExitWithUsageError) {
  const std::string binary = std::string(VAMP_BINARY_DIR) + "/agent/vamp-agent";
  const std::string cmd = binary + " --device=tpu 2>/dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string missing = binary + " --auth_token_file=/nonexistent/token 2>/dev/null";
  const int status2 = std::system(missing.c_str());
  ASSERT_TRUE(WIFEXITED(status2));
  EXPECT_EQ(WEXITSTATUS(status2), 2);
}

}  // namespace
}  // namespace vamp::testing
