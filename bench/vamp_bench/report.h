// vamp-bench's results: one RunResult per (configuration, sessions, repeat), what the server's
// metrics said over the measurement window, and the report — markdown with tables, SVG charts
// (bench/chart) and the raw JSON.
#ifndef VAMP_BENCH_VAMP_BENCH_REPORT_H_
#define VAMP_BENCH_VAMP_BENCH_REPORT_H_

#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/vamp_bench/metrics_sampler.h"
#include "bench/stats/run_stats.h"

namespace vamp::bench {

// Server-side figures over the window, from the sampled counters and gauges (the paper takes
// cache and preemption figures from server counters). NaN where no sample covers the window.
struct ServerStats {
  int64_t samples = 0;
  double hit_rate = 0;     // Δ hit tokens / Δ queried tokens over the window, 0..1
  double preemptions = 0;  // Δ over the window
  // Mean of the server's inter-token latency histogram over the window (Δ sum / Δ count): the
  // paper's TPOT ("the mean of the server-side TPOT histogram"), seconds.
  double server_tpot_s = 0;
  double peak_offload_ratio = 0;  // over the run
  double min_pool_blocks = 0;
  double max_pool_blocks = 0;
  double mean_kv_usage = 0;                 // over window samples
  double max_waiting = 0;                   // over the run
  std::map<std::string, double> decisions;  // Δ over the run, by action
};
ServerStats ComputeServerStats(const std::vector<MetricsSample>& samples, const Window& window);

struct RunResult {
  std::string config;        // e.g. "static", "vamp-25"
  std::string config_flags;  // the controller flags that make it
  int32_t sessions = 0;      // the sweep's x (multi-turn concurrency c)
  int32_t repeat = 0;
  std::string command;  // the controller's command line ("" against a live server)
  std::string error;    // the run could not happen (e.g. the system did not start)
  double duration_s = 0;
  bool cut_off = false;
  RunStats stats;
  ServerStats server;
  std::vector<RequestRecord> records;
  std::vector<MetricsSample> samples;
};

struct ReportSpec {
  std::string title = "vamp-bench";
  std::vector<std::string> header_lines;  // date, commit, machine, commands (markdown lines)
  std::string workload;                   // DescribeWorkload
  std::string svg_prefix = "report";      // SVG files are <prefix>-<chart>.svg
  // The hit rate (0..1) an infinite prefix cache would reach on the workload
  // (workload::Summarize), drawn as a reference line on the hit-rate chart; NaN: none.
  double ideal_hit_rate = std::numeric_limits<double>::quiet_NaN();
  std::string ideal_hit_rate_label;
  // Draw the paper's numbers as references (bench/chart/paper_reference.h): its Table IV TTFT
  // p90/p99 and hit rates as horizontal lines, its TPOT cost (×1.311) as a dashed series over the
  // first configuration's TPOT, and, for multi-turn sweeps, its Figure 9 TTFT p99 points next to
  // configurations of the same name (static, vamp-15, vamp-20, vamp-25).
  bool paper_reference = true;
  bool multi_turn_sweep = false;
  // The Q(T, P) grid in seconds; empty: derived from the runs (AutoLimits).
  std::vector<double> ttft_limits_s;
  std::vector<double> tpot_limits_s;
};

struct RenderedReport {
  std::string markdown;
  std::string json;
  std::vector<std::pair<std::string, std::string>> svgs;  // (file name, contents)
};

RenderedReport RenderReport(const ReportSpec& spec, const std::vector<RunResult>& runs);

// The raw JSON of one run (per-request records and metric samples included).
std::string RunJson(const RunResult& run);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_REPORT_H_
