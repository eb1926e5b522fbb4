#include "controller/controller_config.h"

namespace vamp {

const ConfigSchema& ControllerConfigSchema() {
  static const ConfigSchema* schema = [] {
    auto* s = new ConfigSchema();
    s->String("grpc_address", "127.0.0.1:50051",
              "host:port for gRPC (Serving, Admin, health, reflection); port 0 picks one")
        .String("metrics_address", "127.0.0.1:9400",
                "host:port for Prometheus /metrics; port 0 picks one")
        .String("model", "tiny-qwen3-moe", "model id reported to clients")
        .Enum("arbiter", "vamp", {"static", "vamp"},
              "memory arbiter: static (vLLM 0.15 baseline) or vamp (cost model)")
        .Double("max_offload_ratio", 0.25, 0.0, 0.95,
                "VAMP-r: cap on the fraction of experts that may be offloaded")
        .String("log_level", "info", "debug | info | warning | error")
        .String("ready_file", "",
                "when set, write the bound ports as JSON to this file once serving (for "
                "scripts and tests that start the controller on port 0)");
    return s;
  }();
  return *schema;
}

}  // namespace vamp
