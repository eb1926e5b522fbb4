#include "agent/agent_options.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secret.h"

namespace vamp {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 50;  // 1 PiB: any real memory size
constexpr int64_t kMaxMillis = int64_t{24} * 3600 * 1000;

}  // namespace

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  if (text == "cuda") {
    spec.kind = DeviceSpec::Kind::kCuda;
    return spec;
  }
  if (absl::StartsWith(text, "cuda:")) {
    int ordinal = -1;
    if (absl::SimpleAtoi(text.substr(5), &ordinal) && ordinal >= 0) {
      spec.kind = DeviceSpec::Kind::kCuda;
      spec.ordinal = ordinal;
      return spec;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config field 'device': '", text, "' is not cpu, cuda or cuda:N"));
}

const ConfigSchema& AgentConfigSchema() {
  static const ConfigSchema* schema = [] {
    const AgentOptions d;
    auto* s = new ConfigSchema();
    s->String("controller", d.controller_address,
              "host:port of the vamp-controller to register with (AgentRegistry). Registration "
              "is retried with backoff until the controller answers, and repeated when the "
              "controller restarts. Empty: do not register, just serve (the controller or a test "
              "dials --listen itself)")
        .String("listen", d.listen_address,
                "host:port of this agent's gRPC service (Agent, health, reflection); port 0 picks "
                "a free one (see --ready_file)")
        .String("advertise_address", d.advertise_address,
                "host:port the controller should dial; empty: the --listen host (the host name "
                "when listening on 0.0.0.0 or [::]) with the bound port")
        .String("device", d.device.ToString(),
                "where the model runs: cpu, cuda:N or cuda (a CUDA build with that device "
                "present: the model runs on that GPU, its memory managed by the CUDA VMM "
                "backend, bfloat16 unless the controller asks for float32; tensor-parallel "
                "ranks all-reduce through NCCL). 'cuda' is cuda:<rank> with --rank >= 0 (one "
                "agent per GPU, as --spawn_agents starts them), else cuda:0")
        .Int("rank", d.rank, -1, 1 << 20,
             "tensor-parallel rank to ask the controller for; -1 lets the controller assign one")
        .String("auth_token_file", "",
                "file holding the shared secret, on one line (8 to 4096 printable ASCII "
                "characters, no spaces; the controller's --auth_token_file). Every call to this "
                "agent must carry the metadata 'authorization: Bearer <token>' (UNAUTHENTICATED "
                "otherwise), and the agent presents it when registering and to its "
                "tensor-parallel peers. The token is never logged. Agents spawned by "
                "vamp-controller get its token through the environment instead. Required unless "
                "--insecure_no_auth")
        .Bool("insecure_no_auth", d.insecure_no_auth,
              "run without a token: anyone who reaches the agent's port can drive it and read "
              "prompts, and any process can register as this controller's agent. Only for "
              "isolated test setups; logged as a warning")
        .String("metrics_address", d.metrics_address,
                "host:port for Prometheus /metrics; port 0 picks a free one; empty disables it")
        .String("ready_file", d.ready_file,
                "when set, write {\"grpc_port\", \"metrics_port\", \"address\"} as JSON to this "
                "file once serving (scripts and tests start the agent on port 0)")
        .Int("host_page_bytes", static_cast<int64_t>(d.host_page_bytes), 4096, int64_t{1} << 30,
             "CPU agents: page size of the host memory backend (the emulated VMM granularity; "
             "a multiple of the OS page). Experts move between the expert regions and the KV "
             "cache in groups whose bytes are a multiple of this")
        .Int("host_memory_bytes", static_cast<int64_t>(d.host_memory_bytes), 1 << 20, kMaxBytes,
             "CPU agents: the memory the agent treats as its device memory; "
             "InitRequest.memory.gpu_memory_utilization is a fraction of it")
        .Bool("host_populate", d.host_populate,
              "CPU agents: commit every page's memory when the pool is created (like cuMemCreate) "
              "rather than on first touch")
        .Int("host_runtime_overhead_bytes", static_cast<int64_t>(d.host_runtime_overhead_bytes), 0,
             kMaxBytes,
             "CPU agents: memory the plan keeps out of the budget for the runtime (the GPU "
             "counterpart is the CUDA context and library workspaces)")
        .Int("tp_connect_timeout_ms", d.tp_connect_timeout_ms, 100, kMaxMillis,
             "tensor parallelism: how long Init waits for all ranks to join (CPU: connect over "
             "parallel.host_transport_address; CUDA: NCCL's communicator init)")
        .Int("tp_io_timeout_ms", d.tp_io_timeout_ms, 100, kMaxMillis,
             "tensor parallelism: how long one all-reduce waits for a peer before failing the "
             "step (CPU: a send or receive; a dead peer fails it at once. CUDA: an NCCL "
             "enqueue that needs the peers, and the group check at Init; a collective that a "
             "silent peer never joins is ended by the controller's step timeout and re-Init)")
        .Bool("cuda_graphs", d.cuda_graphs,
              "CUDA agents: replay decode-only steps from CUDA graphs (captured per batch size "
              "and context bucket) when no expert is being staged")
        .Int("device_gemm_max_rows_per_expert", d.device_gemm_max_rows_per_expert, -1, 1 << 30,
             "CUDA agents, bfloat16: MoE layers with at most this many (token, expert) rows per "
             "expert on average run the device-side grouped expert GEMM (no host "
             "synchronisation); busier layers cuBLAS's grouped GEMM. -1: always the device "
             "kernel; 0: always cuBLAS")
        .Int("routed_staging_max_tokens", d.routed_staging_max_tokens, 0, 1 << 30,
             "CUDA agents: steps of at most this many tokens copy only the offloaded experts "
             "their tokens route to (on the compute stream, after each layer's router) instead "
             "of every offloaded byte behind compute (default chosen on an H200: "
             "bench/results/2026-12-02-routed-staging.md); 0: always every offloaded byte")
        .Int("register_max_backoff_ms", d.registration.max_backoff_ms, 10, kMaxMillis,
             "longest wait between two registration attempts")
        .String("controller_ca_file", "",
                "PEM CA certificate to verify a controller that serves TLS (its "
                "--tls_cert_file); empty: plaintext")
        .Int("register_timeout_ms", d.registration.rpc_timeout_ms, 10, kMaxMillis,
             "deadline of one call to the controller (Register, health)");
    AddLogConfigFields(*s);
    return s;
  }();
  return *schema;
}

absl::StatusOr<AgentOptions> AgentOptionsFromConfig(const Config& config) {
  AgentOptions o;
  o.log = LogOptionsFromConfig(config);
  o.ready_file = config.GetString("ready_file");
  o.controller_address = config.GetString("controller");
  o.listen_address = config.GetString("listen");
  o.advertise_address = config.GetString("advertise_address");
  o.metrics_address = config.GetString("metrics_address");
  absl::StatusOr<DeviceSpec> device = ParseDevice(config.GetString("device"));
  if (!device.ok()) return device.status();
  o.device = *device;
  o.rank = static_cast<int>(config.GetInt("rank"));
  if (config.GetString("device") == "cuda" && o.rank >= 0) o.device.ordinal = o.rank;
  if (char* env = std::getenv(kAgentAuthTokenEnv); env != nullptr) {
    // From a spawning controller. Wiped in place as well as unset: /proc/<pid>/environ shows the
    // original block, and nothing this process starts should inherit the secret.
    o.auth_token = env;
    std::fill(env, env + std::strlen(env), '\0');
    ::unsetenv(kAgentAuthTokenEnv);
    if (absl::Status s = ValidateSecret(o.auth_token); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", kAgentAuthTokenEnv, ": ", s.message()));
    }
  }
  if (const std::string& path = config.GetString("auth_token_file"); !path.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(path, "config field 'auth_token_file'");
    if (!token.ok()) return token.status();
    o.auth_token = *std::move(token);
  }
  o.insecure_no_auth = config.GetBool("insecure_no_auth");
  if (o.auth_token.empty() && !o.insecure_no_auth) {
    return absl::InvalidArgumentError(
        "config field 'auth_token_file': required (the controller's --auth_token_file): without "
        "a token anyone who reaches this agent can drive it and read prompts, and anyone can "
        "register with the controller in its place. Pass --insecure_no_auth to run without one");
  }
  o.host_page_bytes = static_cast<uint64_t>(config.GetInt("host_page_bytes"));
  if (o.host_page_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field 'host_page_bytes': ", o.host_page_bytes, " is not a multiple of 4096"));
  }
  o.host_memory_bytes = static_cast<uint64_t>(config.GetInt("host_memory_bytes"));
  o.host_populate = config.GetBool("host_populate");
  o.host_runtime_overhead_bytes =
      static_cast<uint64_t>(config.GetInt("host_runtime_overhead_bytes"));
  o.tp_connect_timeout_ms = config.GetInt("tp_connect_timeout_ms");
  o.tp_io_timeout_ms = config.GetInt("tp_io_timeout_ms");
  o.cuda_graphs = config.GetBool("cuda_graphs");
  o.device_gemm_max_rows_per_expert = config.GetInt("device_gemm_max_rows_per_expert");
  o.routed_staging_max_tokens = config.GetInt("routed_staging_max_tokens");
  o.registration.max_backoff_ms = config.GetInt("register_max_backoff_ms");
  o.registration.rpc_timeout_ms = config.GetInt("register_timeout_ms");
  if (const std::string& ca = config.GetString("controller_ca_file"); !ca.empty()) {
    std::ifstream in(ca, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field 'controller_ca_file': cannot read '", ca, "'"));
    }
    o.registration.controller_ca_pem.assign(std::istreambuf_iterator<char>(in),
                                            std::istreambuf_iterator<char>());
  }
  if (o.registration.initial_backoff_ms > o.registration.max_backoff_ms) {
    o.registration.initial_backoff_ms = o.registration.max_backoff_ms;
  }
  return o;
}

}  // namespace vamp
