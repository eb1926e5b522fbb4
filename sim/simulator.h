// vamp-sim's engine: one workload under one memory policy, in virtual time. The real controller
// core (Scheduler, KvBlockPool, the static or vamp arbiter) plans every step; simulated agents
// "execute" it by advancing a ManualClock by the StepTimeModel's estimate for the batch and the
// current residency boundary (plus remap time when the pool changed), and answer with
// deterministic tokens. Turns are issued by the rules of bench/workload/workload.h.
//
// Deterministic: the same workload, policy and options give the same result, whatever thread
// runs it.
#ifndef VAMP_SIM_SIMULATOR_H_
#define VAMP_SIM_SIMULATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/workload/workload.h"
#include "controller/arbiter/decision_log.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/scheduler_config.h"
#include "controller/core/scheduler_stats.h"
#include "sim/calibration.h"
#include "sim/offload_geometry.h"
#include "sim/sim_offloader.h"
#include "sim/step_time_model.h"

namespace vamp::sim {

// One memory policy.
struct PolicySpec {
  std::string label;               // as given: "static", "vamp-15", "vamp-25+restore"
  std::string arbiter = "static";  // "static" | "vamp"
  OffloadCap offload_cap;          // VAMP-r
  VampArbiterConfig vamp;
};

// "static", or "vamp-<r>" with r the offload cap in percent (0 <= r <= 100) under the arbiter
// configuration `vamp` (by default the tax model with restore and self-calibration), optionally
// followed by "+paper" (the paper's cost model without restore or self-calibration) and then
// "+restore"/"+norestore", "+calib"/"+nocalib" to switch those on or off.
absl::StatusOr<PolicySpec> ParsePolicy(absl::string_view label, const VampArbiterConfig& vamp);

struct SimOptions {
  Calibration calibration;
  // What a staged step copies (step_time_model.h): the whole offloaded region, the engine's
  // routed staging for steps of at most routed_staging_max_tokens tokens, or the prefetch
  // what-if of issue 18.
  // The defaults are the engine's (CudaForwardOptions::routed_staging_max_tokens).
  StagingMode staging = StagingMode::kRouted;
  int64_t routed_staging_max_tokens = 16;
  // Models with recurrent state: KV blocks one snapshot of it takes in the pool. -1 = what the
  // engine stores today (the state's bytes over the KV block's); a smaller value is the what-if
  // of keeping snapshots elsewhere (pinned host memory), with the same hit points.
  int32_t snapshot_blocks = -1;
  // num_blocks is ignored: the baseline pool comes from `offload.base_kv_bytes`.
  SchedulerConfig scheduler;
  // cap is ignored: it comes from the policy.
  OffloadOptions offload;
  RemapCosts remap;
  // Leave each session's turn 0 out of the TTFT figures (the paper's steady-state rule).
  bool exclude_first_turn = false;
  // Stop at this virtual time (s; 0 = when every turn is done). Unfinished turns are dropped.
  double max_time_s = 0;
  // Resolution of the pool/offload time series (virtual s).
  double sample_interval_s = 5;
  // Seed of the simulated agents' sampled tokens.
  uint64_t seed = 1;
  // Arbiter records kept for SimResult::recent_decisions (the newest ones).
  size_t decision_log_capacity = 256;
  // Non-empty: progress lines on stderr, prefixed with this label, every progress_interval_s of
  // wall time.
  std::string progress_label;
  double progress_interval_s = 5;
};

struct TimeSample {
  double t_s = 0;
  int32_t num_blocks = 0;
  int32_t num_snapshot_blocks = 0;  // holding recurrent-state snapshots (models with them)
  double offload_ratio = 0;  // offloaded experts / E, per eligible layer
  double kv_usage = 0;
  int32_t running = 0;
  int32_t waiting = 0;
  double hit_rate = 0;  // cumulative
};

// One completed turn.
struct TurnRecord {
  uint32_t session = 0;
  uint32_t turn = 0;
  double arrival_s = 0;
  double ttft_s = 0;
  double tpot_ms = -1;  // -1 with fewer than two outputs
  double finish_s = 0;
  int32_t output_tokens = 0;
};

struct SimResult {
  std::string policy;
  std::string workload;
  std::vector<TurnRecord> turn_records;  // in completion order
  std::vector<int32_t> turns_per_session;  // the workload's, for the measurement window

  // Latency, seconds / milliseconds.
  std::vector<double> ttft_s;   // turns counted (see exclude_first_turn), in completion order
  std::vector<double> tpot_ms;  // per turn with at least two outputs
  int64_t turns_total = 0;
  int64_t turns_issued = 0;
  int64_t turns_completed = 0;
  int64_t turns_rejected = 0;  // the scheduler refused them (e.g. longer than max_model_len)
  int64_t output_tokens = 0;
  double first_arrival_s = 0;
  double last_finish_s = 0;
  double end_s = 0;  // virtual time when the run stopped

  SchedulerCounters counters;
  std::map<std::string, int64_t> decisions;        // arbiter records by choice
  std::vector<DecisionLogEntry> recent_decisions;  // the newest, oldest first
  // Scores of §VI-D: the eviction and offload costs logged with decisions that chose eviction,
  // and with those that chose to offload (ms; only where both were evaluated).
  std::vector<double> evict_choice_cc_ms, evict_choice_ce_ms;
  std::vector<double> offload_choice_cc_ms, offload_choice_ce_ms;
  std::vector<TimeSample> series;

  OffloadGeometry geometry;
  int32_t base_blocks = 0;
  int32_t max_blocks = 0;
  int32_t max_groups = 0;
  int64_t steps = 0;
  double busy_s = 0;          // sum of step times
  double exposed_copy_s = 0;  // staging not hidden by compute
  double remap_s = 0;
  double wall_s = 0;
  std::optional<LiveCoefficients> live;  // vamp only, at the end
  bool stalled = false;                  // stopped because nothing could make progress

  double RequestThroughput() const;  // completed turns / (last finish − first arrival)
  double OutputTokensPerSecond() const;
  double MeanTpotMs() const;
  double MeanQueueSeconds() const;
};

// Linear interpolation between closest ranks (numpy's default); 0 for an empty sample.
double Percentile(std::vector<double> values, double p);
double Median(std::vector<double> values);

absl::StatusOr<SimResult> Simulate(const workload::Workload& workload, const PolicySpec& policy,
                                   const SimOptions& options);

}  // namespace vamp::sim

#endif  // VAMP_SIM_SIMULATOR_H_
