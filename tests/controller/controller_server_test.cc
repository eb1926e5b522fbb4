#include "controller/controller_server.h"

#include "controller/controller_config.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/common/metrics_scrape.h"
#include "vamp/v1/admin.grpc.pb.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<ControllerServer>> StartOnFreePorts(const char* arbiter) {
  const char* argv[] = {"vamp-controller", "--grpc_address=127.0.0.1:0",
                        "--metrics_address=127.0.0.1:0", arbiter};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(ControllerConfigSchema(), 4, argv);
  if (!cli.ok()) return cli.status();
  return ControllerServer::Start(cli->config);
}

TEST(ControllerServerTest, StatusOverGrpcAndMetricsPassPromtool) {
  absl::StatusOr<std::unique_ptr<ControllerServer>> server = StartOnFreePorts("--arbiter=static");
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = vamp::v1::Admin::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  vamp::v1::GetStatusResponse status;
  ASSERT_TRUE(stub->GetStatus(&ctx, {}, &status).ok());
  EXPECT_EQ(status.policy(), "static");
  EXPECT_EQ(status.model(), "tiny-qwen3-moe");
  EXPECT_FALSE(status.serving());
  EXPECT_GE(status.uptime_seconds(), 0.0);

  absl::StatusOr<std::string> body = testing::ScrapeMetrics((*server)->metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("vamp_controller_build_info{version=\"0.1.0\"} 1"));
  absl::Status check = testing::PromtoolCheckMetrics(*body);
  if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
  EXPECT_TRUE(check.ok()) << check;
}

TEST(ControllerServerTest, BadConfigNamesField) {
  const char* argv[] = {"vamp-controller", "--max_offload_ratio=1.5"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(ControllerConfigSchema(), 2, argv);
  ASSERT_FALSE(cli.ok());
  EXPECT_THAT(cli.status().message(), HasSubstr("'max_offload_ratio'"));
}

}  // namespace
}  // namespace vamp
