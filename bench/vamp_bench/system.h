// Starts and stops a serving system for vamp-bench ab: one vamp-controller process that spawns
// its agents (`--spawn_agents`), on free loopback ports, with its output in a log file. The
// controller is sent SIGTERM if vamp-bench dies, so no system outlives the benchmark.
#ifndef VAMP_BENCH_VAMP_BENCH_SYSTEM_H_
#define VAMP_BENCH_VAMP_BENCH_SYSTEM_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/vamp_bench/http_client.h"

namespace vamp::bench {

struct SystemOptions {
  std::string controller_binary;  // vamp-controller
  std::string agent_binary;       // vamp-agent (--agent_binary); empty: the controller's default
  std::string model_path;
  int32_t spawn_agents = 1;
  // Flags for every controller (e.g. memory budget, --agent_device cuda, --load_format dummy).
  std::vector<std::string> flags;
  std::string log_path;            // the controller's (and its agents') stdout and stderr
  double startup_timeout_s = 300;  // until /health answers 200
  std::string api_key;             // for the health check, when the controller requires keys
};

class RunningSystem {
 public:
  // Starts a controller with `options.flags` then `config_flags` (later flags win). Fails with
  // the log's last lines when the process exits or never serves within the timeout.
  static absl::StatusOr<std::unique_ptr<RunningSystem>> Start(
      const SystemOptions& options, const std::vector<std::string>& config_flags);
  ~RunningSystem();  // Stop()
  RunningSystem(const RunningSystem&) = delete;
  RunningSystem& operator=(const RunningSystem&) = delete;

  // SIGTERM, then SIGKILL after 30 s; idempotent.
  void Stop();
  HttpEndpoint http() const { return http_; }
  // gRPC Serving (same host and API key as http()).
  HttpEndpoint grpc() const { return grpc_; }
  // gRPC Admin (same host; port 0 when the ready file named none). Admin calls carry the
  // controller's admin credential, not the API key, so api_key is left empty.
  HttpEndpoint admin() const { return admin_; }
  // The exact command line, for reports.
  const std::string& command() const { return command_; }

 private:
  RunningSystem() = default;
  pid_t pid_ = -1;
  HttpEndpoint http_;
  HttpEndpoint grpc_;
  HttpEndpoint admin_ = {"127.0.0.1", 0, ""};  // port 0: none named
  std::string command_;
  std::string ready_file_;
};

// The last `lines` lines of a text file ("" when unreadable).
std::string TailOfFile(const std::string& path, int lines);

// Splits a flag string on whitespace (no quoting): "--a=1 --b 2" → {"--a=1", "--b", "2"}.
std::vector<std::string> SplitFlags(const std::string& flags);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_SYSTEM_H_
