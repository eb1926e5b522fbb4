#include "common/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace vamp {

const std::shared_ptr<prometheus::Registry>& MetricsRegistry() {
  static const auto* registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry) {
  // prometheus-cpp reports bind failures by throwing; turn that into a Status here so no
  // exception crosses the module boundary.
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(bind_address, /*num_threads=*/1);
    exposer->RegisterCollectable(registry);
    std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::UnavailableError(
          absl::StrCat("metrics exposer on ", bind_address, " is not listening"));
    }
    return std::unique_ptr<MetricsExposer>(new MetricsExposer(std::move(exposer), ports[0]));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on '", bind_address, "': ", e.what()));
  }
}

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1.0,    2.5,   5.0,    10.0,  25.0, 50.0,  100.0};
}

}  // namespace vamp
