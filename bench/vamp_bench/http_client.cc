#include "bench/vamp_bench/http_client.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>

#include <cmath>
#include <csignal>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vamp::bench {

void InitLibevent() {
  static std::once_flag once;
  std::call_once(once, [] {
    evthread_use_pthreads();
    // libevent writes with write(2): a write to a connection the server reset must be an error
    // on that request, not a SIGPIPE that kills the benchmark (and every other stream with it).
    signal(SIGPIPE, SIG_IGN);
  });
}

namespace {

const char* ErrorName(int error) {
  switch (error) {
    case EVREQ_HTTP_TIMEOUT:
      return "timed out";
    case EVREQ_HTTP_EOF:
      return "connection closed by the server";
    case EVREQ_HTTP_INVALID_HEADER:
      return "invalid response header";
    case EVREQ_HTTP_BUFFER_ERROR:
      return "socket error (connection refused or reset)";
    case EVREQ_HTTP_REQUEST_CANCEL:
      return "cancelled";
    case EVREQ_HTTP_DATA_TOO_LONG:
      return "response too long";
    default:
      return "transport error";
  }
}

std::string Drain(evhttp_request* req) {
  evbuffer* in = evhttp_request_get_input_buffer(req);
  const size_t n = evbuffer_get_length(in);
  std::string out(n, '\0');
  if (n > 0) evbuffer_remove(in, out.data(), n);
  return out;
}

void AddHeaders(evhttp_request* req, const HttpEndpoint& e) {
  evkeyvalq* h = evhttp_request_get_output_headers(req);
  const std::string host = absl::StrCat(e.host, ":", e.port);
  evhttp_add_header(h, "Host", host.c_str());
  if (!e.api_key.empty()) {
    const std::string auth = absl::StrCat("Bearer ", e.api_key);
    evhttp_add_header(h, "Authorization", auth.c_str());
  }
}

timeval Timeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(std::floor(seconds));
  tv.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  return tv;
}

}  // namespace

class ConnectionPool::Request {
 public:
  ConnectionPool* pool = nullptr;
  evhttp_connection* connection = nullptr;
  evhttp_request* request = nullptr;
  StreamHandlers handlers;
  std::string transport_error;
  std::string path;
  std::string body;
  int attempts = 0;
  bool reused = false;     // the current attempt went out on a kept-alive connection
  bool got_bytes = false;  // any response byte arrived
  bool timed_out = false;  // the attempt failed by the inactivity timeout
};

struct PoolCallbacks {
  static void OnChunk(evhttp_request* req, void* arg) {
    auto* r = static_cast<ConnectionPool::Request*>(arg);
    const std::string bytes = Drain(req);
    r->got_bytes = r->got_bytes || !bytes.empty();
    if (!bytes.empty() && r->handlers.on_body) {
      r->handlers.on_body(evhttp_request_get_response_code(req), bytes);
    }
  }
  static void OnError(evhttp_request_error error, void* arg) {
    auto* r = static_cast<ConnectionPool::Request*>(arg);
    r->transport_error = ErrorName(error);
    r->timed_out = error == EVREQ_HTTP_TIMEOUT;
  }
  static void OnDone(evhttp_request* req, void* arg) {
    std::unique_ptr<ConnectionPool::Request> r(static_cast<ConnectionPool::Request*>(arg));
    ConnectionPool* pool = r->pool;
    --pool->in_flight_;
    int status = 0;
    if (req != nullptr) {
      status = evhttp_request_get_response_code(req);
      const std::string rest = Drain(req);
      if (!rest.empty() && r->handlers.on_body) r->handlers.on_body(status, rest);
    }
    const bool ok = req != nullptr && status > 0;
    pool->Release(r->connection, ok);
    // A kept-alive connection the server closed while it sat idle (libevent usually notices
    // first; this covers the close racing the send) fails the next request at once, before any
    // byte of an answer: send it once more on a new connection. Not after a timeout: the server
    // may be working on it.
    if (!ok && r->reused && !r->got_bytes && !r->timed_out && r->attempts == 1) {
      r->transport_error.clear();
      if (pool->Send(r.get(), /*allow_reuse=*/false).ok()) {
        ++pool->in_flight_;
        r.release();
        return;
      }
    }
    if (!ok && r->transport_error.empty()) r->transport_error = "no response";
    if (r->handlers.on_done) r->handlers.on_done(ok ? status : 0, ok ? "" : r->transport_error);
  }
};

ConnectionPool::ConnectionPool(event_base* base, HttpEndpoint endpoint, double timeout_s)
    : base_(base), endpoint_(std::move(endpoint)), timeout_s_(timeout_s) {}

ConnectionPool::~ConnectionPool() {
  for (evhttp_connection* c : idle_) evhttp_connection_free(c);
  for (evhttp_connection* c : broken_) evhttp_connection_free(c);
}

evhttp_connection* ConnectionPool::Connect() {
  evhttp_connection* c = evhttp_connection_base_new(base_, nullptr, endpoint_.host.c_str(),
                                                    static_cast<uint16_t>(endpoint_.port));
  if (c == nullptr) return nullptr;
  evhttp_connection_set_retries(c, 0);
  const timeval tv = Timeval(timeout_s_);
  evhttp_connection_set_timeout_tv(c, &tv);
  return c;
}

