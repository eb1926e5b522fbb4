// An event-driven HTTP/1.1 server: a fixed number of event-loop threads (libevent) hold every
// connection, so thousands of long-lived SSE streams cost memory, not threads, and a slow or
// idle client cannot block anyone else.
//
// Model. Loop 0 accepts; each new connection is handed to one loop (round robin) and stays there.
// A connection reads one request at a time (pipelined bytes wait in its buffer), calls the handler
// on its loop thread with an HttpExchange, and reads the next request after the response ends
// (keep-alive) or closes. Handlers must not block: they answer at once or hand work elsewhere and
// come back to the loop with HttpExchange::Post.
//
// Limits and timeouts (HttpServerOptions), each answered the way a client can act on:
//   head larger than max_header_bytes -> 431; Content-Length above max_body_bytes -> 413 before
//   any body byte is read; head not complete header_timeout_s after its first byte -> 408;
//   body not complete body_timeout_s after the head -> 408; a keep-alive connection with no
//   request for idle_timeout_s -> closed; a response that cannot be written for write_timeout_s,
//   or whose unsent bytes exceed max_output_bytes (a client that stopped reading) -> closed. Every
//   close while a response is unfinished runs the exchange's close callback, so the request
//   behind it is aborted (streaming or not).
//
// Threads: Start/Stop from one owner thread. HttpExchange::Post is thread-safe; every other
// exchange method runs on the exchange's loop thread only (inside the handler or a Post).
#ifndef VAMP_CONTROLLER_HTTP_HTTP_SERVER_H_
#define VAMP_CONTROLLER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/http/http_request.h"

struct event;  // libevent

namespace vamp {

struct HttpServerOptions {
  std::string address = "127.0.0.1:8000";  // host:port; port 0 picks a free one
  int threads = 2;                          // event-loop threads (>= 1)
  int64_t max_header_bytes = 64 << 10;      // request line + header fields
  int64_t max_body_bytes = 4 << 20;         // Content-Length limit
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double idle_timeout_s = 300;
  double write_timeout_s = 60;
  int64_t max_output_bytes = 16 << 20;  // unsent response bytes per connection
  int64_t max_connections = 65536;      // beyond: answered 503 and closed at accept
  // PEM files; when both are set every connection is TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Checks every field of `options` (ranges, both-or-neither TLS files), naming the bad one.
absl::Status ValidateHttpServerOptions(const HttpServerOptions& options);

class HttpAcceptor;
class HttpConnection;
class HttpLoop;

// One request and its response on one connection.
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  // Thread-safe: runs `fn` on this exchange's loop thread, unless the exchange has closed
  // (response ended or client gone) or the server stopped by then; then `fn` is dropped.
  void Post(std::function<void()> fn);

  // --- Loop thread only ---
  const HttpRequest& request() const { return request_; }
  // Moves the body out (request().body is empty afterwards): a long stream need not keep a
  // prompt of megabytes alive once it has been parsed.
  std::string TakeBody() { return std::move(request_.body); }
  // Whether the response can still be written (not ended, client still there).
  bool open() const { return connection_ != nullptr && !ended_; }
  // A whole response with Content-Length. Ends the exchange.
  void Respond(int status, absl::string_view content_type, absl::string_view body,
               const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Starts a streamed response (chunked on HTTP/1.1; on HTTP/1.0 the body runs until close).
  void StartStream(int status, absl::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers = {});
  // One piece of a streamed body. False when the exchange is closed or the client stopped reading
  // (the connection is then closed and the close callback runs).
  bool Write(absl::string_view data);
  // Ends a streamed response.
  void End();
  // Runs once when the connection closes before the response ended (client gone, timeout,
  // server stopping). Not run after Respond/End.
  void SetOnClose(std::function<void()> fn) { on_close_ = std::move(fn); }
  // Runs `fn` on the loop after `seconds` unless the exchange ended first; one timer per
  // exchange (a second call replaces the first).
  void SetTimer(double seconds, std::function<void()> fn);

 private:
  friend class HttpConnection;
  HttpExchange(std::shared_ptr<HttpLoop> loop, HttpConnection* connection, HttpRequest request);
  void Closed();  // the connection went away (loop thread)
  void CancelTimer();

  const std::shared_ptr<HttpLoop> loop_;
  HttpConnection* connection_;  // loop thread only; null once closed
  HttpRequest request_;
  bool ended_ = false;
  bool streaming_ = false;
  std::function<void()> on_close_;
  ::event* timer_ = nullptr;
  std::function<void()> timer_fn_;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

class HttpServer {
 public:
  // Binds and starts serving; `handler` is called on loop threads.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                          HttpHandler handler);
  ~HttpServer();
  int port() const { return port_; }
  // Open connections now (all loops).
  int64_t connections() const { return connections_->load(); }
  // Closes every connection (running close callbacks) and joins the loops. Idempotent.
  void Stop();

 private:
  HttpServer() = default;
  int port_ = 0;
  std::vector<std::shared_ptr<HttpLoop>> loops_;
  std::shared_ptr<std::atomic<int64_t>> connections_ =
      std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<HttpAcceptor> acceptor_;  // listener (on loop 0) and TLS context
  bool stopped_ = false;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_HTTP_HTTP_SERVER_H_
