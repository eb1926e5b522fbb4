#include "controller/server/agent_registry.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_auth.h"
#include "common/logging.h"
#include "common/secret.h"

namespace vamp {

AgentRegistry::AgentRegistry(int world_size, std::string auth_token)
    : world_size_(world_size),
      auth_token_(std::move(auth_token)),
      controller_id_([] {
        absl::BitGen gen;
        return absl::StrFormat("vamp-controller-%016x", absl::Uniform<uint64_t>(gen));
      }()),
      ranks_(world_size),
      metrics_addresses_(world_size),
      gone_(world_size, false) {}

grpc::ServerUnaryReactor* AgentRegistry::Register(grpc::CallbackServerContext* context,
                                                  const vamp::v1::RegisterRequest* request,
                                                  vamp::v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [reactor](grpc::StatusCode code, const std::string& message) {
    reactor->Finish(grpc::Status(code, message));
    return reactor;
  };
  if (!auth_token_.empty()) {
    if (!CallPresentsBearer(*context, auth_token_) &&
        !SecretEquals(request->auth_token(), auth_token_)) {
      VAMP_LOG(WARNING) << "rejected an agent registration from " << context->peer()
                        << ": wrong or missing token";
      return finish(grpc::StatusCode::UNAUTHENTICATED, "agent registration needs the shared token");
    }
  }
  if (request->agent_address().empty()) {
    return finish(grpc::StatusCode::INVALID_ARGUMENT, "agent_address: must be host:port");
  }
  int rank = request->rank();
  {
    absl::MutexLock lock(&mu_);
    if (rank >= world_size_ || rank < -1) {
      return finish(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("rank: ", rank, " is outside 0..", world_size_ - 1,
                                 " (or -1 to be assigned one)"));
    }
    if (rank == -1) {
      // Same address as a known rank: an agent re-registering after a controller restart.
      for (int r = 0; r < world_size_ && rank == -1; ++r) {
        if (ranks_[r].has_value() && ranks_[r]->address == request->agent_address()) rank = r;
      }
      for (int r = 0; r < world_size_ && rank == -1; ++r) {
        if (!ranks_[r].has_value()) rank = r;
      }
      if (rank == -1) {
        return finish(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("all ", world_size_, " ranks are taken; pass --rank to "
                                                        "replace one"));
      }
    }
    ranks_[rank] = AgentEndpoint{rank, request->agent_address()};
    metrics_addresses_[rank] = request->metrics_address();
    gone_[rank] = false;
    ++generation_;
  }
  if (on_change_) on_change_();
  VAMP_LOG(INFO) << "agent rank " << rank << " registered: " << request->agent_address() << " ("
                 << request->device() << ", " << request->hostname() << ")";
  response->set_rank(rank);
  response->set_world_size(world_size_);
  response->set_controller_id(controller_id_);
  response->set_health_service(health_service());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::optional<int64_t> AgentRegistry::WaitForAll(int64_t after, absl::Duration timeout,
                                                 std::vector<AgentEndpoint>* endpoints) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, after]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (generation_ <= after) return false;
    for (const auto& r : ranks_) {
      if (!r.has_value()) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
  endpoints->clear();
  for (const auto& r : ranks_) endpoints->push_back(*r);
  return generation_;
}

int64_t AgentRegistry::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

int AgentRegistry::registered() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& r : ranks_) n += r.has_value();
  return n;
}

std::vector<AgentRegistry::MetricsTarget> AgentRegistry::MetricsTargets() const {
  absl::MutexLock lock(&mu_);
  std::vector<MetricsTarget> targets;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_[r].has_value() && !gone_[r] && !metrics_addresses_[r].empty()) {
      targets.push_back({r, metrics_addresses_[r]});
    }
  }
  return targets;
}

std::vector<AgentRegistry::Registration> AgentRegistry::Registrations() const {
  absl::MutexLock lock(&mu_);
  std::vector<Registration> out;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_[r].has_value()) {
      out.push_back({r, ranks_[r]->address, metrics_addresses_[r], gone_[r]});
    }
  }
  return out;
}

void AgentRegistry::MarkGone(int rank, const std::string& agent_address) {
  {
    absl::MutexLock lock(&mu_);
    if (rank < 0 || rank >= world_size_ || !ranks_[rank].has_value() ||
        ranks_[rank]->address != agent_address || gone_[rank]) {
      return;
    }
    gone_[rank] = true;
  }
  VAMP_LOG(WARNING) << "agent rank " << rank << " at " << agent_address
                    << " does not answer: left out of the scrape targets until it registers again";
  if (on_change_) on_change_();
}

}  // namespace vamp
