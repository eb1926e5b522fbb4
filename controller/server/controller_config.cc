#include "controller/server/controller_config.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/scheduler_config.h"

namespace vamp {

const ConfigSchema& ControllerConfigSchema() {
  static const ConfigSchema* schema = [] {
    const ControllerOptions d;
    auto* s = new ConfigSchema();
    s->String("grpc_address", d.grpc_address,
              "host:port for gRPC Serving, agent registration, health and reflection; port 0 "
              "picks one")
        .String("admin_address", d.admin_address,
                "host:port for the gRPC Admin service (vampctl); keep it on loopback unless "
                "admin_token_file is set")
        .String("http_address", d.http.server.address,
                "host:port for the OpenAI-compatible HTTP API, /health and /metrics")
        .Int("http_threads", d.http.server.threads, 1, 256,
             "event-loop threads of the HTTP server; each holds thousands of connections, so a "
             "few are enough (requests wait in the scheduler, not for a thread)")
        .Int("http_max_connections", d.http.server.max_connections, 1, 1LL << 24,
             "open HTTP connections beyond which new ones get 503 (the process raises its "
             "descriptor limit to its hard limit at start)")
        .Int("http_max_body_bytes", d.http.server.max_body_bytes, 1, 1LL << 32,
             "largest request body accepted, in bytes; larger Content-Length gets 413 before the "
             "body is read (4 MiB holds a ~1M-character prompt as text, or ~400k token ids)")
        .Int("http_max_header_bytes", d.http.server.max_header_bytes, 1024, 64LL << 20,
             "largest request line plus header fields, in bytes; larger gets 431")
        .Double("http_header_timeout_s", d.http.server.header_timeout_s, 0.01, 3600,
                "a request head not complete this long after its first byte gets 408 (slow "
                "clients cannot hold connections by trickling headers)")
        .Double("http_body_timeout_s", d.http.server.body_timeout_s, 0.01, 3600,
                "a request body not complete this long after its head gets 408")
        .Double("http_idle_timeout_s", d.http.server.idle_timeout_s, 0.01, 86400,
                "a keep-alive connection without a request for this long is closed")
        .Double("http_write_timeout_s", d.http.server.write_timeout_s, 0.01, 3600,
                "a connection whose client reads nothing of a pending response for this long "
                "is closed (and its request aborted)")
        .Double("request_timeout_s", d.http.request_timeout_s, 0.01, 86400,
                "a non-streaming request not finished after this long is aborted with 504")
        .Int("max_n", d.http.limits.max_n, 1, 128,
             "most choices (\"n\") one completion or chat request may ask for; more gets 400")
        .Int("max_batch_prompts", d.http.limits.max_batch_prompts, 1, 4096,
             "most prompts in one /v1/completions batch (a \"prompt\" array), and most choices "
             "(prompts x n) one request may start; more gets 400. At least max_n")
        .String("metrics_address", d.metrics_address,
                "host:port for a dedicated Prometheus /metrics listener; empty = only on HTTP")
        .String("served_model_name", d.served_model_name,
                "model id clients put in \"model\" and see in /v1/models and responses; empty: "
                "the name of the model_path folder")
        .String("model_path", d.model_path,
                "checkpoint folder (config.json + *.safetensors) the agents load; with "
                "load_format=dummy only config.json is read")
        .Enum("load_format", d.load_format, {"safetensors", "dummy"},
              "safetensors: real weights; dummy: seeded random weights of the real shapes")
        .Enum("dtype", d.dtype, {"auto", "bfloat16", "float32"},
              "element type of weights, activations and KV cache on the agents: auto = "
              "bfloat16 on CUDA agents, float32 on CPU agents (the CPU engine computes in "
              "float32 whatever is asked); float32 on CUDA agents matches the CPU engine to "
              "float32 rounding")
        .Int("world_size", d.world_size, 1, 64, "agents (tensor-parallel ranks) the model needs")
        .Int("spawn_agents", d.spawn_agents, 0, 64,
             "start this many local vamp-agent processes (sets world_size); 0 = agents are "
             "started elsewhere and register themselves")
        .String("agent_binary", d.agent_binary,
                "vamp-agent to spawn; default: next to vamp-controller")
        .String("agent_device", d.agent_device,
                "--device for spawned agents: cpu, or cuda (rank r runs on cuda:r; with several "
                "ranks they all-reduce through NCCL), or cuda:N (that GPU: one rank, since NCCL "
                "needs a GPU per rank)")
        .Int("agent_host_memory_bytes", d.agent_host_memory_bytes, 1LL << 20, 1LL << 40,
             "memory budget of each spawned CPU agent, in bytes (its 'device memory')")
        .Int("agent_host_page_bytes", d.agent_host_page_bytes, 4096, 2LL << 20,
             "page size of spawned CPU agents' memory pools, in bytes")
        .Double("gpu_memory_utilization", d.gpu_memory_utilization, 0.05, 1.0,
                "fraction of each agent's device memory VAMP may use")
        .Enum("arbiter", d.arbiter, {"static", "vamp"},
              "memory arbiter: static (vLLM 0.15 baseline) or vamp (cost model)")
        .Double("max_offload_ratio", d.offload_cap.ratio(), OffloadCap::kMinRatio,
                OffloadCap::kMaxRatio,
                "VAMP-r: cap on the fraction of each eligible layer's experts that may be "
                "offloaded; 0 = no offloading")
        .Double("step_timeout_s", d.step_timeout_s, 0.1, 3600,
                "an agent that does not answer a step within this many seconds is failed")
        .Double("registration_timeout_s", d.registration_timeout_s, 1, 86400,
                "how long start-up waits for every agent to register before reporting it")
        .String("auth_token_file", d.auth_token_file,
                "file holding the shared secret, on one line (8 to 4096 printable ASCII "
                "characters, no spaces), that agents present when registering and that Admin "
                "calls need; give every vamp-agent the same file. Empty: with spawn_agents the "
                "controller generates a token and hands it to its agents through their "
                "environment; without, start-up fails unless insecure_no_auth")
        .Bool("insecure_no_auth", d.insecure_no_auth,
              "accept agents without a token when agents are started elsewhere and no "
              "auth_token_file is given: any process that reaches grpc_address can then register "
              "as an agent and receive every prompt. Only for isolated test setups; logged as a "
              "warning")
        .String("tls_cert_file", d.http.server.tls_cert_file,
                "PEM certificate (chain) for HTTPS and gRPC TLS on the client-facing and admin "
                "endpoints; with tls_key_file; empty = plaintext")
        .String("tls_key_file", d.http.server.tls_key_file, "PEM private key for tls_cert_file")
        .String("api_key_file", d.api_key_file,
                "file of API keys (one per line, printable ASCII without spaces, 8 to 4096 "
                "characters; '#' starts a comment) that the HTTP API and gRPC Serving require "
                "as 'Authorization: Bearer <key>' (gRPC: 'authorization' metadata); empty = "
                "open")
        .String("replica", d.replica,
                "name of this model replica: the 'replica' label of the scrape targets served at "
                "/metrics/targets (Prometheus HTTP service discovery); empty: the host name")
        .String("metrics_targets_file", d.metrics_targets_file,
                "when set, write the scrape targets of /metrics/targets (this controller and every "
                "registered agent, Prometheus file_sd JSON) to this file at start and whenever an "
                "agent registers, re-registers or goes away, atomically (temp file + rename), for "
                "Prometheus file_sd_configs")
        .String("ready_file", d.ready_file,
                "when set, write the bound ports as JSON to this file once listening (for "
                "scripts and tests that start the controller on port 0)");
    AddLogConfigFields(*s);
    AddSchedulerConfigFields(*s);
    AddVampArbiterConfigFields(*s);
    return s;
  }();
  return *schema;
}

absl::StatusOr<ControllerOptions> ControllerOptionsFromConfig(const Config& config) {
  ControllerOptions o;
  VAMP_ASSIGN_OR_RETURN(o.scheduler, SchedulerConfigFromConfig(config));
  VAMP_ASSIGN_OR_RETURN(o.vamp, VampArbiterConfigFromConfig(config));
  o.grpc_address = config.GetString("grpc_address");
  o.admin_address = config.GetString("admin_address");
  o.metrics_address = config.GetString("metrics_address");
  HttpServerOptions& http = o.http.server;
  http.address = config.GetString("http_address");
  http.threads = static_cast<int>(config.GetInt("http_threads"));
  http.max_connections = config.GetInt("http_max_connections");
  http.max_body_bytes = config.GetInt("http_max_body_bytes");
  http.max_header_bytes = config.GetInt("http_max_header_bytes");
  http.header_timeout_s = config.GetDouble("http_header_timeout_s");
  http.body_timeout_s = config.GetDouble("http_body_timeout_s");
  http.idle_timeout_s = config.GetDouble("http_idle_timeout_s");
  http.write_timeout_s = config.GetDouble("http_write_timeout_s");
  http.tls_cert_file = config.GetString("tls_cert_file");
  http.tls_key_file = config.GetString("tls_key_file");
  o.http.request_timeout_s = config.GetDouble("request_timeout_s");
  o.http.limits.max_n = static_cast<int32_t>(config.GetInt("max_n"));
  o.http.limits.max_batch_prompts = static_cast<int32_t>(config.GetInt("max_batch_prompts"));
  if (o.http.limits.max_batch_prompts < o.http.limits.max_n) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'max_batch_prompts' (", o.http.limits.max_batch_prompts,
                     ") must be at least max_n (", o.http.limits.max_n,
                     "): it bounds the choices (prompts x n) of every request"));
  }
  o.api_key_file = config.GetString("api_key_file");
  o.served_model_name = config.GetString("served_model_name");
  o.model_path = config.GetString("model_path");
  o.load_format = config.GetString("load_format");
  o.dtype = config.GetString("dtype");
  o.world_size = static_cast<int>(config.GetInt("world_size"));
  o.spawn_agents = static_cast<int>(config.GetInt("spawn_agents"));
  o.agent_binary = config.GetString("agent_binary");
  o.agent_device = config.GetString("agent_device");
  o.agent_host_memory_bytes = config.GetInt("agent_host_memory_bytes");
  o.agent_host_page_bytes = config.GetInt("agent_host_page_bytes");
  o.gpu_memory_utilization = config.GetDouble("gpu_memory_utilization");
  o.arbiter = config.GetString("arbiter");
  VAMP_ASSIGN_OR_RETURN(o.offload_cap, OffloadCap::FromRatio(config.GetDouble("max_offload_ratio"),
                                                             "max_offload_ratio"));
  o.step_timeout_s = config.GetDouble("step_timeout_s");
  o.registration_timeout_s = config.GetDouble("registration_timeout_s");
  o.auth_token_file = config.GetString("auth_token_file");
  o.insecure_no_auth = config.GetBool("insecure_no_auth");
  o.replica = config.GetString("replica");
  o.metrics_targets_file = config.GetString("metrics_targets_file");
  o.ready_file = config.GetString("ready_file");
  o.log = LogOptionsFromConfig(config);
  return o;
}

}  // namespace vamp
