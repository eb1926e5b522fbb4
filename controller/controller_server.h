// vamp-controller as an object: the gRPC server (Admin, health, reflection) and the /metrics
// exposer of one model replica. main.cc wraps it in a process; tests start it in-process.
#ifndef VAMP_CONTROLLER_CONTROLLER_SERVER_H_
#define VAMP_CONTROLLER_CONTROLLER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "controller/admin_service.h"

namespace vamp {

class ControllerServer {
 public:
  // Starts serving per `config` (schema: ControllerConfigSchema()). Errors name the address
  // that could not be bound.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(const Config& config);
  ~ControllerServer();

  int grpc_port() const { return grpc_->port(); }
  int metrics_port() const { return metrics_->port(); }
  // Stops accepting calls and waits briefly for calls in flight.
  void Shutdown();

 private:
  explicit ControllerServer(const Config& config);
  void FillStatus(vamp::v1::GetStatusResponse* status) const;

  const std::string model_;
  const std::string arbiter_;
  const int64_t start_micros_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<MetricsExposer> metrics_;
  std::unique_ptr<GrpcServer> grpc_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CONTROLLER_SERVER_H_
