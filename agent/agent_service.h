// The vamp-agent server: the Agent gRPC service (proto/vamp/v1/agent.proto) over an AgentEngine,
// with grpc.health.v1 and reflection (common/grpc_server.h), Prometheus /metrics, and the
// registration with the controller. AgentService::Start runs the whole agent in-process (tests
// start several in one process, e.g. the ranks of a tensor-parallel group).
//
// Authentication: with a non-empty auth token every Agent call must carry the metadata
// "authorization: Bearer <token>"; others get UNAUTHENTICATED (health and reflection stay open for
// probes).
//
// The Step stream answers every StepRequest with exactly one StepResponse, in order; errors are in
// StepResponse.error_message and the stream stays open. Several streams may be open (a controller
// reconnecting); their steps are serialised.
#ifndef VAMP_AGENT_AGENT_SERVICE_H_
#define VAMP_AGENT_AGENT_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/agent_engine.h"
#include "agent/agent_metrics.h"
#include "agent/agent_options.h"
#include "agent/registrar.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {

// The gRPC handlers. Not owned by anyone but AgentService; public for tests that mount it.
class AgentGrpcService final : public vamp::v1::Agent::Service {
 public:
  // `engine` must outlive the service. Empty `auth_token`: no authentication.
  AgentGrpcService(AgentEngine* engine, std::string auth_token);

  grpc::Status Init(grpc::ServerContext* context, const vamp::v1::InitRequest* request,
                    vamp::v1::InitResponse* response) override;
  grpc::Status CreateCollectiveId(grpc::ServerContext* context,
                                  const vamp::v1::CreateCollectiveIdRequest* request,
                                  vamp::v1::CreateCollectiveIdResponse* response) override;
  grpc::Status Step(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<vamp::v1::StepResponse, vamp::v1::StepRequest>* stream) override;
  grpc::Status GetStats(grpc::ServerContext* context, const vamp::v1::GetStatsRequest* request,
                        vamp::v1::GetStatsResponse* response) override;

 private:
  grpc::Status Authenticate(const grpc::ServerContext* context) const;

  AgentEngine* const engine_;
  const std::string auth_token_;
};

class AgentService {
 public:
  // Validates the device, starts the gRPC server, /metrics and (with a controller address) the
  // registrar. Errors name the option (listen, metrics_address, device).
  static absl::StatusOr<std::unique_ptr<AgentService>> Start(AgentOptions options);
  ~AgentService();

  int grpc_port() const { return grpc_port_; }
  // 0 when /metrics is not served.
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  // host:port the controller dials (sent when registering).
  const std::string& address() const { return address_; }
  AgentEngine& engine() { return *engine_; }
  // Null when not registering (no controller address).
  Registrar* registrar() { return registrar_.get(); }
  const AgentOptions& options() const { return options_; }

  // Stops registering, fails a collective in progress, ends open streams and stops serving.
  // Idempotent.
  void Shutdown();

 private:
  explicit AgentService(AgentOptions options) : options_(std::move(options)) {}
  vamp::v1::RegisterRequest MakeRegisterRequest();

  AgentOptions options_;
  uint64_t device_total_bytes_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<AgentMetrics> agent_metrics_;
  std::unique_ptr<AgentEngine> engine_;
  std::unique_ptr<AgentGrpcService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsExposer> metrics_;
  std::unique_ptr<Registrar> registrar_;
  int grpc_port_ = 0;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace vamp

#endif  // VAMP_AGENT_AGENT_SERVICE_H_
