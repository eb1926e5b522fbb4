#include "controller/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "event2/buffer.h"
#include "event2/bufferevent.h"
#include "event2/bufferevent_ssl.h"
#include "event2/event.h"
#include "event2/listener.h"
#include "event2/thread.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

timeval ToTimeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

prometheus::Gauge& OpenConnectionsGauge() {
  static prometheus::Gauge& gauge = prometheus::BuildGauge()
                                        .Name("vamp_http_open_connections")
                                        .Help("HTTP connections open on the OpenAI API port")
                                        .Register(*MetricsRegistry())
                                        .Add({});
  return gauge;
}

prometheus::Family<prometheus::Counter>& RejectedFamily() {
  static auto& family = prometheus::BuildCounter()
                            .Name("vamp_http_rejected_total")
                            .Help("HTTP requests or connections refused by the server before a "
                                  "handler saw them, by HTTP status (408 timeout, 413 body too "
                                  "large, 431 head too large, 503 connection limit, ...)")
                            .Register(*MetricsRegistry());
  return family;
}

// OpenAI-style error body for answers the server gives on its own.
std::string ServerErrorBody(int status, absl::string_view message) {
  nlohmann::json body = {{"error",
                          {{"message", std::string(message)},
                           {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                           {"param", nullptr},
                           {"code", status}}}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ResponseHead(int minor_version, int status, absl::string_view content_type,
                         const std::vector<std::pair<std::string, std::string>>& headers,
                         bool keep_alive) {
  std::string head =
      absl::StrCat("HTTP/1.", minor_version, " ", status, " ", HttpReasonPhrase(status), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&head, "Content-Type: ", content_type, "\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  if (!keep_alive) {
    absl::StrAppend(&head, "Connection: close\r\n");
  } else if (minor_version == 0) {
    absl::StrAppend(&head, "Connection: keep-alive\r\n");
  }
  return head;
}

}  // namespace

// One event loop and the connections it owns.
class HttpLoop : public std::enable_shared_from_this<HttpLoop> {
 public:
  HttpLoop(const HttpServerOptions& options, HttpHandler handler,
           std::shared_ptr<std::atomic<int64_t>> connections, SSL_CTX* tls)
      : options_(options),
        handler_(std::move(handler)),
        open_connections_(std::move(connections)),
        tls_(tls) {}

  ~HttpLoop() {
    if (wakeup_ != nullptr) event_free(wakeup_);
    if (base_ != nullptr) event_base_free(base_);
  }

  absl::Status Init() {
    base_ = event_base_new();
    if (base_ == nullptr) return absl::InternalError("event_base_new failed");
    wakeup_ = event_new(base_, -1, 0, &HttpLoop::WakeupCb, this);
    if (wakeup_ == nullptr) return absl::InternalError("event_new failed");
    return absl::OkStatus();
  }

  void StartThread() {
    thread_ = std::thread([this] { event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY); });
  }

  // Any thread. False (and `fn` dropped) once the loop is stopping.
  bool Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(fn));
    event_active(wakeup_, 0, 0);
    return true;
  }

  // Owner thread: closes every connection on the loop, then ends and joins it.
  void StopAndJoin() {
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        tasks_.push_back([this] {
          CloseAll();
          event_base_loopbreak(base_);
        });
        stopping_ = true;
        event_active(wakeup_, 0, 0);
      }
    }
    if (thread_.joinable()) thread_.join();
    CloseAll();  // connections adopted after the break (none expected), and deferred deletes
    RunDeferredDeletes();
  }

  // Loop thread: whether `connection` is one of this loop's open connections.
  bool IsOpen(HttpConnection* connection) const { return connections_.contains(connection); }
  // Loop thread: takes over an accepted socket.
  void Adopt(evutil_socket_t fd);
  // Loop thread: the connection is closed; it is deleted on the next turn of the loop, after
  // every callback that may still hold it has returned.
  void Retire(HttpConnection* connection);

  event_base* base() const { return base_; }
  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }

 private:
  static void WakeupCb(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<HttpLoop*>(arg);
    self->RunDeferredDeletes();
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&self->mu_);
      tasks.swap(self->tasks_);
    }
    for (auto& task : tasks) task();
  }

  void CloseAll();
  void RunDeferredDeletes();

  const HttpServerOptions options_;
  const HttpHandler handler_;
  const std::shared_ptr<std::atomic<int64_t>> open_connections_;
  SSL_CTX* const tls_;
  event_base* base_ = nullptr;
  event* wakeup_ = nullptr;
  std::thread thread_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Loop thread only (or the owner thread after the loop thread has joined).
  absl::flat_hash_map<HttpConnection*, std::unique_ptr<HttpConnection>> connections_;
  std::vector<std::unique_ptr<HttpConnection>> retired_;
};

