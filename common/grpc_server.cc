#include "common/grpc_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& address, const std::vector<grpc::Service*>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Fail loudly when the port is taken instead of silently sharing it with another process.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients keep their channels alive with a ping every 2 s, also while a stream is idle (the
  // controller's step stream between requests, an agent watching the controller's health). The
  // server default accepts such pings only every 5 minutes and answers the third early one with
  // GOAWAY "too_many_pings", which dropped an idle controller's agents every ~15 s: accept them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A step carrying many long new prompts exceeds gRPC's 4 MiB default.
  builder.SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
  builder.SetMaxSendMessageSize(kGrpcMaxMessageBytes);
  int port = 0;
  builder.AddListeningPort(address,
                           credentials ? credentials : grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on '", address,
                                               "' (address in use or malformed?)"));
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port));
}

GrpcServer::~GrpcServer() { Shutdown(0); }

void GrpcServer::SetServing(const std::string& service, bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  if (service.empty()) {
    health->SetServingStatus(serving);
  } else {
    health->SetServingStatus(service, serving);
  }
}

void GrpcServer::Shutdown(int deadline_ms) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  server_->Wait();
}

}  // namespace vamp
