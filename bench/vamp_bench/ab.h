// One measured run against a live server (`vamp-bench run`) and the A/B runner (`vamp-bench ab`):
// for every sessions value and repeat, each configuration gets a freshly started system (so no
// run inherits another's cache), the same workload, the metrics sampler, and its statistics.
#ifndef VAMP_BENCH_VAMP_BENCH_AB_H_
#define VAMP_BENCH_VAMP_BENCH_AB_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/vamp_bench/client.h"
#include "bench/vamp_bench/report.h"
#include "bench/vamp_bench/system.h"

namespace vamp::bench {

// A named set of controller flags. Built-in names:
//   static       --arbiter=static --max_offload_ratio=0 (the vLLM 0.15 baseline: no staging
//                buffers, the whole budget for weights and KV)
//   vamp         --arbiter=vamp with the shipped defaults (tax cost model, default cap)
//   vamp-R       VAMP with the cap VAMP-R: --max_offload_ratio=R/100 (R in 1..95)
//   paper, paper-R  the paper's cost model (--vamp_cost_model=paper), default cap or VAMP-R
//   NAME:FLAGS   any other: NAME with the whitespace-separated FLAGS
struct AbConfig {
  std::string name;
  std::vector<std::string> flags;
};
// InvalidArgument naming the spec for an unknown name or a bad cap.
absl::StatusOr<AbConfig> ParseAbConfig(absl::string_view spec);
// Comma-separated specs (a NAME:FLAGS spec cannot contain commas).
absl::StatusOr<std::vector<AbConfig>> ParseAbConfigs(absl::string_view specs);

// Runs `workload` against `endpoint`, sampling its metrics meanwhile, and computes the run's
// statistics by `rule`.
absl::StatusOr<RunResult> MeasureRun(const workload::Workload& workload,
                                     const ClientOptions& client, const WindowRule& rule,
                                     double sample_interval_s);

struct AbOptions {
  SystemOptions system;
  std::vector<AbConfig> configs;
  std::vector<int32_t> sessions;  // the sweep; one run set per value
  int32_t repeats = 1;
  ClientOptions client;  // endpoint is filled in per run
  WindowRule rule;
  double sample_interval_s = 1.0;
  std::string log_dir;  // controller logs go here as <config>-s<sessions>-r<repeat>.log
  // false: a fresh system for every run (no run inherits another's cache or offload state).
  // true: one system per configuration serves all its runs (for systems that take minutes to
  // start, e.g. 30B models on GPUs); make_workload then gets a distinct `run` index per run so
  // that no prompt prefix carries over from one run to the next.
  bool one_system_per_config = false;
  // Called after each run (for progress and partial reports).
  std::function<void(const RunResult&)> on_run;
};

// Runs every (sessions, repeat, configuration): by default in that order, with a fresh system
// each; with one_system_per_config, configuration by configuration. A run whose system does not
// start gets a RunResult with `error` set; the sweep goes on. `make_workload(sessions, run)`
// must give every configuration the same workload for the same arguments; `run` counts the
// (sessions, repeat) points from 0.
absl::StatusOr<std::vector<RunResult>> RunAb(
    const AbOptions& options,
    const std::function<absl::StatusOr<workload::Workload>(int32_t sessions, int32_t run)>&
        make_workload);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_AB_H_
