// Runs the vampctl binary as an operator would and checks its output and exit codes.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "controller/server/controller_config.h"
#include "controller/server/controller_server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together
};

Result RunVampctl(const std::string& args) {
  const std::string command = std::string(VAMP_BINARY_DIR) + "/cli/vampctl " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[256];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(VampctlTest, UsageErrorsExitTwo) {
  Result no_command = RunVampctl("");
  EXPECT_EQ(no_command.exit_code, 2);
  EXPECT_THAT(no_command.output, HasSubstr("no command given"));
  Result bad_output = RunVampctl("-o yaml status");
  EXPECT_EQ(bad_output.exit_code, 2);
  EXPECT_THAT(bad_output.output, HasSubstr("'yaml' is not one of table, json"));
  Result unknown = RunVampctl("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  Result help = RunVampctl("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("Exit codes"));
}

TEST(VampctlTest, UnreachableControllerExitsThree) {
  // Port 1 on loopback: nothing listens there.
  Result r = RunVampctl("--endpoint 127.0.0.1:1 --timeout 2 status");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.output, HasSubstr("cannot reach 127.0.0.1:1"));
}

// Regression: vampctl waited out its whole timeout on a refused connection, and took no
// --option=value.
TEST(VampctlTest, RefusedConnectionFailsFastAndOptionsTakeEquals) {
  const auto start = std::chrono::steady_clock::now();
  Result r = RunVampctl("--endpoint=127.0.0.1:1 --timeout=30 -o json status");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot reach 127.0.0.1:1 (connection refused"));
  EXPECT_LT(seconds, 10) << "vampctl waited for its timeout";
  Result bad = RunVampctl("--timeout=never status");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("'never' is not a positive number"));
  Result ca = RunVampctl("--ca_file=/nonexistent/ca.pem status");
  EXPECT_EQ(ca.exit_code, 2);
  EXPECT_THAT(ca.output, HasSubstr("--ca_file"));
}

TEST(VampctlTest, HealthAndStatusAgainstLiveController) {
  const std::string model = std::string("--model_path=") + VAMP_TEST_DATA_DIR + "/tiny-qwen3-moe";
  const char* argv[] = {"vamp-controller",
                        "--grpc_address=127.0.0.1:0",
                        "--admin_address=127.0.0.1:0",
                        "--http_address=127.0.0.1:0",
                        "--metrics_address=",
                        model.c_str(),
                        "--insecure_no_auth"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(ControllerConfigSchema(), 7, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = "--endpoint 127.0.0.1:" + std::to_string((*server)->admin_port());
  Result health = RunVampctl(endpoint + " health");
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("SERVING"));
  Result table = RunVampctl(endpoint + " status");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("model          tiny-qwen3-moe"));
  Result json = RunVampctl(endpoint + " -o json status");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"policy\": \"vamp\""));
  Result policy = RunVampctl(endpoint + " policy get");
  EXPECT_EQ(policy.exit_code, 0) << policy.output;
  EXPECT_THAT(policy.output, HasSubstr("max offload ratio  0.25"));
  // No agents yet: the server refuses a forced offload (exit 4 = server error).
  Result offload = RunVampctl(endpoint + " offload 2");
  EXPECT_EQ(offload.exit_code, 4) << offload.output;
  EXPECT_THAT(offload.output, HasSubstr("not being served"));
  EXPECT_EQ(RunVampctl(endpoint + " offload zero").exit_code, 2);
  EXPECT_EQ(RunVampctl(endpoint + " policy set").exit_code, 2);
  EXPECT_EQ(RunVampctl(endpoint + " policy frob").exit_code, 2);
  EXPECT_THAT(table.output, HasSubstr("agents         none registered"));
}

// status lists every registered rank's agent and metrics addresses, in the table and in JSON,
// and says when the controller found an agent gone (here: nothing listens at its address).
TEST(VampctlTest, StatusListsAgentAddressesAndGoneAgents) {
  const std::string model = std::string("--model_path=") + VAMP_TEST_DATA_DIR + "/tiny-qwen3-moe";
  const char* argv[] = {"vamp-controller",
                        "--grpc_address=127.0.0.1:0",
                        "--admin_address=127.0.0.1:0",
                        "--http_address=127.0.0.1:0",
                        "--metrics_address=",
                        model.c_str(),
                        "--insecure_no_auth"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(ControllerConfigSchema(), 7, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = ControllerServer::Start(cli->config);
  ASSERT_TRUE(server.ok()) << server.status();
  auto registry = vamp::v1::AgentRegistry::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));
  vamp::v1::RegisterRequest request;
  request.set_rank(0);
  request.set_agent_address("127.0.0.1:1");  // nothing listens there
  request.set_metrics_address("127.0.0.1:19500");
  grpc::ClientContext ctx;
  vamp::v1::RegisterResponse response;
  ASSERT_TRUE(registry->Register(&ctx, request, &response).ok());
  const std::string endpoint = "--endpoint 127.0.0.1:" + std::to_string((*server)->admin_port());
  Result table;
  for (int i = 0; i < 100; ++i) {
    table = RunVampctl(endpoint + " status");
    if (table.output.find(" gone") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("agent address"));
  EXPECT_THAT(table.output,
              ::testing::ContainsRegex("0 +127\\.0\\.0\\.1:1 +127\\.0\\.0\\.1:19500 +gone"));
  Result json = RunVampctl(endpoint + " -o json status");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"agentAddress\": \"127.0.0.1:1\""));
  EXPECT_THAT(json.output, HasSubstr("\"metricsAddress\": \"127.0.0.1:19500\""));
  EXPECT_THAT(json.output, HasSubstr("\"gone\": true"));
  (*server)->Shutdown();
}

}  // namespace
}  // namespace vamp
