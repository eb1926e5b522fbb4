// vamp-agent: one process per GPU (tensor-parallel rank), or a CPU agent for development and tests
// (shared/DESIGN.md, "Processes"). See `vamp-agent --help`.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/agent_options.h"
#include "agent/agent_service.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/sd_notify.h"

namespace {

constexpr char kSummary[] =
    "vamp-agent runs one tensor-parallel rank of a VAMP model replica: it owns the rank's\n"
    "memory (expert regions, KV cache, staging buffers), loads its shard of the model when the\n"
    "controller calls Init, and executes every scheduler step the controller streams to it,\n"
    "including the expert <-> KV remaps. It registers with the controller given by --controller\n"
    "(retrying until it answers, and again after a controller restart), serves the Agent gRPC\n"
    "service with grpc.health.v1 and reflection on --listen, and Prometheus /metrics on\n"
    "--metrics_address. Without a GPU it runs on the CPU (--device cpu), where "
    "--host_memory_bytes\n"
    "plays the device memory. It needs a token (--auth_token_file, the controller's; agents\n"
    "spawned by vamp-controller get it from their environment) or --insecure_no_auth.\n"
    "Stop it with SIGINT or SIGTERM.\n"
    "\n"
    "Example (a controller on 127.0.0.1:50051, token in ./token):\n"
    "  vamp-agent --controller 127.0.0.1:50051 --auth_token_file token --device cpu \\\n"
    "             --listen 127.0.0.1:0 --ready_file /tmp/agent0.json";

// Writes the ready file atomically (readers polling for it never see half a file).
bool WriteReadyFile(const std::string& path, const vamp::AgentService& agent) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"grpc_port\": " << agent.grpc_port() << ", \"metrics_port\": " << agent.metrics_port()
        << ", \"address\": \"" << agent.address() << "\"}\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

int Run(int argc, char** argv) {
  auto invocation = vamp::ParseInvocation(vamp::AgentConfigSchema(), "vamp-agent", kSummary, argc,
                                          argv, vamp::AgentOptionsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  vamp::AgentOptions& options = *invocation.options;
  if (absl::Status s = vamp::ConfigureLogging(options.log); !s.ok()) {
    std::fprintf(stderr, "vamp-agent: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  options.metrics_registry = vamp::MetricsRegistry();

  const std::string ready_file = options.ready_file;
  // Block the stop signals before any thread starts so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<vamp::AgentService>> agent =
      vamp::AgentService::Start(std::move(options));
  if (!agent.ok()) {
    VAMP_LOG(ERROR) << "cannot start: " << agent.status().message();
    return 1;
  }
  if (!ready_file.empty()) {
    if (!WriteReadyFile(ready_file, **agent)) {
      VAMP_LOG(ERROR) << "cannot write ready_file '" << ready_file << "'";
      return 1;
    }
  }
  // Under systemd (Type=notify) the agent is ready once its Agent service and /metrics listen:
  // registration with the controller is retried in the background, so readiness must not wait
  // for it (the controller itself becomes ready only once its agents serve).
  const int signal_number = vamp::ServeUntilSignal(
      stop_signals, [] { return true; },
      [&agent] { return absl::StrCat("Agent service at ", (*agent)->address()); });
  VAMP_LOG(INFO) << "received signal " << signal_number << ", shutting down";
  (*agent)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
