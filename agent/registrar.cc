#include "agent/registrar.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_auth.h"
#include "common/logging.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace vamp {

Registrar::Registrar(std::string controller_address, int requested_rank, std::string auth_token,
                     RegistrationOptions options,
                     std::function<vamp::v1::RegisterRequest()> make_request)
    : controller_address_(std::move(controller_address)),
      requested_rank_(requested_rank),
      auth_token_(std::move(auth_token)),
      options_(options),
      make_request_(std::move(make_request)) {
  grpc::ChannelArguments args;
  // Keep the connection verified while idle so a vanished controller is noticed within seconds.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly once the controller is back.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options_.max_backoff_ms));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(options_.initial_backoff_ms));
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options_.controller_ca_pem.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = options_.controller_ca_pem;
    credentials = grpc::SslCredentials(tls);
  }
  channel_ = grpc::CreateCustomChannel(controller_address_, credentials, args);
}

Registrar::~Registrar() { Stop(); }

void Registrar::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Registrar::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

bool Registrar::stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

int64_t Registrar::registrations() {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

vamp::v1::RegisterResponse Registrar::last_response() {
  absl::MutexLock lock(&mu_);
  return last_response_;
}

bool Registrar::WaitForRegistrations(int64_t n, int64_t timeout_ms) {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return registrations_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Milliseconds(timeout_ms));
}

bool Registrar::SleepUnlessStopped(int64_t ms) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(ms));
  return !stop_;
}

void Registrar::PrepareContext(grpc::ClientContext* context, bool deadline) {
  if (deadline) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(options_.rpc_timeout_ms));
  }
  AddBearerMetadata(context, auth_token_);
}

grpc::Status Registrar::RegisterOnce() {
  vamp::v1::RegisterRequest request = make_request_();
  request.set_auth_token(auth_token_);
  int32_t rank = requested_rank_;
  int64_t previous = 0;
  {
    absl::MutexLock lock(&mu_);
    previous = registrations_;
    if (rank < 0 && registrations_ > 0) rank = last_response_.rank();
  }
  request.set_rank(rank);
  auto attempt = [&](const vamp::v1::RegisterRequest& r, vamp::v1::RegisterResponse* response) {
    grpc::ClientContext context;
    PrepareContext(&context, /*deadline=*/true);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
      active_ = &context;
    }
    auto stub = vamp::v1::AgentRegistry::NewStub(channel_);
    grpc::Status s = stub->Register(&context, r, response);
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
    return s;
  };
  vamp::v1::RegisterResponse response;
  grpc::Status s = attempt(request, &response);
  if (!s.ok() && rank >= 0 && requested_rank_ < 0 &&
      (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
       s.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
       s.error_code() == grpc::StatusCode::FAILED_PRECONDITION)) {
    // The controller will not give back the old rank: take any.
    VAMP_LOG(INFO) << "controller refused rank " << rank << " (" << s.error_message()
                   << "); registering for any rank";
    request.set_rank(-1);
    s = attempt(request, &response);
  }
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    ++registrations_;
    last_response_ = response;
  }
  VAMP_LOG(INFO) << (previous == 0 ? "registered" : "registered again") << " with controller "
                 << controller_address_ << " (id '" << response.controller_id() << "'): rank "
                 << response.rank() << " of " << response.world_size() << ", serving at "
                 << request.agent_address();
  return s;
}

void Registrar::WatchController() {
  grpc::health::v1::HealthCheckRequest request;
  {
    // The controller process we registered with (when it names one): a restarted controller
    // does not know its predecessor's name, so the watch ends even if the stream reconnected to
    // the new process without the old connection ever being seen to drop.
    absl::MutexLock lock(&mu_);
    request.set_service(last_response_.health_service());
  }
  const bool instance = !request.service().empty();
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  // Watch: one long-lived stream that ends when the controller's connection does.
  {
    grpc::ClientContext context;
    PrepareContext(&context, /*deadline=*/false);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      active_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> reader =
        stub->Watch(&context, request);
    grpc::health::v1::HealthCheckResponse update;
    bool replaced = false;
    while (reader->Read(&update)) {
      if (instance && update.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
        replaced = true;
        context.TryCancel();
      }
    }
    grpc::Status s = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      active_ = nullptr;
    }
    if (stopping()) return;
    if (replaced) {
      VAMP_LOG(WARNING) << "the controller at " << controller_address_
                        << " is no longer the one this agent registered with; registering again";
      return;
    }
    if (s.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      VAMP_LOG(WARNING) << "lost the controller at " << controller_address_ << " ("
                        << s.error_message() << "); registering again when it is back";
      return;
    }
  }
  // No Watch: poll Check.
  while (SleepUnlessStopped(options_.poll_interval_ms)) {
    grpc::ClientContext context;
    PrepareContext(&context, /*deadline=*/true);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = stub->Check(&context, request, &response);
    if (!s.ok()) {
      VAMP_LOG(WARNING) << "lost the controller at " << controller_address_ << " ("
                        << s.error_message() << "); registering again when it is back";
      return;
    }
  }
}

void Registrar::Run() {
  int64_t backoff_ms = options_.initial_backoff_ms;
  int64_t failures = 0;
  while (!stopping()) {
    grpc::Status s = RegisterOnce();
    if (stopping()) break;
    if (!s.ok()) {
      ++failures;
      // Log the first failure and then every tenth, so a long wait for the controller shows
      // progress without flooding the log.
      const bool refused = s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                           s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
      if (refused || failures == 1 || failures % 10 == 0) {
        const std::string line =
            absl::StrCat("registering with controller ", controller_address_, " (attempt ",
                         failures, "): ", s.error_message(), "; retrying in ", backoff_ms, " ms");
        if (refused) {
          VAMP_LOG(ERROR) << line;
        } else {
          VAMP_LOG(INFO) << line;
        }
      }
      if (!SleepUnlessStopped(backoff_ms)) break;
      backoff_ms = std::min(backoff_ms * 2, options_.max_backoff_ms);
      continue;
    }
    failures = 0;
    backoff_ms = options_.initial_backoff_ms;
    WatchController();
  }
}

}  // namespace vamp