// One client connection; lives on one loop thread.
class HttpConnection {
 public:
  HttpConnection(HttpLoop* loop, std::shared_ptr<HttpLoop> loop_ref, bufferevent* bev,
                 std::shared_ptr<std::atomic<int64_t>> open_connections)
      : loop_(loop),
        loop_ref_(std::move(loop_ref)),
        bev_(bev),
        open_connections_(std::move(open_connections)) {
    open_connections_->fetch_add(1);
    OpenConnectionsGauge().Increment();
  }

  ~HttpConnection() {
    if (timer_ != nullptr) event_free(timer_);
    if (bev_ != nullptr) bufferevent_free(bev_);
    open_connections_->fetch_sub(1);
    OpenConnectionsGauge().Decrement();
  }

  void Start() {
    timer_ = event_new(loop_->base(), -1, 0, &HttpConnection::TimerCb, this);
    bufferevent_setcb(bev_, &HttpConnection::ReadCb, &HttpConnection::WriteCb,
                      &HttpConnection::EventCb, this);
    const timeval write_timeout = ToTimeval(loop_->options().write_timeout_s);
    bufferevent_set_timeouts(bev_, nullptr, &write_timeout);
    bufferevent_enable(bev_, EV_READ | EV_WRITE);
    ArmTimer(loop_->options().idle_timeout_s);
  }

  // Appends response bytes. False when the client has stopped reading (unsent bytes beyond the
  // limit): the connection is then closed.
  bool Send(absl::string_view bytes) {
    if (closed_) return false;
    evbuffer* out = bufferevent_get_output(bev_);
    if (static_cast<int64_t>(evbuffer_get_length(out) + bytes.size()) >
        loop_->options().max_output_bytes) {
      VAMP_LOG(WARNING) << "HTTP: closing a connection whose client stopped reading ("
                        << evbuffer_get_length(out) << " bytes unsent)";
      Close();
      return false;
    }
    bufferevent_write(bev_, bytes.data(), bytes.size());
    return true;
  }

  // The current exchange has written its whole response.
  void ExchangeEnded(bool keep_alive) {
    exchange_.reset();
    if (closed_) return;
    if (!keep_alive) {
      state_ = State::kDraining;
      MaybeFinishDraining();
      return;
    }
    state_ = State::kIdle;
    ArmTimer(loop_->options().idle_timeout_s);
    // Pipelined bytes already buffered: read them on the next turn (not inside the handler).
    if (!in_read_ && evbuffer_get_length(bufferevent_get_input(bev_)) > 0) {
      loop_->Post([self = this, loop = loop_] {
        if (loop->IsOpen(self)) self->OnRead();
      });
    }
  }

  // Closes now: unsent bytes are dropped and an unfinished exchange learns the client is gone.
  void Close() {
    if (closed_) return;
    closed_ = true;
    DisarmTimer();
    bufferevent_disable(bev_, EV_READ | EV_WRITE);
    if (exchange_ != nullptr) {
      std::shared_ptr<HttpExchange> exchange = std::move(exchange_);
      exchange->Closed();
    }
    loop_->Retire(this);
  }

  bool closed() const { return closed_; }

 private:
  enum class State { kIdle, kHead, kBody, kHandling, kDraining };

