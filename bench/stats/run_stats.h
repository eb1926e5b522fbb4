// Statistics of a run, measured by vamp-bench's client or simulated by vamp-sim: one record per
// request, the paper's measurement window (§VI-A), latency distributions and the SLO-qualified
// throughput Q(T, P) (§VI-E).
// Pure functions over recorded data; times are seconds from the start of the run.
#ifndef VAMP_BENCH_STATS_RUN_STATS_H_
#define VAMP_BENCH_STATS_RUN_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace vamp::bench {

// One request (one turn of one session) as the client saw it.
struct RequestRecord {
  int32_t session = 0;  // index into Workload::sessions
  int32_t turn = 0;     // index into Session::turns
  double issue_s = 0;   // when the request was sent
  // When the first generated token arrived; < 0 when none did.
  double first_token_s = -1;
  // When the response ended (success or failure); < 0 when it never did (cut off at the end).
  double finish_s = -1;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;   // tokens received
  int32_t cached_tokens = -1;  // prompt tokens the server served from its cache; -1 = unknown
  // Gaps between consecutive token-carrying SSE events, seconds (one per event after the first).
  std::vector<double> inter_token_s;
  bool ok = false;    // finished normally with a 200 and a finish_reason
  std::string error;  // why not, when !ok

  double Ttft() const { return first_token_s - issue_s; }
  double E2e() const { return finish_s - issue_s; }
  // Time per output token after the first: (finish − first token) / (outputs − 1); 0 when fewer
  // than 2 tokens were generated (such a request meets every TPOT limit).
  double Tpot() const;
  bool Completed() const { return ok && finish_s >= 0; }
};

// Linear interpolation between closest ranks (numpy's default), p in [0, 100]. NaN when empty.
double Percentile(std::vector<double> values, double p);
// Arithmetic mean; NaN when empty.
double Mean(const std::vector<double>& values);

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // NaN when count == 0
};
Distribution Distribute(const std::vector<double>& values);

// The paper's measurement rules (§VI-A):
// - the window starts once `warmup_requests` requests have completed (0: at the run's start);
// - it ends when the first session completes after all sessions have started (before the drain
//   phase), or at the last finish when no session completes after that;
// - TTFT percentiles leave out each session's first turn when `exclude_first_turn` (the
//   synchronized t = 0 turn of the multi-turn sweep, which no cache can serve).
struct WindowRule {
  int64_t warmup_requests = 0;
  bool end_before_drain = true;  // false: the window ends at the last finish
  bool exclude_first_turn = true;
};

struct Window {
  double start_s = 0;
  double end_s = 0;
  double Duration() const { return end_s - start_s; }
  bool Contains(double t) const { return t >= start_s && t <= end_s; }
};

// `turns_per_session[i]` is how many turns session i has (a session completes with its last).
Window MeasurementWindow(const std::vector<RequestRecord>& records,
                         const std::vector<int32_t>& turns_per_session, const WindowRule& rule);

// A grid of SLO limits and Q(T, P) = qualified requests / W for each cell, where a request
// qualifies when it completes inside the window with TTFT <= T and TPOT <= P (client-measured);
// failed and unfinished requests are misses.
struct QGrid {
  std::vector<double> ttft_limits_s;         // T, rows
  std::vector<double> tpot_limits_s;         // P, columns
  std::vector<std::vector<double>> q_per_s;  // [row][column], requests per second
};
QGrid QualifiedThroughput(const std::vector<RequestRecord>& records, const Window& window,
                          const std::vector<double>& ttft_limits_s,
                          const std::vector<double>& tpot_limits_s);

// For grids over the same limits (one per configuration; null = not measured): in how many
// cells each has the highest Q, where a Q within `tie` (relative) of the highest ties with it
// (run-to-run noise on the GPU is about 2 %: a 0.5 % difference is not a win); a cell where
// nobody qualified counts for nobody.
std::vector<int> CellsWon(const std::vector<const QGrid*>& grids, double tie = 0.02);

// Q of `candidate` against `baseline` over the same limits, cell by cell: the geometric mean and
// the worst of candidate ÷ baseline over the cells where both qualified someone, and the cells
// where only one of them did. "Never worse than static" reads as worst >= 0.95 and no cell lost.
struct QComparison {
  int cells = 0;  // both > 0
  double geomean_ratio = 0;
  double worst_ratio = 0;
  double best_ratio = 0;
  int only_candidate = 0;  // the baseline qualified nobody there
  int only_baseline = 0;   // the candidate qualified nobody there
};
QComparison CompareQ(const QGrid& candidate, const QGrid& baseline);
// "×1.02 (worst ×0.95, best ×1.30)" plus the one-sided cells when there are any; "–" when no
// cell compares.
std::string DescribeQComparison(const QComparison& c);

// A 5-limit axis for Q(T, P) when none is given: the 25th, 50th, 75th, 90th and 99th
// percentiles of `values` pooled over every run (so the grid spans what was measured, and is
// the same for every configuration of a report), rounded to two significant digits.
std::vector<double> AutoLimits(std::vector<double> values);

// What a run's report shows, over the measurement window.
struct RunStats {
  Window window;
  int64_t requests = 0;          // issued, in all
  int64_t completed = 0;         // in all
  int64_t failed = 0;            // in all (errors; unfinished ones are neither)
  int64_t window_requests = 0;   // issued inside the window (the latency population)
  int64_t window_completed = 0;  // completed inside the window (the throughput numerator)
  Distribution ttft_s;           // window requests, first turns left out per the rule
  Distribution tpot_s;           // window requests that completed
  Distribution itl_s;            // inter-token gaps of window requests
  Distribution e2e_s;
  double request_throughput = 0;   // completed in window / W, per second
  double output_tokens_per_s = 0;  // tokens of requests completed in window / W
  // Prompt tokens served from the server's cache over prompt tokens, requests in the window
  // whose usage chunk said so; NaN when none did.
  double client_cache_hit_ratio = 0;
};
RunStats ComputeRunStats(const std::vector<RequestRecord>& records,
                         const std::vector<int32_t>& turns_per_session, const WindowRule& rule);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_STATS_RUN_STATS_H_
