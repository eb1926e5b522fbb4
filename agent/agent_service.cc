#include "agent/agent_service.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_auth.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/version.h"
#include "engine/memory/memory_backend.h"
#include "engine/runner/comm/tcp_communicator.h"

namespace vamp {
namespace {

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

AgentGrpcService::AgentGrpcService(AgentEngine* engine, std::string auth_token)
    : engine_(engine), auth_token_(std::move(auth_token)) {}

grpc::Status AgentGrpcService::Authenticate(const grpc::ServerContext* context) const {
  if (auth_token_.empty() || CallPresentsBearer(*context, auth_token_)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or invalid auth token (metadata 'authorization: Bearer <token>')");
}

grpc::Status AgentGrpcService::Init(grpc::ServerContext* context,
                                    const vamp::v1::InitRequest* request,
                                    vamp::v1::InitResponse* response) {
  if (grpc::Status s = Authenticate(context); !s.ok()) return s;
  absl::StatusOr<vamp::v1::InitResponse> r = engine_->Init(*request);
  if (!r.ok()) {
    VAMP_LOG(ERROR) << "Init failed: " << r.status();
    return ToGrpcStatus(r.status());
  }
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status AgentGrpcService::CreateCollectiveId(
    grpc::ServerContext* context, const vamp::v1::CreateCollectiveIdRequest* request,
    vamp::v1::CreateCollectiveIdResponse* response) {
  if (grpc::Status s = Authenticate(context); !s.ok()) return s;
  absl::StatusOr<std::string> id = engine_->CreateCollectiveId();
  if (!id.ok()) {
    VAMP_LOG(ERROR) << id.status();
    return ToGrpcStatus(id.status());
  }
  response->set_nccl_unique_id(*std::move(id));
  return grpc::Status::OK;
}

grpc::Status AgentGrpcService::Step(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<vamp::v1::StepResponse, vamp::v1::StepRequest>* stream) {
  if (grpc::Status s = Authenticate(context); !s.ok()) return s;
  VAMP_LOG(INFO) << "step stream opened by " << context->peer();
  vamp::v1::StepRequest request;
  int64_t steps = 0;
  while (stream->Read(&request)) {
    const vamp::v1::StepResponse response = engine_->Step(request);
    ++steps;
    if (!stream->Write(response)) break;
  }
  VAMP_LOG(INFO) << "step stream from " << context->peer() << " ended after " << steps
                 << " step(s)";
  return grpc::Status::OK;
}

grpc::Status AgentGrpcService::GetStats(grpc::ServerContext* context,
                                        const vamp::v1::GetStatsRequest* request,
                                        vamp::v1::GetStatsResponse* response) {
  if (grpc::Status s = Authenticate(context); !s.ok()) return s;
  *response = engine_->GetStats();
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<AgentService>> AgentService::Start(AgentOptions options) {
  std::unique_ptr<AgentService> agent(new AgentService(std::move(options)));
  const AgentOptions& o = agent->options_;
  agent->device_total_bytes_ = o.host_memory_bytes;
  if (o.device.kind == DeviceSpec::Kind::kCuda) {
#if VAMP_HAVE_CUDA
    MemoryBackendOptions backend_options;
    backend_options.kind = MemoryBackendOptions::Kind::kCuda;
    backend_options.cuda_device = o.device.ordinal;
    absl::StatusOr<std::unique_ptr<MemoryBackend>> backend = CreateMemoryBackend(backend_options);
    if (!backend.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("config field 'device': ", o.device.ToString(),
                       " is not usable: ", backend.status().message()));
    }
    agent->device_total_bytes_ = (*backend)->device_memory_bytes();
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "config field 'device': ", o.device.ToString(),
        " needs a CUDA build of vamp-agent; this one was built without CUDA (use --device cpu)"));
#endif
  }
  {
    std::string host;
    int port = 0;
    absl::Status s = SplitHostPort(o.listen_address, "config field 'listen'", &host, &port);
    if (!s.ok()) return s;
  }

  agent->registry_ =
      o.metrics_registry != nullptr ? o.metrics_registry : std::make_shared<prometheus::Registry>();
  agent->agent_metrics_ = std::make_unique<AgentMetrics>(*agent->registry_, o.device.ToString());
  AgentEngineOptions engine_options;
  static_cast<EngineTuning&>(engine_options) = o;
  engine_options.device = o.device;
  engine_options.auth_token = o.auth_token;
  agent->engine_ = std::make_unique<AgentEngine>(engine_options, agent->agent_metrics_.get());
  agent->agent_metrics_->SetMemory(agent->engine_->Memory());
  agent->service_ = std::make_unique<AgentGrpcService>(agent->engine_.get(), o.auth_token);

  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(o.listen_address, {agent->service_.get()});
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("config field 'listen': ", server.status().message()));
  }
  agent->server_ = std::move(*server);
  agent->grpc_port_ = agent->server_->port();
  if (!o.advertise_address.empty()) {
    agent->address_ = o.advertise_address;
  } else {
    std::string host;
    int port = 0;
    (void)SplitHostPort(o.listen_address, "listen", &host, &port);
    if (host.empty() || host == "0.0.0.0" || host == "::") host = HostName();
    if (absl::StrContains(host, ':')) host = absl::StrCat("[", host, "]");
    agent->address_ = absl::StrCat(host, ":", agent->grpc_port_);
  }
  if (!o.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
        MetricsExposer::Start(o.metrics_address, agent->registry_);
    if (!exposer.ok()) {
      return absl::Status(exposer.status().code(), absl::StrCat("config field 'metrics_address': ",
                                                                exposer.status().message()));
    }
    agent->metrics_ = std::move(*exposer);
  }
  VAMP_LOG(INFO) << "vamp-agent " << kVersion << " on " << o.device.ToString()
                 << ": Agent service at " << agent->address_ << " (listening on "
                 << o.listen_address << ", port " << agent->grpc_port_ << ")"
                 << (agent->metrics_ != nullptr
                         ? absl::StrCat(", /metrics on port ", agent->metrics_->port())
                         : std::string())
                 << (o.auth_token.empty() ? ", no authentication" : ", token required");
  if (o.auth_token.empty() && o.insecure_no_auth) {
    VAMP_LOG(WARNING) << "--insecure_no_auth: this agent accepts calls from anyone who reaches "
                      << agent->address_ << " and registers without a token";
  }
  if (!o.controller_address.empty()) {
    AgentService* self = agent.get();
    agent->registrar_ =
        std::make_unique<Registrar>(o.controller_address, o.rank, o.auth_token, o.registration,
                                    [self] { return self->MakeRegisterRequest(); });
    agent->registrar_->Start();
  } else {
    VAMP_LOG(INFO) << "no --controller: serving without registering";
  }
  return agent;
}

