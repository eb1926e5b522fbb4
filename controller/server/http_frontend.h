// The OpenAI-compatible HTTP API of vamp-controller: POST /v1/completions and
// /v1/chat/completions (JSON, or SSE with "stream": true), GET /v1/models, /health (200 serving,
// 503 not), /metrics (Prometheus text of the process registry) and /metrics/targets (the
// replica's scrape targets for Prometheus HTTP service discovery). Errors are OpenAI-style JSON
// with the matching HTTP status.
//
// Transport: HttpServer (controller/http), an event-driven server on a fixed number of threads,
// so every accepted request reaches the scheduler at once (it waits there, not in a socket) and
// /health answers while thousands of streams run. A client that goes away aborts its request,
// streaming or not; a unary request gives up after request_timeout_s (504).
#ifndef VAMP_CONTROLLER_SERVER_HTTP_FRONTEND_H_
#define VAMP_CONTROLLER_SERVER_HTTP_FRONTEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/http/http_server.h"
#include "controller/serving/serving_context.h"

namespace vamp {

struct HttpFrontendOptions {
  // Address, threads, limits, timeouts and TLS of the listening server.
  HttpServerOptions server;
  // Accepted "Authorization: Bearer <key>" values; empty = no key needed.
  std::vector<std::string> api_keys;
  // A non-streaming request gives up after this long (s).
  double request_timeout_s = 600;
  // Limits on request fields (n, batch prompts).
  RequestLimits limits;
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
  int port() const { return server_->port(); }
  // Open client connections.
  int64_t connections() const { return server_->connections(); }
  // Closes every connection (aborting the requests on them) and stops serving. Idempotent.
  void Stop();

 private:
  HttpFrontend() = default;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_HTTP_FRONTEND_H_