void ConnectionPool::Release(evhttp_connection* connection, bool reusable) {
  // A connection is freed only with the pool: freeing it inside its own callback is unsafe.
  (reusable ? idle_ : broken_).push_back(connection);
}

absl::Status ConnectionPool::Send(Request* r, bool allow_reuse) {
  evhttp_connection* c = nullptr;
  r->reused = false;
  if (allow_reuse && !idle_.empty()) {
    c = idle_.back();
    idle_.pop_back();
    r->reused = true;
  } else {
    c = Connect();
  }
  if (c == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a connection to ", endpoint_.host, ":", endpoint_.port));
  }
  r->connection = c;
  ++r->attempts;
  evhttp_request* req = evhttp_request_new(&PoolCallbacks::OnDone, r);
  evhttp_request_set_chunked_cb(req, &PoolCallbacks::OnChunk);
  evhttp_request_set_error_cb(req, &PoolCallbacks::OnError);
  AddHeaders(req, endpoint_);
  evkeyvalq* h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "application/json");
  evhttp_add_header(h, "Accept", "text/event-stream");
  evbuffer_add(evhttp_request_get_output_buffer(req), r->body.data(), r->body.size());
  r->request = req;
  if (evhttp_make_request(c, req, EVHTTP_REQ_POST, r->path.c_str()) != 0) {
    // evhttp_make_request frees the request on failure.
    Release(c, false);
    return absl::UnavailableError(
        absl::StrCat("cannot send a request to ", endpoint_.host, ":", endpoint_.port));
  }
  return absl::OkStatus();
}

absl::StatusOr<ConnectionPool::Request*> ConnectionPool::PostStreaming(const std::string& path,
                                                                       std::string body,
                                                                       StreamHandlers handlers) {
  auto r = std::make_unique<Request>();
  r->pool = this;
  r->handlers = std::move(handlers);
  r->path = path;
  r->body = std::move(body);
  if (absl::Status s = Send(r.get(), /*allow_reuse=*/true); !s.ok()) return s;
  ++in_flight_;
  return r.release();
}

void ConnectionPool::Cancel(Request* request) {
  std::unique_ptr<Request> r(request);
  evhttp_cancel_request(r->request);
  --in_flight_;
  Release(r->connection, false);
}

namespace {

struct GetState {
  event_base* base = nullptr;
  bool done = false;
  HttpResponse response;
  std::string error;
};

void OnGetDone(evhttp_request* req, void* arg) {
  auto* s = static_cast<GetState*>(arg);
  s->done = true;
  if (req == nullptr || evhttp_request_get_response_code(req) == 0) {
    if (s->error.empty()) s->error = "no response";
  } else {
    s->response.status = evhttp_request_get_response_code(req);
    s->response.body = Drain(req);
  }
  event_base_loopexit(s->base, nullptr);
}

void OnGetError(evhttp_request_error error, void* arg) {
  static_cast<GetState*>(arg)->error = ErrorName(error);
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const HttpEndpoint& endpoint, const std::string& path,
                                     double timeout_s) {
  InitLibevent();
  std::unique_ptr<event_base, decltype(&event_base_free)> base(event_base_new(), &event_base_free);
  if (base == nullptr) return absl::InternalError("event_base_new failed");
  evhttp_connection* c = evhttp_connection_base_new(base.get(), nullptr, endpoint.host.c_str(),
                                                    static_cast<uint16_t>(endpoint.port));
  if (c == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a connection to ", endpoint.host, ":", endpoint.port));
  }
  evhttp_connection_set_retries(c, 0);
  const timeval tv = Timeval(timeout_s);
  evhttp_connection_set_timeout_tv(c, &tv);
  GetState state;
  state.base = base.get();
  evhttp_request* req = evhttp_request_new(&OnGetDone, &state);
  evhttp_request_set_error_cb(req, &OnGetError);
  AddHeaders(req, endpoint);
  if (evhttp_make_request(c, req, EVHTTP_REQ_GET, path.c_str()) != 0) {
    evhttp_connection_free(c);
    return absl::UnavailableError(
        absl::StrCat("cannot send GET ", path, " to ", endpoint.host, ":", endpoint.port));
  }
  // A guard timer, in case the connection timeout does not cover connecting.
  const timeval guard = Timeval(timeout_s + 1);
  event_base_loopexit(base.get(), &guard);
  event_base_dispatch(base.get());
  if (!state.done) evhttp_cancel_request(req);
  evhttp_connection_free(c);
  if (!state.done || !state.error.empty() || state.response.status == 0) {
    return absl::UnavailableError(
        absl::StrCat("GET http://", endpoint.host, ":", endpoint.port, path,
                     " failed: ", state.done ? state.error : "timed out"));
  }
  return state.response;
}

absl::StatusOr<HttpEndpoint> ParseHostPort(absl::string_view address, absl::string_view what) {
  HttpEndpoint e;
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", address, "' is not host:port"));
  }
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", address, "' has no valid port (1-65535)"));
  }
  e.host = std::string(host);
  e.port = port;
  return e;
}

}  // namespace vamp::bench