  static void ReadCb(bufferevent*, void* arg) { static_cast<HttpConnection*>(arg)->OnRead(); }
  static void WriteCb(bufferevent*, void* arg) {
    static_cast<HttpConnection*>(arg)->MaybeFinishDraining();
  }
  static void EventCb(bufferevent*, short what, void* arg) {
    auto* self = static_cast<HttpConnection*>(arg);
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) self->Close();
  }
  static void TimerCb(evutil_socket_t, short, void* arg) {
    static_cast<HttpConnection*>(arg)->OnTimer();
  }

  void ArmTimer(double seconds) {
    const timeval tv = ToTimeval(seconds);
    evtimer_add(timer_, &tv);
  }
  void DisarmTimer() {
    if (timer_ != nullptr) evtimer_del(timer_);
  }

  void OnTimer() {
    if (closed_) return;
    switch (state_) {
      case State::kIdle:
        Close();  // an idle keep-alive connection
        return;
      case State::kHead:
        Refuse(408, absl::StrCat("the request head did not arrive within ",
                                 loop_->options().header_timeout_s,
                                 " s (--http_header_timeout_s)"));
        return;
      case State::kBody:
        Refuse(408, absl::StrCat("the request body did not arrive within ",
                                 loop_->options().body_timeout_s, " s (--http_body_timeout_s)"));
        return;
      case State::kHandling:
      case State::kDraining:
        return;
    }
  }

  void MaybeFinishDraining() {
    if (closed_ || state_ != State::kDraining) return;
    if (evbuffer_get_length(bufferevent_get_output(bev_)) == 0) Close();
  }

  // Answers an error on the server's own account and closes after it is sent.
  void Refuse(int status, absl::string_view message) {
    RejectedFamily().Add({{"code", absl::StrCat(status)}}).Increment();
    const std::string body = ServerErrorBody(status, message);
    std::string response = ResponseHead(1, status, "application/json",
                                        {{"Content-Length", absl::StrCat(body.size())}},
                                        /*keep_alive=*/false);
    absl::StrAppend(&response, "\r\n", body);
    DisarmTimer();
    state_ = State::kDraining;
    evbuffer_drain(bufferevent_get_input(bev_), evbuffer_get_length(bufferevent_get_input(bev_)));
    Send(response);
    MaybeFinishDraining();
  }

  void OnRead() {
    if (closed_) return;
    in_read_ = true;
    ReadRequests();
    in_read_ = false;
  }

  void ReadRequests() {
    const HttpServerOptions& options = loop_->options();
    evbuffer* in = bufferevent_get_input(bev_);
    while (!closed_) {
      switch (state_) {
        case State::kIdle: {
          // RFC 9112 §2.2: ignore empty lines before a request line.
          while (evbuffer_get_length(in) >= 2) {
            char crlf[2];
            evbuffer_copyout(in, crlf, 2);
            if (crlf[0] != '\r' || crlf[1] != '\n') break;
            evbuffer_drain(in, 2);
          }
          if (evbuffer_get_length(in) == 0) return;
          state_ = State::kHead;
          ArmTimer(options.header_timeout_s);
          break;
        }
        case State::kHead: {
          const evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, nullptr);
          const int64_t available = static_cast<int64_t>(evbuffer_get_length(in));
          if (end.pos < 0 ? available > options.max_header_bytes
                          : end.pos + 4 > options.max_header_bytes) {
            Refuse(431, absl::StrCat("the request head is larger than ", options.max_header_bytes,
                                     " bytes (--http_max_header_bytes)"));
            return;
          }
          if (end.pos < 0) return;
          std::string head(static_cast<size_t>(end.pos) + 4, '\0');
          evbuffer_remove(in, head.data(), head.size());
          absl::StatusOr<HttpRequest> request = ParseHttpRequestHead(head, options.max_body_bytes);
          if (!request.ok()) {
            Refuse(HttpStatusOfParseError(request.status()), request.status().message());
            return;
          }
          request_ = *std::move(request);
          if (request_.expect_continue && request_.content_length > 0) {
            Send(absl::StrCat("HTTP/1.", request_.minor_version, " 100 Continue\r\n\r\n"));
          }
          state_ = State::kBody;
          ArmTimer(options.body_timeout_s);
          break;
        }
        case State::kBody: {
          if (static_cast<int64_t>(evbuffer_get_length(in)) < request_.content_length) return;
          request_.body.resize(static_cast<size_t>(request_.content_length));
          evbuffer_remove(in, request_.body.data(), request_.body.size());
          DisarmTimer();
          state_ = State::kHandling;
          exchange_ = std::shared_ptr<HttpExchange>(
              new HttpExchange(loop_ref_, this, std::move(request_)));
          request_ = HttpRequest();
          std::shared_ptr<HttpExchange> exchange = exchange_;
          loop_->handler()(exchange);
          break;  // the handler may have answered already (state back to kIdle)
        }
        case State::kHandling: {
          // Pipelined bytes wait; a peer that piles up more than a whole request is cut off.
          if (static_cast<int64_t>(evbuffer_get_length(in)) >
              options.max_header_bytes + options.max_body_bytes) {
            Close();
          }
          return;
        }
        case State::kDraining:
          evbuffer_drain(in, evbuffer_get_length(in));
          return;
      }
    }
  }

  HttpLoop* const loop_;
  const std::shared_ptr<HttpLoop> loop_ref_;  // exchanges keep the loop object alive
  bufferevent* bev_;
  const std::shared_ptr<std::atomic<int64_t>> open_connections_;
  event* timer_ = nullptr;  // header, body or idle deadline, by state_
  State state_ = State::kIdle;
  HttpRequest request_;  // being read (kBody)
  std::shared_ptr<HttpExchange> exchange_;  // kHandling
  bool closed_ = false;
  bool in_read_ = false;
};

