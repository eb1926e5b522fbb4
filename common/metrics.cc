#include "common/metrics.h"

#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace vamp {

const std::shared_ptr<prometheus::Registry>& MetricsRegistry() {
  static const auto* registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}

// Serves /metrics with cpp-httplib rather than prometheus-cpp's civetweb exposer: civetweb fails
// to start in processes that load cuBLAS ("null context when constructing CivetServer"), and it
// takes seconds to shut down.
absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry) {
  std::vector<std::string> parts = absl::StrSplit(bind_address, absl::MaxSplits(':', 1));
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve /metrics on '", bind_address, "': not host:port"));
  }
  auto server = std::make_unique<httplib::Server>();
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    prometheus::TextSerializer serializer;
    res.set_content(serializer.Serialize(registry->Collect()), "text/plain; version=0.0.4");
  });
  const int bound = port == 0 ? server->bind_to_any_port(parts[0])
                              : (server->bind_to_port(parts[0], port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on '", bind_address,
                                               "': address in use or not local"));
  }
  std::unique_ptr<MetricsExposer> exposer(new MetricsExposer(std::move(server), bound));
  exposer->thread_ = std::thread([s = exposer->server_.get()] { s->listen_after_bind(); });
  return exposer;
}

MetricsExposer::MetricsExposer(std::unique_ptr<httplib::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

MetricsExposer::~MetricsExposer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1.0,    2.5,   5.0,    10.0,  25.0, 50.0,  100.0};
}

}  // namespace vamp
