#include "controller/controller_server.h"

#include <chrono>

#include "common/logging.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace vamp {
namespace {

// Process-level metrics every operator dashboard keys on.
void RegisterBuildMetrics() {
  static bool registered = [] {
    auto& registry = *MetricsRegistry();
    prometheus::BuildGauge()
        .Name("vamp_controller_build_info")
        .Help("Always 1; the labels carry the build's version")
        .Register(registry)
        .Add({{"version", kVersion}})
        .Set(1);
    const double now = std::chrono::duration<double>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    prometheus::BuildGauge()
        .Name("vamp_controller_start_time_seconds")
        .Help("Unix time at which the controller started")
        .Register(registry)
        .Add({})
        .Set(now);
    return true;
  }();
  (void)registered;
}

}  // namespace

ControllerServer::ControllerServer(const Config& config)
    : model_(config.GetString("model")),
      arbiter_(config.GetString("arbiter")),
      start_micros_(SteadyClock::Get().NowMicros()) {}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(const Config& config) {
  std::unique_ptr<ControllerServer> server(new ControllerServer(config));
  RegisterBuildMetrics();
  VAMP_ASSIGN_OR_RETURN(server->metrics_,
                        MetricsExposer::Start(config.GetString("metrics_address")));
  ControllerServer* self = server.get();
  server->admin_ = std::make_unique<AdminService>(
      [self](vamp::v1::GetStatusResponse* status) { self->FillStatus(status); });
  VAMP_ASSIGN_OR_RETURN(server->grpc_,
                        GrpcServer::Start(config.GetString("grpc_address"), {server->admin_.get()}));
  VAMP_LOG(INFO) << "vamp-controller " << kVersion << " serving gRPC on port "
                 << server->grpc_port() << ", /metrics on port " << server->metrics_port();
  return server;
}

ControllerServer::~ControllerServer() { Shutdown(); }

void ControllerServer::Shutdown() {
  if (grpc_ != nullptr) grpc_->Shutdown();
}

void ControllerServer::FillStatus(vamp::v1::GetStatusResponse* status) const {
  status->set_version(kVersion);
  status->set_model(model_);
  status->set_uptime_seconds(
      static_cast<double>(SteadyClock::Get().NowMicros() - start_micros_) * 1e-6);
  // No agents are attached until the distributed system exists, so the replica cannot serve.
  status->set_serving(false);
  status->set_policy(arbiter_);
}

}  // namespace vamp