vamp::v1::RegisterRequest AgentService::MakeRegisterRequest() {
  vamp::v1::RegisterRequest r;
  r.set_device(options_.device.ToString());
  r.set_device_total_bytes(device_total_bytes_);
  const vamp::v1::RankMemory m = engine_->Memory();
  const uint64_t used = m.resident_expert_bytes() + m.other_weight_bytes() + m.kv_pool_bytes() +
                        m.staging_bytes() + m.activation_bytes();
  r.set_device_free_bytes(used < device_total_bytes_ ? device_total_bytes_ - used : 0);
  r.set_agent_address(address_);
  if (metrics_ != nullptr) {
    // Reachable where the Agent service is: the advertised host with the bound metrics port.
    const size_t colon = address_.rfind(':');
    r.set_metrics_address(absl::StrCat(address_.substr(0, colon), ":", metrics_->port()));
  }
  r.set_hostname(HostName());
  r.set_version(kVersion);
  return r;
}

AgentService::~AgentService() { Shutdown(); }

void AgentService::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (registrar_ != nullptr) registrar_->Stop();
  // A step waiting in a collective for a peer that is also going away must not delay shutdown.
  if (engine_ != nullptr) engine_->Abort(absl::CancelledError("the agent is shutting down"));
  if (server_ != nullptr) server_->Shutdown(/*deadline_ms=*/1000);
  metrics_.reset();
}

}  // namespace vamp