void HttpLoop::Adopt(evutil_socket_t fd) {
  const int options = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;
  bufferevent* bev = nullptr;
  if (tls_ != nullptr) {
    SSL* ssl = SSL_new(tls_);
    if (ssl == nullptr) {
      evutil_closesocket(fd);
      return;
    }
    bev = bufferevent_openssl_socket_new(base_, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, options);
    if (bev != nullptr) bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
  } else {
    bev = bufferevent_socket_new(base_, fd, options);
  }
  if (bev == nullptr) {
    evutil_closesocket(fd);
    return;
  }
  // Connections hold their loop (exchanges outlive connections and post to it); the cycle ends
  // when StopAndJoin closes and deletes every connection.
  auto connection =
      std::make_unique<HttpConnection>(this, shared_from_this(), bev, open_connections_);
  HttpConnection* raw = connection.get();
  connections_.emplace(raw, std::move(connection));
  raw->Start();
}

void HttpLoop::Retire(HttpConnection* connection) {
  auto it = connections_.find(connection);
  if (it == connections_.end()) return;
  retired_.push_back(std::move(it->second));
  connections_.erase(it);
  event_active(wakeup_, 0, 0);  // delete it on the next turn
}

void HttpLoop::CloseAll() {
  std::vector<HttpConnection*> open;
  for (auto& [raw, connection] : connections_) open.push_back(raw);
  for (HttpConnection* c : open) c->Close();
}

void HttpLoop::RunDeferredDeletes() { retired_.clear(); }

// ---- HttpExchange ----

HttpExchange::HttpExchange(std::shared_ptr<HttpLoop> loop, HttpConnection* connection,
                           HttpRequest request)
    : loop_(std::move(loop)), connection_(connection), request_(std::move(request)) {}

HttpExchange::~HttpExchange() = default;  // timer_ is freed when the exchange ends or closes

void HttpExchange::Post(std::function<void()> fn) {
  loop_->Post([weak = weak_from_this(), fn = std::move(fn)] {
    std::shared_ptr<HttpExchange> self = weak.lock();
    if (self != nullptr && self->open()) fn();
  });
}

void HttpExchange::Respond(int status, absl::string_view content_type, absl::string_view body,
                           const std::vector<std::pair<std::string, std::string>>& headers) {
  if (!open() || streaming_) return;
  const bool keep_alive = request_.keep_alive;
  std::string response =
      ResponseHead(request_.minor_version, status, content_type, headers, keep_alive);
  absl::StrAppend(&response, "Content-Length: ", body.size(), "\r\n\r\n", body);
  ended_ = true;
  CancelTimer();
  on_close_ = nullptr;
  HttpConnection* connection = connection_;
  if (connection->Send(response)) connection->ExchangeEnded(keep_alive);
}

void HttpExchange::StartStream(int status, absl::string_view content_type,
                               const std::vector<std::pair<std::string, std::string>>& headers) {
  if (!open() || streaming_) return;
  streaming_ = true;
  const bool chunked = request_.minor_version == 1;
  std::vector<std::pair<std::string, std::string>> all = headers;
  if (chunked) all.emplace_back("Transfer-Encoding", "chunked");
  std::string head = ResponseHead(request_.minor_version, status, content_type, all,
                                  chunked && request_.keep_alive);
  absl::StrAppend(&head, "\r\n");
  connection_->Send(head);
}

