// vamp-bench's load generator: runs a Workload (bench/workload) against a live server by the
// workload's issue rules (workload.h), streaming every turn with a token-id prompt over HTTP/SSE
// (/v1/completions) or gRPC (Serving.Generate) (stream_transport.h), and records what each
// request looked like from the client (stats.h). Multi-turn sessions re-send their history with
// the token ids the server generated, so the prefix cache sees what a chat or agent client would
// send.
//
// Sessions are dealt round-robin to `loops` event-loop threads; each thread owns its sessions'
// state and connections, so thousands of sessions need no locks and few threads.
#ifndef VAMP_BENCH_VAMP_BENCH_CLIENT_H_
#define VAMP_BENCH_VAMP_BENCH_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/vamp_bench/http_client.h"
#include "bench/stats/run_stats.h"
#include "bench/vamp_bench/stream_transport.h"
#include "bench/workload/workload.h"

namespace vamp::bench {

enum class StreamProtocol { kHttp, kGrpc };

struct ClientOptions {
  // The HTTP API (streams when protocol is kHttp; the metrics sampler reads its /metrics).
  HttpEndpoint endpoint;
  std::string path = "/v1/completions";
  StreamProtocol protocol = StreamProtocol::kHttp;
  // gRPC Serving (protocol kGrpc); its api_key is endpoint's.
  HttpEndpoint grpc_endpoint;
  // "model" of every request; empty: left out (the server's only model).
  std::string model;
  int32_t loops = 1;               // event-loop threads, >= 1
  double request_timeout_s = 600;  // a request that sends nothing for this long fails
  // > 0: stop at this many seconds after the start: no more turns are issued and requests in
  // flight are cut off (recorded as unfinished). 0: run until every turn has finished.
  double max_duration_s = 0;
  // A progress line on stderr once a second.
  bool progress = true;
  // Appended to each progress line (e.g. the latest server metrics); called on the progress
  // thread.
  std::function<std::string()> progress_extra;
};

// Counters the loops update and the progress line reads (any thread).
struct ClientProgress {
  std::atomic<int64_t> issued{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> output_tokens{0};
  std::atomic<int64_t> turns_total{0};
};

struct ClientRun {
  std::vector<RequestRecord> records;  // in issue order per loop; sorted by issue_s
  double duration_s = 0;               // start to the last response (or the cut-off)
  bool cut_off = false;                // max_duration_s ended it
  std::vector<int32_t> turns_per_session;
};

// Runs `workload` from `start` (time zero of every recorded time). Blocks until done.
// InvalidArgument for bad options; per-request failures are recorded, not returned.
absl::StatusOr<ClientRun> RunWorkload(const workload::Workload& workload,
                                      const ClientOptions& options, BenchClock::time_point start);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_CLIENT_H_
