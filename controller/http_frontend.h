// The OpenAI-compatible HTTP API of vamp-controller (cpp-httplib): POST /v1/completions and
// /v1/chat/completions (JSON, or SSE with "stream": true), GET /v1/models, /health (200 serving,
// 503 not), /metrics (Prometheus text of the process registry) and /metrics/targets (the
// replica's scrape targets for Prometheus HTTP service discovery). Errors are OpenAI-style JSON
// with the matching HTTP status; a client that disconnects mid-stream aborts its request.
#ifndef VAMP_CONTROLLER_HTTP_FRONTEND_H_
#define VAMP_CONTROLLER_HTTP_FRONTEND_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/serving_context.h"

namespace httplib {
class Server;
}

namespace vamp {

struct HttpFrontendOptions {
  std::string address = "127.0.0.1:8000";  // host:port; port 0 picks one
  // Accepted "Authorization: Bearer <key>" values; empty = no key needed.
  std::vector<std::string> api_keys;
  // A non-streaming request gives up after this long (s).
  double request_timeout_s = 600;
  // PEM files; when both are set the API is served over HTTPS only.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Body of GET /metrics/targets (Prometheus HTTP service discovery JSON), built per request from
  // the port this frontend bound; null: no such route. Open like /metrics: addresses, no secrets.
  std::function<std::string(int http_port)> metrics_targets;
  // Why the model is not being served (empty: no error), for /health and 503 bodies; null: none.
  std::function<std::string()> last_error;
};

class HttpFrontend {
 public:
  // `context` is called per request.
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(HttpFrontendOptions options,
                                                            ServingContextProvider context);
  ~HttpFrontend();
  int port() const { return port_; }
  void Stop();

 private:
  HttpFrontend() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_HTTP_FRONTEND_H_