bool HttpExchange::Write(absl::string_view data) {
  if (!open() || !streaming_) return false;
  if (data.empty()) return true;  // an empty chunk would end the body
  if (request_.minor_version == 0) return connection_->Send(data);
  return connection_->Send(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
}

void HttpExchange::End() {
  if (!open() || !streaming_) return;
  const bool chunked = request_.minor_version == 1;
  ended_ = true;
  CancelTimer();
  on_close_ = nullptr;
  HttpConnection* connection = connection_;
  if (chunked && !connection->Send("0\r\n\r\n")) return;
  connection->ExchangeEnded(chunked && request_.keep_alive);
}

void HttpExchange::SetTimer(double seconds, std::function<void()> fn) {
  if (!open()) return;
  if (timer_ == nullptr) {
    timer_ = event_new(
        loop_->base(), -1, 0,
        [](evutil_socket_t, short, void* arg) {
          auto* self = static_cast<HttpExchange*>(arg);
          // Keep the exchange alive while its callback runs.
          std::shared_ptr<HttpExchange> hold = self->shared_from_this();
          if (!self->open() || !self->timer_fn_) return;
          std::function<void()> fn = std::move(self->timer_fn_);
          self->timer_fn_ = nullptr;
          fn();
        },
        this);
  }
  timer_fn_ = std::move(fn);
  const timeval tv = ToTimeval(seconds);
  evtimer_add(timer_, &tv);
}

void HttpExchange::CancelTimer() {
  if (timer_ != nullptr) {
    event_free(timer_);
    timer_ = nullptr;
  }
  timer_fn_ = nullptr;
}

void HttpExchange::Closed() {
  connection_ = nullptr;
  CancelTimer();
  if (!ended_ && on_close_) {
    std::function<void()> fn = std::move(on_close_);
    on_close_ = nullptr;
    fn();
  }
  on_close_ = nullptr;
}

// ---- HttpServer ----

absl::Status ValidateHttpServerOptions(const HttpServerOptions& o) {
  auto positive = [](double v, absl::string_view name) -> absl::Status {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be a positive number of "
                                                           "seconds (got ", v, ")"));
    }
    return absl::OkStatus();
  };
  if (o.threads < 1 || o.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_threads must be in [1, 256] (got ", o.threads, ")"));
  }
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (64 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_max_header_bytes must be in [1024, 64 MiB] (got ", o.max_header_bytes, ")"));
  }
  if (o.max_body_bytes < 1 || o.max_body_bytes > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_max_body_bytes must be in [1, 4 GiB] (got ", o.max_body_bytes, ")"));
  }
  if (o.max_output_bytes < (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_max_output_bytes must be at least 64 KiB (got ", o.max_output_bytes, ")"));
  }
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_max_connections must be at least 1 (got ", o.max_connections, ")"));
  }
  if (absl::Status s = positive(o.header_timeout_s, "http_header_timeout_s"); !s.ok()) return s;
  if (absl::Status s = positive(o.body_timeout_s, "http_body_timeout_s"); !s.ok()) return s;
  if (absl::Status s = positive(o.idle_timeout_s, "http_idle_timeout_s"); !s.ok()) return s;
  if (absl::Status s = positive(o.write_timeout_s, "http_write_timeout_s"); !s.ok()) return s;
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: give both or neither");
  }
  return absl::OkStatus();
}

namespace {

// Resolves "host:port" ("[v6]:port" too) to a passive socket address.
absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> ResolveListenAddress(
    const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             absl::StrCat(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("http_address '", address,
                                                   "': cannot resolve host: ", gai_strerror(rc)));
  }
  std::pair<sockaddr_storage, socklen_t> result{};
  std::memcpy(&result.first, found->ai_addr, found->ai_addrlen);
  result.second = found->ai_addrlen;
  freeaddrinfo(found);
  return result;
}

}  // namespace

// The listening socket on loop 0 and the TLS context every connection shares.
class HttpAcceptor {
 public:
  ~HttpAcceptor() {
    if (resume != nullptr) event_free(resume);
    if (listener != nullptr) evconnlistener_free(listener);
    if (tls != nullptr) SSL_CTX_free(tls);
  }
  std::vector<std::shared_ptr<HttpLoop>>* loops = nullptr;
  std::shared_ptr<std::atomic<int64_t>> connections;
  int64_t max_connections = 0;
  size_t next = 0;
  event* resume = nullptr;  // re-enables accepting after a pause (out of descriptors)
  evconnlistener* listener = nullptr;
  SSL_CTX* tls = nullptr;
};

