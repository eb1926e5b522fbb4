// How vamp-bench's client streams one generation from the server: over HTTP/SSE (POST
// /v1/completions with a token-id prompt) or over gRPC (Serving.Generate). Both report the same
// events on the event-loop thread that owns the transport, so the client's session and timing
// logic (client.cc) is one piece of code whatever the protocol.
//
// Every request asks for exactly `max_tokens` greedy tokens (EOS ignored) with usage reported, so
// the workload's lengths are what the server generates.
#ifndef VAMP_BENCH_VAMP_BENCH_STREAM_TRANSPORT_H_
#define VAMP_BENCH_VAMP_BENCH_STREAM_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/vamp_bench/http_client.h"

struct event_base;

namespace vamp::bench {

using BenchClock = std::chrono::steady_clock;

// Seconds from `start` to now.
double SecondsSince(BenchClock::time_point start);

// What one stream reports, always on the transport's loop thread, in this order: any number of
// on_tokens, at most one on_cached, then on_done exactly once.
struct StreamEvents {
  // Tokens that arrived together. `at_s` is when their bytes reached the client (seconds since
  // the run's start), taken on the thread that received them, before any hand-over.
  std::function<void(const std::vector<int32_t>& ids, double at_s)> on_tokens;
  // Prompt tokens the server served from its prefix cache, when it says.
  std::function<void(int32_t cached_tokens)> on_cached;
  // The stream ended: `error` is empty when it finished normally (a finish reason and no error).
  std::function<void(const std::string& error)> on_done;
};

class StreamTransport {
 public:
  virtual ~StreamTransport() = default;
  // Starts one generation. An error means nothing was started and no event will come.
  virtual absl::Status Start(const std::vector<int32_t>& prompt, int32_t max_tokens,
                             StreamEvents events) = 0;
  // Ends every stream still open (the run was cut off): none of their events runs afterwards.
  // Returns once no event can run any more; call it on the loop thread, after the loop stopped.
  virtual void CancelAll() = 0;
};

struct TransportOptions {
  HttpEndpoint endpoint;                 // the server (HTTP API or gRPC Serving), with the API key
  std::string path = "/v1/completions";  // HTTP only
  std::string model;                     // "model" of every request; empty: the only model
  // A stream fails when the server sends nothing for this long (seconds).
  double idle_timeout_s = 600;
  BenchClock::time_point start;  // time zero of at_s
};

// HTTP/1.1 + SSE on keep-alive connections of `base` (ConnectionPool).
std::unique_ptr<StreamTransport> NewHttpStreamTransport(event_base* base,
                                                        const TransportOptions& options);
// gRPC Serving.Generate on one channel of its own (its own connection), the API key as
// "authorization: Bearer" metadata. gRPC delivers on its own threads; events are handed to
// `base`'s thread.
std::unique_ptr<StreamTransport> NewGrpcStreamTransport(event_base* base,
                                                        const TransportOptions& options);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_STREAM_TRANSPORT_H_
