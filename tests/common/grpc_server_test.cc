// A tiny gRPC server with health and reflection, called over loopback.
#include "common/grpc_server.h"

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "vamp/v1/admin.grpc.pb.h"


namespace vamp {
namespace {

class EchoStatusAdmin final : public vamp::v1::Admin::CallbackService {
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const vamp::v1::GetStatusRequest*,
                                      vamp::v1::GetStatusResponse* response) override {
    response->set_model("echo");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(GrpcServerTest, HealthReflectionAndServiceOnLoopback) {
  EchoStatusAdmin admin;
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start("127.0.0.1:0", {&admin});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                     grpc::InsecureChannelCredentials());

  auto health = grpc::health::v1::Health::NewStub(channel);
  {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  (*server)->SetServing("", false);
  {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  }

  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  vamp::v1::GetStatusResponse status;
  ASSERT_TRUE(stub->GetStatus(&ctx, {}, &status).ok());
  EXPECT_EQ(status.model(), "echo");

  // Methods the service does not implement answer UNIMPLEMENTED, not a hang or a crash.
  grpc::ClientContext ctx2;
  vamp::v1::Policy policy;
  EXPECT_EQ(stub->GetPolicy(&ctx2, {}, &policy).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(GrpcServerTest, ReflectionListsServices) {
  EchoStatusAdmin admin;
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start("127.0.0.1:0", {&admin});
  ASSERT_TRUE(server.ok()) << server.status();
  // Reflection is exercised through the generic stub so the test needs no reflection headers:
  // a ServerReflectionInfo stream with list_services = "" (field 7), framed by hand.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                  &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  // Field 7 (list_services), wire type 2, length 1, value "*".
  const char request_bytes[] = {0x3a, 0x01, '*'};
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("vamp.v1.Admin"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  ctx.TryCancel();
  call->Finish(nullptr, reinterpret_cast<void*>(4));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(GrpcServerTest, BindFailureIsAClearError) {
  EchoStatusAdmin admin;
  absl::StatusOr<std::unique_ptr<GrpcServer>> first = GrpcServer::Start("127.0.0.1:0", {&admin});
  ASSERT_TRUE(first.ok());
  EchoStatusAdmin admin2;
  absl::StatusOr<std::unique_ptr<GrpcServer>> second = GrpcServer::Start(
      "127.0.0.1:" + std::to_string((*first)->port()), {&admin2});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos);
}

}  // namespace
}  // namespace vamp