namespace {

void AcceptCb(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
  auto* ctx = static_cast<HttpAcceptor*>(arg);
  if (ctx->connections->load() >= ctx->max_connections) {
    RejectedFamily().Add({{"code", "503"}}).Increment();
    static constexpr char kBusy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)send(fd, kBusy, sizeof(kBusy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    evutil_closesocket(fd);
    return;
  }
  evutil_make_socket_nonblocking(fd);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // SSE chunks are small
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));  // half-open peers go away
  std::shared_ptr<HttpLoop> loop = (*ctx->loops)[ctx->next++ % ctx->loops->size()];
  if (!loop->Post([loop_raw = loop.get(), fd] { loop_raw->Adopt(fd); })) {
    evutil_closesocket(fd);
  }
}

void AcceptErrorCb(evconnlistener* listener, void* arg) {
  auto* ctx = static_cast<HttpAcceptor*>(arg);
  const int err = EVUTIL_SOCKET_ERROR();
  // Out of descriptors (or another transient error): stop accepting for a moment instead of
  // spinning on a listener that stays readable.
  VAMP_LOG(WARNING) << "HTTP: accept failed (" << evutil_socket_error_to_string(err)
                    << "); pausing accepts for 100 ms";
  evconnlistener_disable(listener);
  const timeval tv = ToTimeval(0.1);
  evtimer_add(ctx->resume, &tv);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                             HttpHandler handler) {
  if (absl::Status s = ValidateHttpServerOptions(options); !s.ok()) return s;
  static std::once_flag once;
  std::call_once(once, [] {
    // Loops are woken from engine threads (event_active), so libevent needs its locks; a write
    // to a socket the peer closed must be an error, not a process-killing SIGPIPE.
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN);
  });
  absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> address =
      ResolveListenAddress(options.address);
  if (!address.ok()) return address.status();

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->acceptor_ = std::make_unique<HttpAcceptor>();
  HttpAcceptor& acceptor = *server->acceptor_;
  if (!options.tls_cert_file.empty()) {
    acceptor.tls = SSL_CTX_new(TLS_server_method());
    if (acceptor.tls == nullptr ||
        SSL_CTX_use_certificate_chain_file(acceptor.tls, options.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(acceptor.tls, options.tls_key_file.c_str(),
                                    SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(acceptor.tls) != 1) {
      char reason[256] = "unknown error";
      if (unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, reason, sizeof(reason));
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          "tls_cert_file/tls_key_file: cannot load a certificate and key from '",
          options.tls_cert_file, "' and '", options.tls_key_file, "': ", reason));
    }
    SSL_CTX_set_min_proto_version(acceptor.tls, TLS1_2_VERSION);
  }
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_shared<HttpLoop>(options, handler, server->connections_, acceptor.tls);
    if (absl::Status s = loop->Init(); !s.ok()) return s;
    server->loops_.push_back(std::move(loop));
  }
  acceptor.loops = &server->loops_;
  acceptor.connections = server->connections_;
  acceptor.max_connections = options.max_connections;
  event_base* base0 = server->loops_[0]->base();
  acceptor.listener = evconnlistener_new_bind(
      base0, &AcceptCb, &acceptor,
      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, SOMAXCONN,
      reinterpret_cast<const sockaddr*>(&address->first), static_cast<int>(address->second));
  if (acceptor.listener == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on '", options.address,
                                               "': ", strerror(errno)));
  }
  evconnlistener_set_error_cb(acceptor.listener, &AcceptErrorCb);
  acceptor.resume = evtimer_new(
      base0,
      [](evutil_socket_t, short, void* arg) {
        evconnlistener_enable(static_cast<HttpAcceptor*>(arg)->listener);
      },
      &acceptor);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(evconnlistener_get_fd(acceptor.listener), reinterpret_cast<sockaddr*>(&bound),
                  &bound_len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", strerror(errno)));
  }
  server->port_ = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  for (auto& loop : server->loops_) loop->StartThread();
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& loop : loops_) loop->StopAndJoin();
  acceptor_.reset();  // the listener lives on loop 0's base, which loops_ still holds
}

}  // namespace vamp
