// A gRPC server with the services every VAMP server carries: grpc.health.v1 and server reflection.
#ifndef VAMP_COMMON_GRPC_SERVER_H_
#define VAMP_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace vamp {

// The gRPC status for an absl::Status: the same code (both follow google.rpc.Code) and message.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Largest gRPC message VAMP servers accept or send (bytes); clients should allow the same.
inline constexpr int kGrpcMaxMessageBytes = 256 << 20;

class GrpcServer {
 public:
  // Builds and starts a server listening on `address` ("host:port"; port 0 picks a free one)
  // with `services` (not owned; they must outlive the server), the standard health service (all
  // services reported SERVING) and reflection. `credentials` defaults to insecure.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& address, const std::vector<grpc::Service*>& services,
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

  ~GrpcServer();

  // The port actually bound.
  int port() const { return port_; }
  // Marks `service` ("" for the whole server) SERVING or NOT_SERVING in grpc.health.v1.
  void SetServing(const std::string& service, bool serving);
  // Stops accepting calls and waits up to `deadline_ms` for calls in flight.
  void Shutdown(int deadline_ms = 2000);
  grpc::Server* server() { return server_.get(); }

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  std::unique_ptr<grpc::Server> server_;
  int port_;
  bool shut_down_ = false;
};

}  // namespace vamp

#endif  // VAMP_COMMON_GRPC_SERVER_H_
