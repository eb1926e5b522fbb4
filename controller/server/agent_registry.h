// AgentRegistry (agent.proto), served by vamp-controller: agents announce themselves at start and
// again after a controller restart. Ranks are assigned here; a rank that registers again (an
// agent restarted) replaces its old entry and bumps the generation, which tells the controller to
// re-initialise the group. The controller marks a rank gone when it no longer answers (MarkGone);
// its next registration brings it back. Every change (a registration, a rank marked gone) is
// reported to the on_change callback, which keeps the scrape-target file current.
#ifndef VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_
#define VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/serving/agent_group.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {

class AgentRegistry final : public vamp::v1::AgentRegistry::CallbackService {
 public:
  // `auth_token` empty: registration needs no token (--insecure_no_auth only).
  AgentRegistry(int world_size, std::string auth_token);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const vamp::v1::RegisterRequest* request,
                                     vamp::v1::RegisterResponse* response) override;

  // Waits up to `timeout` until every rank has registered since the generation `after`; fills
  // `endpoints` (rank order) and returns the current generation, or nullopt on timeout.
  std::optional<int64_t> WaitForAll(int64_t after, absl::Duration timeout,
                                    std::vector<AgentEndpoint>* endpoints);
  int64_t generation() const;
  int world_size() const { return world_size_; }
  // This controller process's id ("vamp-controller-" + 16 random hex digits) and the health
  // service name (SERVING while it runs) that agents watch.
  const std::string& controller_id() const { return controller_id_; }
  std::string health_service() const { return "vamp.controller." + controller_id_; }
  int registered() const;

  // A registered rank's Prometheus /metrics ("host:port"), for service discovery.
  struct MetricsTarget {
    int rank = 0;
    std::string address;
  };
  // The registered ranks that serve /metrics and are not gone, in rank order.
  std::vector<MetricsTarget> MetricsTargets() const;

  // One registered rank: its Agent service, its /metrics (empty: none) and whether it is gone.
  struct Registration {
    int rank = 0;
    std::string agent_address;
    std::string metrics_address;
    bool gone = false;
  };
  // Every registered rank, in rank order.
  std::vector<Registration> Registrations() const;
  // Marks `rank` gone (it did not answer) unless it has registered again at another address
  // since `agent_address` was read. Does not change the generation: only a registration brings
  // the rank back. No-op for a rank already gone.
  void MarkGone(int rank, const std::string& agent_address);
  // Called after every registration and every rank newly marked gone, outside the registry's
  // lock, on the thread that made the change. Set before agents can register.
  void set_on_change(std::function<void()> on_change) { on_change_ = std::move(on_change); }

 private:
  const int world_size_;
  const std::string auth_token_;
  const std::string controller_id_;
  mutable absl::Mutex mu_;
  std::vector<std::optional<AgentEndpoint>> ranks_ ABSL_GUARDED_BY(mu_);
  // By rank: RegisterRequest.metrics_address of the last registration (empty: none).
  std::vector<std::string> metrics_addresses_ ABSL_GUARDED_BY(mu_);
  // By rank: marked gone since its last registration.
  std::vector<bool> gone_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_change_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_
