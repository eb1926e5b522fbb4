// vamp-sim's report: markdown tables of every run (latency, throughput, cache, preemptions,
// decisions), SVG charts (TTFT p99 and hit rate against concurrency for a sweep; KV pool size
// and offload ratio over time; decisions by kind), and reference numbers from the paper next to
// ours where given.
#ifndef VAMP_SIM_REPORT_H_
#define VAMP_SIM_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/chart/paper_reference.h"
#include "bench/stats/run_stats.h"
#include "sim/simulator.h"

namespace vamp::sim {

struct RunRecord {
  int32_t concurrency = 0;  // the sweep's x value (0 when the workload is not a sweep)
  SimResult result;
};

using chart::PaperFigure9H100;
using chart::PaperPoint;

struct ReportSpec {
  std::string title;
  std::string command;
  std::vector<std::string> setting;    // markdown lines describing model, hardware, workload
  std::vector<std::string> policies;   // column/series order
  std::vector<int32_t> concurrencies;  // sweep x values; empty for a single workload
  std::vector<RunRecord> runs;
  std::vector<PaperPoint> paper;
  // SVG file names are `svg_prefix` + "-<chart>.svg", linked relative to the markdown file.
  std::string svg_prefix;
  // > 0: also tabulate the turns that arrive at or after this virtual time (a late phase).
  double phase_split_s = 0;
  // The runs left each session's turn 0 out of TTFT (SimOptions::exclude_first_turn).
  bool exclude_first_turn = false;
  // The window vamp-bench's statistics use: the paper's (ends when the first session completes
  // after all have started) for one wave of sessions; the whole run when later phases (tail
  // sessions, mixed low-reuse traffic) would fall outside it.
  bool window_ends_before_drain = true;
  double total_wall_s = 0;
  int threads = 1;
};

struct RenderedReport {
  std::string markdown;
  std::vector<std::pair<std::string, std::string>> svgs;  // (file name, contents)
};

RenderedReport RenderReport(const ReportSpec& spec);

// The completed turns of a run as vamp-bench records requests (bench/stats), so that simulated
// and measured runs are summarised by the same rules (the paper's window, Q(T, P)).
std::vector<bench::RequestRecord> RequestRecords(const SimResult& result);

// One row per run (markdown), for the report and for stdout.
std::string ResultsTable(const std::vector<RunRecord>& runs, bool with_concurrency);
// One row per run over the turns arriving at or after `from_s` (markdown).
std::string PhaseTable(const std::vector<RunRecord>& runs, bool with_concurrency, double from_s);

}  // namespace vamp::sim

#endif  // VAMP_SIM_REPORT_H_
