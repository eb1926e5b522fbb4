// vamp-controller as an object: one model replica's frontends (HTTP, gRPC Serving), its Admin
// service, agent registration, Prometheus metrics, optionally the local agents it spawns, and a
// supervisor that (re)builds the serving engine whenever a full, healthy set of agents is there.
// main.cc wraps it in a process; tests start it in-process.
#ifndef VAMP_CONTROLLER_SERVER_CONTROLLER_SERVER_H_
#define VAMP_CONTROLLER_SERVER_CONTROLLER_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "controller/server/admin_service.h"
#include "controller/server/agent_launcher.h"
#include "controller/server/agent_registry.h"
#include "controller/server/controller_config.h"
#include "controller/server/http_frontend.h"
#include "controller/server/serving_service.h"
#include "controller/serving/serving_context.h"
#include "tokenizer/tokenizer.h"

namespace vamp {

class ControllerServer {
 public:
  // Starts serving per `options`. `self_path` locates the vamp-agent binary for spawn_agents when
  // agent_binary is not given. Errors name the field or the address that could not be bound.
  // `on_fatal` runs (on the supervisor thread) when the controller cannot ever serve: a spawned
  // agent failed Init with a permanent error (a missing or invalid checkpoint); fatal_error()
  // says why. vamp-controller stops and exits non-zero.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const ControllerOptions& options, const std::string& self_path = "",
      std::function<void()> on_fatal = nullptr);
  // The same from parsed flags (schema: ControllerConfigSchema()), for tests that start a
  // controller from a command line.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const Config& config, const std::string& self_path = "",
      std::function<void()> on_fatal = nullptr);
  ~ControllerServer();

  int grpc_port() const { return grpc_->port(); }
  int admin_port() const { return admin_grpc_->port(); }
  int http_port() const { return http_->port(); }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // Whether a serving engine is up with all agents healthy.
  bool serving() const;
  // Non-empty once the controller gave up serving for good (see Start's on_fatal).
  std::string fatal_error() const;
  // Why the model is not being served (the last error bringing the agents up); empty while
  // serving.
  std::string last_error() const;
  // Waits up to `timeout` for serving() to be true.
  bool WaitUntilServing(absl::Duration timeout) const;
  // The spawned agents (tests kill them to exercise fault handling); null without spawn_agents.
  AgentLauncher* launcher() { return launcher_.get(); }
  void Shutdown();

 private:
  explicit ControllerServer(const ControllerOptions& options);
  void Supervise();
  // `permanent` is set when the agents refused Init in a way no retry cures (InvalidArgument or
  // NotFound: a missing or invalid checkpoint, an unsupported dtype).
  absl::Status BringUp(const std::vector<AgentEndpoint>& endpoints, bool* permanent);
  void TearDown();
  std::shared_ptr<const ServingContext> Context() const;
  // GET /metrics/targets: this controller and every registered agent that serves /metrics.
  std::string MetricsTargetsJson(int http_port) const;
  // Rewrites options_.metrics_targets_file from the registry now (a no-op without one, or before
  // the HTTP frontend is up).
  absl::Status WriteMetricsTargetsFile();
  // Marks every registered agent that does not accept a connection within a second as gone
  // (AgentRegistry::MarkGone): called when its group broke or could not be brought up.
  void MarkUnreachableAgentsGone();
  // served_model_name, or the model_path folder's name when that is empty.
  std::string ServedModelName() const;
  void FillStatus(vamp::v1::GetStatusResponse* status) const;

  const ControllerOptions options_;
  const int64_t start_micros_;
  // What agents present (registration) and what the controller presents to them: the
  // auth_token_file's token, or one generated for spawned agents; empty only with
  // insecure_no_auth.
  std::string agent_token_;
  // What Admin calls need: the auth_token_file's token; empty = none (Admin is on loopback).
  std::string admin_token_;
  // The model folder's tokenizer (tokenizer.json), loaded at start; null: the byte fallback,
  // sized by the vocabulary the agents report.
  std::shared_ptr<const Tokenizer> tokenizer_;

  std::unique_ptr<AgentRegistry> registry_;
  std::unique_ptr<ServingService> serving_service_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<MetricsExposer> metrics_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<GrpcServer> admin_grpc_;
  std::unique_ptr<HttpFrontend> http_;
  std::unique_ptr<AgentLauncher> launcher_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Shared so that status queries can use it without holding mu_ across an RPC.
  std::shared_ptr<AgentGroup> group_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ServingContext> context_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string fatal_error_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_fatal_;
  std::vector<vamp::v1::RankMemory> rank_memory_ ABSL_GUARDED_BY(mu_);
  // Set once http_ is up: from then on registry changes rewrite the targets file.
  std::atomic<bool> targets_file_ready_{false};
  // Serialises writers of the targets file, so the last write holds the newest registry state.
  absl::Mutex targets_file_mu_;
  std::thread supervisor_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_CONTROLLER_SERVER_H_
