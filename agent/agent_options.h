// vamp-agent's configuration: the flag schema (`vamp-agent --help`) and the typed options the
// agent library runs on. Tests build AgentOptions directly; the binary parses flags into them.
#ifndef VAMP_AGENT_AGENT_OPTIONS_H_
#define VAMP_AGENT_AGENT_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/logging.h"
#include "engine/runner/cuda/cuda_forward_options.h"
#include "prometheus/registry.h"

namespace vamp {

// Where the agent's model runs.
struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;  // CUDA device index

  // "cpu" or "cuda:N".
  std::string ToString() const;
};

// Parses "cpu", "cuda" (= cuda:0) or "cuda:N". InvalidArgument naming --device otherwise.
absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text);

// How the agent finds and keeps its controller (registration with retries, and noticing when the
// controller restarts so it registers again).
struct RegistrationOptions {
  // Backoff between failed Register attempts: starts here, doubles, capped (ms).
  int64_t initial_backoff_ms = 200;
  int64_t max_backoff_ms = 5000;
  // Deadline of one Register or health call (ms).
  int64_t rpc_timeout_ms = 5000;
  // When the controller's health service cannot be watched (no Watch support), how often it is
  // polled instead (ms).
  int64_t poll_interval_ms = 1000;
  // PEM root certificate(s) to verify a controller that serves TLS; empty = plaintext.
  std::string controller_ca_pem;
};

// How a rank's engine runs, as flags set it: the host memory backend of CPU agents, the
// tensor-parallel timeouts, the GPU forward pass. AgentOptions (the flags) and AgentEngineOptions
// (the engine they configure) share it, so each default is written once.
struct EngineTuning {
  // --- CPU agents: the host memory backend stands in for device memory. ---
  // Page size of the host backend (the VMM granularity of the emulated device), bytes.
  uint64_t host_page_bytes = uint64_t{2} << 20;
  // The "device memory" of a CPU agent: what MemorySpec.gpu_memory_utilization is a fraction of.
  uint64_t host_memory_bytes = uint64_t{4} << 30;
  // Commit every page's memory when the pool is created (as cuMemCreate does) instead of on first
  // touch.
  bool host_populate = false;
  // Memory outside the plan's allocations on a CPU agent (the GPU's CUDA context has no CPU
  // counterpart), bytes.
  uint64_t host_runtime_overhead_bytes = 0;

  // --- Tensor parallelism (CPU agents: TcpCommunicator; CUDA agents: NCCL): how long Init waits
  // for every rank to join (TcpCommunicator's connect, NCCL's init) and how long one all-reduce
  // waits for a peer (TCP: a send or receive; NCCL: an enqueue that needs the peers, and the
  // group check at Init), ms. ---
  int64_t tp_connect_timeout_ms = 120000;
  int64_t tp_io_timeout_ms = 120000;

  // --- CUDA agents: the GPU forward pass (CudaForwardOptions). ---
  bool cuda_graphs = CudaForwardOptions{}.cuda_graphs;
  int64_t device_gemm_max_rows_per_expert = CudaForwardOptions{}.device_gemm_max_rows_per_expert;
  int64_t routed_staging_max_tokens = CudaForwardOptions{}.routed_staging_max_tokens;
};

struct AgentOptions : EngineTuning {
  // Controller (AgentRegistry) to register with, "host:port"; empty = serve without registering.
  std::string controller_address;
  // Where the Agent gRPC service listens ("host:port"; port 0 picks a free one).
  std::string listen_address = "127.0.0.1:0";
  // The address the controller should dial (sent in RegisterRequest.agent_address); empty = the
  // listen host (the machine's host name when listening on a wildcard) with the bound port.
  std::string advertise_address;
  // Where /metrics is served ("host:port"; port 0 picks one; empty = not served).
  std::string metrics_address = "127.0.0.1:0";
  DeviceSpec device;
  // Requested tensor-parallel rank, or -1 to let the controller assign one.
  int rank = -1;
  // Shared secret: required from every caller as "authorization: Bearer <token>" when non-empty,
  // and presented to the controller and the other ranks. Never logged.
  std::string auth_token;
  // --insecure_no_auth: the operator's explicit choice to run without a token (warned about).
  bool insecure_no_auth = false;

  RegistrationOptions registration;
  // Where vamp-agent writes its bound ports as JSON once serving; empty = nowhere.
  std::string ready_file;
  LogOptions log;

  // The registry the agent's metrics go to; null = a private one (several agents in one process).
  std::shared_ptr<prometheus::Registry> metrics_registry;
};

// The flag schema of vamp-agent.
const ConfigSchema& AgentConfigSchema();

// Options from parsed flags: takes the token from --auth_token_file (one line, validated; see
// common/secret.h), else from $VAMP_AGENT_AUTH_TOKEN (kAgentAuthTokenEnv, then wiped from the
// environment), else requires --insecure_no_auth; parses --device ("cuda" with --rank r >= 0 is
// cuda:r: one agent per GPU), and range-checks the rest. The only reader of vamp-agent's flags.
absl::StatusOr<AgentOptions> AgentOptionsFromConfig(const Config& config);

}  // namespace vamp

#endif  // VAMP_AGENT_AGENT_OPTIONS_H_
