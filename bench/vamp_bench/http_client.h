// HTTP/1.1 client pieces of vamp-bench on libevent's evhttp: a pool of keep-alive connections
// to one server for streaming POSTs on an event loop, and a blocking GET for health checks and
// metrics scrapes. Everything a pool does runs on the thread that runs its event_base.
#ifndef VAMP_BENCH_VAMP_BENCH_HTTP_CLIENT_H_
#define VAMP_BENCH_VAMP_BENCH_HTTP_CLIENT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct event_base;
struct evhttp_connection;
struct evhttp_request;

namespace vamp::bench {

struct HttpEndpoint {
  std::string host = "127.0.0.1";
  int port = 8000;
  // Sent as "Authorization: Bearer <api_key>" when not empty.
  std::string api_key;
};

// Makes libevent thread-aware (evthread_use_pthreads) and ignores SIGPIPE in the process (a peer
// that closed its socket is an error on that request); call before any event_base exists.
void InitLibevent();

// What a streaming request reports, on the loop thread. `on_body` gets response body bytes as
// they arrive (chunked transfer decoded) with the HTTP status known; `on_done` comes exactly
// once at the end: status 0 means the request failed in transport (connection refused, reset,
// timed out) and `transport_error` says how.
struct StreamHandlers {
  std::function<void(int status, absl::string_view bytes)> on_body;
  std::function<void(int status, const std::string& transport_error)> on_done;
};

// Keep-alive connections to one endpoint, created on demand (one per request in flight) and
// reused. A request that fails before any response byte on a reused connection (the server
// closed it while idle) is sent once more on a new connection. Not thread-safe: use it only on
// the thread running `base`.
class ConnectionPool {
 public:
  // `timeout_s`: a request fails when the server sends nothing for this long.
  ConnectionPool(event_base* base, HttpEndpoint endpoint, double timeout_s);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // Starts POST `path` with a JSON `body`. The returned handle can Cancel() it until on_done
  // ran; it is owned by the pool and invalid after on_done or Cancel.
  class Request;
  absl::StatusOr<Request*> PostStreaming(const std::string& path, std::string body,
                                         StreamHandlers handlers);
  // Cancels a request in flight: no callback runs for it afterwards.
  void Cancel(Request* request);
  // Requests in flight.
  int in_flight() const { return in_flight_; }

 private:
  friend struct PoolCallbacks;
  // Sends `request` on an idle kept-alive connection (when `allow_reuse` and there is one) or a
  // new one.
  absl::Status Send(Request* request, bool allow_reuse);
  evhttp_connection* Connect();
  void Release(evhttp_connection* connection, bool reusable);

  event_base* const base_;
  const HttpEndpoint endpoint_;
  const double timeout_s_;
  std::vector<evhttp_connection*> idle_;
  std::vector<evhttp_connection*> broken_;  // freed when the pool is
  int in_flight_ = 0;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// Blocking GET on a private event loop. Unavailable (naming the address) when the server cannot
// be reached or does not answer within `timeout_s`.
absl::StatusOr<HttpResponse> HttpGet(const HttpEndpoint& endpoint, const std::string& path,
                                     double timeout_s);

// Splits "host:port" (IPv4, a name, or "[v6]:port"). InvalidArgument naming `what`.
absl::StatusOr<HttpEndpoint> ParseHostPort(absl::string_view address, absl::string_view what);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_HTTP_CLIENT_H_
