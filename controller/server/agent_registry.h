// AgentRegistry (agent.proto), served by vamp-controller: agents announce themselves at start and
// again after a controller restart. Ranks are assigned here; a rank that registers again (an
// agent restarted) replaces its old entry and bumps the generation, which tells the controller to
// re-initialise the group.
#ifndef VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_
#define VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_

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
  // The registered ranks that serve /metrics, in rank order.
  std::vector<MetricsTarget> MetricsTargets() const;

 private:
  const int world_size_;
  const std::string auth_token_;
  const std::string controller_id_;
  mutable absl::Mutex mu_;
  std::vector<std::optional<AgentEndpoint>> ranks_ ABSL_GUARDED_BY(mu_);
  // By rank: RegisterRequest.metrics_address of the last registration (empty: none).
  std::vector<std::string> metrics_addresses_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_AGENT_REGISTRY_H_
