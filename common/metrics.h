// Prometheus metrics. One process-wide registry; every subsystem adds its families to it and the
// exposer serves them at http://<bind>/metrics.
//
// Naming: vamp_<subsystem>_<name>_<unit>, base units only (seconds, bytes, ratio 0..1); counters
// end in _total. Example: vamp_kv_pool_blocks, vamp_arbiter_decisions_total{action="offload"}.
#ifndef VAMP_COMMON_METRICS_H_
#define VAMP_COMMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include <thread>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace vamp {

// The process-wide registry (created on first use, never destroyed).
const std::shared_ptr<prometheus::Registry>& MetricsRegistry();

// Serves a registry over HTTP at /metrics.
class MetricsExposer {
 public:
  // `bind_address` is "host:port"; port 0 picks a free port (see port()).
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(
      const std::string& bind_address,
      std::shared_ptr<prometheus::Registry> registry = MetricsRegistry());

  ~MetricsExposer();

  // The port actually bound.
  int port() const { return port_; }

 private:
  MetricsExposer(std::unique_ptr<httplib::Server> server, int port);
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_;
};

// Bucket boundaries in seconds spanning 100 µs .. ~100 s, for latency histograms.
prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds();

}  // namespace vamp

#endif  // VAMP_COMMON_METRICS_H_
