// vamp-controller's configuration: the schema of its flags (every flag, its default and its
// range) and ControllerOptions, the typed values ControllerServer runs on. Every default is
// written once, in the options' structs (ControllerOptions, HttpServerOptions, SchedulerConfig,
// VampArbiterConfig, ...); the schema takes its defaults from them, and ControllerOptionsFromConfig
// is the only code that reads the controller's flags by name.
#ifndef VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_
#define VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/offload_cap.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/scheduler_config.h"
#include "controller/server/http_frontend.h"
#include "controller/serving/agent_group.h"
#include "controller/serving/serving_engine.h"

namespace vamp {

struct ControllerOptions {
  // gRPC Serving, agent registration, health and reflection ("host:port"; port 0 picks one).
  std::string grpc_address = "127.0.0.1:50051";
  // gRPC Admin (vampctl); on loopback unless an auth_token_file protects it.
  std::string admin_address = "127.0.0.1:50052";
  // A dedicated Prometheus /metrics listener; empty = only on the HTTP port.
  std::string metrics_address = "127.0.0.1:9400";
  // The OpenAI HTTP API: its server (address, threads, limits, timeouts, TLS files, which gRPC
  // also serves with), request timeout and request limits. Its API keys come from api_key_file.
  HttpFrontendOptions http;
  std::string api_key_file;
  // The model id clients use; empty: model_path's folder name.
  std::string served_model_name;
  std::string model_path;
  std::string load_format = "safetensors";  // safetensors | dummy
  std::string dtype = "auto";               // auto | bfloat16 | float32
  int world_size = 1;
  int spawn_agents = 0;
  std::string agent_binary;  // empty: next to vamp-controller
  std::string agent_device = "cpu";
  int64_t agent_host_memory_bytes = int64_t{1} << 30;
  int64_t agent_host_page_bytes = 64 << 10;
  double gpu_memory_utilization = 0.9;
  std::string arbiter = ServingEngineOptions{}.arbiter;  // static | vamp
  OffloadCap offload_cap = OffloadCap::Constant(0.25);   // --max_offload_ratio
  double step_timeout_s = AgentGroupOptions{}.step_timeout_ms / 1000.0;
  double registration_timeout_s = 120;
  std::string auth_token_file;
  bool insecure_no_auth = false;
  // The 'replica' label of the scrape targets; empty: the host name.
  std::string replica;
  // Where the scrape targets (GET /metrics/targets' JSON, Prometheus file_sd format) are written,
  // atomically, at start and whenever an agent registers or goes away; empty = nowhere.
  std::string metrics_targets_file;
  // Where vamp-controller writes its bound ports as JSON once listening; empty = nowhere.
  std::string ready_file;
  LogOptions log;
  SchedulerConfig scheduler;
  VampArbiterConfig vamp;
};

// The schema of vamp-controller's flags and config file (see `vamp-controller --help`).
const ConfigSchema& ControllerConfigSchema();

// The options a config of ControllerConfigSchema() holds; InvalidArgument naming the field for
// values the schema's ranges cannot catch (scheduler and cost-model consistency).
absl::StatusOr<ControllerOptions> ControllerOptionsFromConfig(const Config& config);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_
