// vamp-controller: the engine core of one model replica (shared/DESIGN.md, "Processes").
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/logging.h"
#include "common/sd_notify.h"
#include "controller/server/controller_config.h"
#include "controller/server/controller_server.h"

namespace {

constexpr char kSummary[] =
    "vamp-controller schedules requests for one MoE model replica, owns the KV block pool and\n"
    "the memory arbiter, and drives one vamp-agent per GPU (or CPU agent). It serves the\n"
    "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health,\n"
    "/metrics), gRPC Serving and Admin (vampctl), and agent registration. With\n"
    "--spawn_agents N it starts N local agents itself, handing them a token it generates.\n"
    "Agents started elsewhere need --auth_token_file on both sides (or --insecure_no_auth).\n"
    "Stop it with SIGINT or SIGTERM.\n\n"
    "Example (CPU, tiny model):\n"
    "  vamp-controller --model_path tests/data/tiny-qwen3-moe --spawn_agents 1";

int Run(int argc, char** argv) {
  auto invocation = vamp::ParseInvocation(vamp::ControllerConfigSchema(), "vamp-controller",
                                          kSummary, argc, argv, vamp::ControllerOptionsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const vamp::ControllerOptions& options = *invocation.options;
  if (absl::Status s = vamp::ConfigureLogging(options.log); !s.ok()) {
    std::fprintf(stderr, "vamp-controller: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  // Every HTTP stream holds a descriptor: thousands of clients need more than the usual soft
  // limit of 1024, and the hard limit is the operator's (systemd LimitNOFILE, ulimit -Hn).
  if (rlimit limit; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      VAMP_LOG(WARNING) << "cannot raise the open-file limit to " << limit.rlim_max;
    }
  }

  // Block the stop signals before any thread starts so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<vamp::ControllerServer>> server =
      vamp::ControllerServer::Start(options, "/proc/self/exe", [] {
        // Wakes the sigwait below; the stop signals are blocked in every thread.
        kill(getpid(), SIGTERM);
      });
  if (!server.ok()) {
    VAMP_LOG(ERROR) << "cannot start: " << server.status().message();
    return 1;
  }
  const std::string& ready_file = options.ready_file;
  if (!ready_file.empty()) {
    std::ofstream out(ready_file);
    out << "{\"grpc_port\": " << (*server)->grpc_port()
        << ", \"admin_port\": " << (*server)->admin_port()
        << ", \"http_port\": " << (*server)->http_port()
        << ", \"metrics_port\": " << (*server)->metrics_port() << "}\n";
    if (!out) {
      VAMP_LOG(ERROR) << "cannot write ready_file '" << ready_file << "'";
      return 1;
    }
  }
  // Under systemd (Type=notify) READY=1 goes out once a full set of agents serves the model, so
  // units ordered after this one start against a working API; the watchdog is fed meanwhile.
  vamp::ControllerServer* controller = server->get();
  const int signal_number = vamp::ServeUntilSignal(
      stop_signals, [controller] { return controller->serving(); },
      [controller] {
        return controller->serving() ? std::string("serving")
                                     : std::string("waiting for agents to serve the model");
      });
  const std::string fatal = (*server)->fatal_error();
  if (fatal.empty()) VAMP_LOG(INFO) << "received signal " << signal_number << ", shutting down";
  (*server)->Shutdown();
  if (!fatal.empty()) {
    VAMP_LOG(ERROR) << "exiting: " << fatal;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
