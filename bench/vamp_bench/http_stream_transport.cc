// StreamTransport over HTTP/1.1 + SSE: POST /v1/completions with a token-id prompt on the pool's
// keep-alive connections; each "data:" event is one completion chunk (protocol.h).
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/vamp_bench/protocol.h"
#include "bench/vamp_bench/stream_transport.h"

namespace vamp::bench {

double SecondsSince(BenchClock::time_point start) {
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

namespace {

class HttpStreamTransport final : public StreamTransport {
 public:
  HttpStreamTransport(event_base* base, const TransportOptions& options)
      : options_(options), pool_(base, options.endpoint, options.idle_timeout_s) {}

  absl::Status Start(const std::vector<int32_t>& prompt, int32_t max_tokens,
                     StreamEvents events) override {
    auto live = std::make_shared<Live>();
    live->events = std::move(events);
    StreamHandlers h;
    h.on_body = [this, live](int status, absl::string_view bytes) { OnBody(*live, status, bytes); };
    h.on_done = [this, live](int status, const std::string& transport_error) {
      OnDone(live, status, transport_error);
    };
    absl::StatusOr<ConnectionPool::Request*> req = pool_.PostStreaming(
        options_.path, CompletionRequestBody(prompt, max_tokens, options_.model), std::move(h));
    if (!req.ok()) return req.status();
    live_[live.get()] = *req;
    return absl::OkStatus();
  }

  void CancelAll() override {
    for (auto& [live, request] : live_) pool_.Cancel(request);
    live_.clear();
  }

 private:
  struct Live {
    StreamEvents events;
    SseParser parser;
    bool finish_seen = false;
    std::string error;
    std::string error_body;  // non-200 bodies
  };

  void OnBody(Live& live, int status, absl::string_view bytes) {
    if (status != 200) {
      if (live.error_body.size() < 4096) live.error_body.append(bytes.data(), bytes.size());
      return;
    }
    const double at_s = SecondsSince(options_.start);
    live.parser.Feed(bytes, [&](absl::string_view data) {
      absl::StatusOr<CompletionChunk> chunk = ParseCompletionChunk(data);
      if (!chunk.ok()) {
        if (live.error.empty()) live.error = std::string(chunk.status().message());
        return;
      }
      if (!chunk->error.empty() && live.error.empty()) live.error = chunk->error;
      if (!chunk->token_ids.empty()) live.events.on_tokens(chunk->token_ids, at_s);
      if (!chunk->finish_reason.empty()) live.finish_seen = true;
      if (chunk->has_usage && chunk->cached_tokens >= 0) {
        live.events.on_cached(static_cast<int32_t>(chunk->cached_tokens));
      }
    });
  }

  void OnDone(const std::shared_ptr<Live>& live, int status, const std::string& transport_error) {
    live_.erase(live.get());
    if (status == 0) {
      live->error = absl::StrCat("transport: ", transport_error);
    } else if (status != 200) {
      std::string body = live->error_body;
      if (absl::StatusOr<CompletionChunk> c = ParseCompletionChunk(body);
          c.ok() && !c->error.empty()) {
        body = c->error;
      }
      live->error = absl::StrCat("HTTP ", status, ": ", body.substr(0, 300));
    } else if (!live->finish_seen && live->error.empty()) {
      live->error = "stream ended without a finish_reason";
    }
    live->events.on_done(live->error);
  }

  const TransportOptions options_;
  ConnectionPool pool_;
  std::map<Live*, ConnectionPool::Request*> live_;
};

}  // namespace

std::unique_ptr<StreamTransport> NewHttpStreamTransport(event_base* base,
                                                        const TransportOptions& options) {
  return std::make_unique<HttpStreamTransport>(base, options);
}

}  // namespace vamp::bench
