// Registrar: keeps this agent registered with its controller (AgentRegistry.Register), so that a
// deployment needs only the controller's address.
//
// A background thread calls Register until the controller answers (exponential backoff, progress
// logged), then watches the controller's grpc.health.v1 service over the same channel (a Watch
// stream; polling Check when Watch is not available). When the controller goes away (the watch
// ends or a check fails) the agent registers again as soon as it is back: a restarted controller
// has forgotten its agents. Registering again asks for the rank the controller assigned last time
// (unless --rank fixed one), so a restarted controller can give every agent its old rank and the
// agents keep their loaded models (their next Init is the same request).
//
// The controller must treat a Register from an agent_address it already knows as the same agent
// (the agent also registers again after a network blip).
#ifndef VAMP_AGENT_REGISTRAR_H_
#define VAMP_AGENT_REGISTRAR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_options.h"
#include "grpcpp/grpcpp.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {

class Registrar {
 public:
  // `make_request` fills the RegisterRequest (device, memory, address...) each time one is sent;
  // the registrar sets rank and auth_token. It runs on the registrar thread.
  Registrar(std::string controller_address, int requested_rank, std::string auth_token,
            RegistrationOptions options, std::function<vamp::v1::RegisterRequest()> make_request);
  ~Registrar();  // Stop()s

  void Start();
  // Stops the thread (cancelling a call in progress); idempotent.
  void Stop();

  // Successful registrations so far (1 after the first; +1 per re-registration).
  int64_t registrations();
  // The last RegisterResponse (empty before the first success).
  vamp::v1::RegisterResponse last_response();
  // Blocks until registrations() >= n or `timeout_ms` passes; whether it got there.
  bool WaitForRegistrations(int64_t n, int64_t timeout_ms);

 private:
  void Run();
  // One Register call; OK with the controller's answer recorded.
  grpc::Status RegisterOnce();
  // Returns when the controller is gone (or on Stop).
  void WatchController();
  // Sleeps up to `ms` unless stopped; false when stopped.
  bool SleepUnlessStopped(int64_t ms);
  void PrepareContext(grpc::ClientContext* context, bool deadline);
  bool stopping();

  const std::string controller_address_;
  const int requested_rank_;
  const std::string auth_token_;
  const RegistrationOptions options_;
  const std::function<vamp::v1::RegisterRequest()> make_request_;

  std::shared_ptr<grpc::Channel> channel_;
  std::thread thread_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The call in progress, cancelled by Stop().
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  vamp::v1::RegisterResponse last_response_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_AGENT_REGISTRAR_H_
