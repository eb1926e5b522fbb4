// The cost-model memory arbiter ("vamp"). Two cost models:
//
// "tax" (the default; shared/DESIGN.md, "Beyond the paper"): offloading g expert groups is a tax
// paid on every step for as long as they stay offloaded — the staging stall OffloadTax measures —
// and extra KV is worth what it would actually have saved, measured by the ReuseTracker (ghost
// list of evicted hashes, LRU depths of hits, preemptions). Both are summed over the same window
// of recent scheduler time (window_micros), in µs of GPU time; each stalls the whole batch, so
// the batch size cancels out. At a gap of n blocks with G groups offloaded:
//   value(g) = TokensBetween(G, G+g) · t_prefill        tax(g) = Tax(G+g) − Tax(G)
//   1. the best whole offload step g (up to the cap) by value(g) − (1+margin)·tax(g): when that
//      is positive, offload g and evict whatever of the gap g does not cover;
//   2. else evict n cached free blocks when there are that many: reuse nobody measured is free;
//   3. else (a running requester) preempt, unless offloading the fewest steps that cover the gap
//      costs less than the preemption over the window: (1+margin)·tax(g) − value(g) < C_p, with
//      C_p = Σ (t_sched + n_partial·t_prefill) in GPU time (no t_queue: waiting is not work);
//      (With no other victims that cover the gap, C_p is that of the newest running request.
//      Steps 1 and 3 need min_evidence_steps executed steps in the window: no measurement, no
//      offload.)
//   4. else what still makes progress (the static arbiter's plan), or wait.
//   A restore pending when a gap arrives is treated as step 1-3's offload, with cancel_restore
//   instead of a remap. With restore on, every restore.check_interval_steps (and no sooner than
//   restore.min_hold_steps after an offload) the arbiter gives back the whole number of
//   restore steps (restore.step_groups) whose tax over the window exceeds (1+margin) times the
//   value they served there (hits a smaller pool would have lost) by the most: the hysteresis
//   band is the margin on both sides. It gives back more when the working set (blocks in use or
//   used within the measured reuse age; RestoreConfig) fits a smaller pool with headroom.
//   A restore completes when the running requests holding blocks of the withdrawn tail release
//   them; under a large offload each of their steps is slow, so waiting can keep the whole tax
//   for minutes. PreemptForRestore preempts the decoding holders (never one still in prefill,
//   whose first token is on the line) that would finish last when the tax
//   their remaining steps (output budget, at most restore.benefit_horizon_steps) keep exceeds
//   (1 + margin) times their recompute from the first withdrawn block (in GPU time, weighted like
//   a first-token prefill only while requests wait for admission: it queues ahead of them).
//
// "paper" (reproduces §IV-B of the paper; the "vamp" policy of the earlier releases): covers each
// KV allocation gap with the cheapest feasible plan among cached-block eviction (C_c), expert
// offload (C_e), preemption (C_p) and offload-then-evict (C_b) — cost_model.h has the formulas.
//
// Plans, for a gap of `gap` blocks (blocks_per_group = what one expert group adds):
//   evict      the gap's worth of least recently used cached free blocks; feasible when that many
//              exist.
//   offload    the fewest whole offload steps (offload_step_groups, 4 by default) that cover
//              the gap, capped by the groups left under the offload limit; feasible when the
//              groups left cover the gap.
//   offload+evict  offload as far as possible without overshooting the gap (whole steps), or all
//              groups left when the limit binds, and evict the rest; feasible when the cached free
//              blocks cover the rest.
//   preempt    running requests other than the requester, in the policy's preemption order (the
//              newest first under FCFS), until the uncached blocks they free cover the gap; only
//              for a running requester (a waiting one waits, as in vLLM).
// Ties go to the first in that order. When none is feasible the arbiter falls back to what still
// makes progress: offloading whatever groups are left, else the static arbiter's plan (evict what
// is cached, preempt the newest running request — the requester itself if it is the newest).
//
// Learned inputs:
//   r_hit    prefix-cache hit rate over the latest `hit_rate_window_requests` admissions (vLLM
//            reports its hit rate over a window of recent requests as well).
//   t_queue  starts at the configured value, then an exponentially weighted mean of the observed
//            preemption → reschedule delays.
//   t_prefill, c_eff  (self_calibration.enabled, beyond the paper) exponentially weighted
//            estimates from ObserveStep: t_prefill from prefill-heavy steps' time per token,
//            c_eff from decode steps' exposed staging time per offloaded shard.
//
// Paper-model restore (restore.enabled, beyond the paper, which never gives experts back). Cold
// blocks — cached free blocks idle for at least restore.cold_age_steps — count as idle capacity. A
// gap that the cold blocks at the LRU end cover is evicted from them (not offloaded for) and is no
// sign of pressure; any other gap is. A restore of restore.step_groups groups is considered when
// there has been no pressure for restore.quiet_steps steps (and no restore for
// restore.check_interval_steps), and the idle capacity (uncached free + cold blocks) exceeds
// (1 + restore.headroom) times what it takes out of the pool. The two thresholds form the
// hysteresis band: the pool grows only when idle capacity is gone, and shrinks only while plenty
// of it remains after the shrink. (A full pool of cached blocks gaps on every allocation, so "no
// gap" would never hold; "no pressure" does.) The restore is then priced with the cost model: it
// takes the pool's highest block ids whatever they hold, so it costs C_c of the cached free
// blocks there and, for a running request holding a tail block, of every block from there to the
// end of its table (a prefix match stops at the first missing block); it saves g·groups·c_eff per
// step, counted over restore.benefit_horizon_steps. The arbiter asks for the groups back when the
// saving is larger. Pressure while a restore is pending cancels it (ArbiterPlan::cancel_restore)
// before anything else is priced.
//
// Not thread-safe: the scheduler's thread calls everything.
#ifndef VAMP_CONTROLLER_ARBITER_VAMP_ARBITER_H_
#define VAMP_CONTROLLER_ARBITER_VAMP_ARBITER_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "controller/arbiter/cost_model.h"
#include "controller/arbiter/offload_tax.h"
#include "controller/core/memory_arbiter.h"

namespace vamp {

struct RestoreConfig {
  bool enabled = true;
  // Tax model: steps after an offload before a restore may be considered. 128: at 512 the
  // mixed workload's high phase paid TPOT 25.6 ms instead of 21.0 (steps under a large offload
  // are slow, so 512 of them are minutes); 0 let the Figure 9 run at c = 28 give its memory back
  // too early (TTFT p99 46 s instead of 12).
  int32_t min_hold_steps = 128;
  // Steps without pressure (a gap the cold blocks could not cover) before a restore may start.
  int32_t quiet_steps = 200;
  // Groups one restore gives back (0 = the offload step).
  int32_t step_groups = 0;
  // Cached free blocks idle this long count as idle capacity. Longer than the think time of a
  // live session in steps, so that sessions between turns keep their context.
  int64_t cold_age_steps = 1000;
  // Idle capacity must exceed (1 + headroom) × the blocks a restore takes.
  double headroom = 1.0;
  // Steps over which a restore's saving (its shards' staging, c_eff per shard and step) is
  // counted against its cost (the warm blocks it takes out of the cache).
  int32_t benefit_horizon_steps = 1000;
  // Steps between two restores, and after a check that found too little idle capacity before
  // the next (counting cold blocks walks the LRU queue).
  int32_t check_interval_steps = 20;
  // Tax model, working-set rule: the working set is the blocks in use plus the cached free blocks
  // used within the reuse age that covers working_set_quantile of the window's cache hits (at
  // least working_set_min_age_steps); while it fits a pool smaller by whole restore steps with
  // working_set_headroom to spare, those groups go back (and the window forgets the demand
  // that needed them). Without it the memory of a finished high-reuse phase stayed offloaded
  // until its evidence aged out of the window (minutes).
  double working_set_quantile = 0.99;
  int64_t working_set_min_age_steps = 64;
  double working_set_headroom = 0.25;
  // Tax model: preempt decoding requests that hold blocks a pending restore waits for, when the
  // tax the wait keeps exceeds (1 + margin) × their recompute (weighted like a prefill on the
  // first-token path while requests wait for admission). See PreemptForRestore.
  bool preempt_holders = true;
};

struct SelfCalibrationConfig {
  bool enabled = true;
  // Weight of a new observation in the exponentially weighted estimates.
  double ewma_weight = 0.05;
  // Observations before an estimate replaces the configured coefficient.
  int32_t min_samples = 16;
  // Steps with at least this many prefill tokens feed t_prefill.
  int64_t min_prefill_tokens = 1024;
  // Steps with at most this many prefill tokens (decode steps) feed c_eff.
  int64_t max_decode_step_prefill_tokens = 0;
};

enum class VampCostModel { kTax, kPaper };
absl::string_view VampCostModelName(VampCostModel model);

// The tax model's settings (cost model "tax").
struct TaxModelConfig {
  // Scheduler time the tax and the value of extra KV are summed over (µs), and slots of that
  // window. In time, not steps: under a large offload steps are slow, and a window of 1,024 steps
  // kept a finished phase's evidence for minutes. 180 s by measurement against 30-120 s
  // (bench/results/2026-12-01-tax-model.md).
  int64_t window_micros = 180'000'000;
  int32_t window_slots = 16;
  // Host→device bandwidth the tax starts from (bytes/s); learned from copy-bound steps with
  // self-calibration.
  double h2d_bytes_per_s = 55.5e9;
  // The same for routed staging's copies (small steps copy only the experts they route to, from
  // the SMs over PCIe, not hidden behind compute): 50 GB/s, what the H200's decode steps of 1 to
  // 16 tokens reached over their measured exposed time at VAMP-15/25 (47.6-51.1 GB/s,
  // bench/results/2026-12-02-routed-staging.md).
  double routed_h2d_bytes_per_s = 50e9;
  // Share of a step's compute that staging copies hide behind.
  double overlap_fraction = 0.9;
  // Hysteresis: offload when value > (1 + margin) · tax; restore when tax > (1 + margin) · value.
  double margin = 0.25;
  // µs of staging stall (paid on every step, i.e. on TPOT) worth one µs of prefill saved (paid on
  // the first-token path), while TTFT hurts (see ttft_queue_threshold_micros). 1 compares GPU
  // time alone; larger values favour TTFT, which is what the prefix-cache cliff costs users.
  // 16 by measurement (bench/results/2026-12-01-tax-model.md): with the working-set restore
  // (RestoreConfig), 16 against 8 lowers the Figure 9 sweep's TTFT p99 at c = 28 from 12.4 to
  // 8.7 s (static 54.5 s) and at c = 16 from 18.2 to 6.3 s, at TPOT within 2 %, and costs at
  // most +4 % TPOT on the Mooncake trace (before that restore rule, 16 cost +55 % there); 4 gave
  // up most of the multi-turn gain.
  double ttft_weight = 16.0;
  // Weight of the time requests spent waiting for KV memory (request-µs: the head of the queue
  // blocked for a gap, times the requests queued) that a larger pool would have saved. Off: at 1
  // the Figure 9 sweep's TTFT p99 at c = 28 improves (22.0 -> 12.3 s) but the LMCache miniswe
  // trace pays +10 % TPOT and -14 % throughput (bench/results/2026-12-01-tax-model.md).
  double memory_wait_weight = 0.0;
  // The TTFT weight applies while admissions waited about this long on average (µs) over the
  // window (fully above it with ttft_weight_ramp off; phased in around it with the ramp), and no
  // more than compute_bound_share of its steps left requests queued for compute.
  double ttft_queue_threshold_micros = 1e6;
  // When > 1, the weight does not switch at the threshold but grows with the mean admission wait
  // q, linearly in log q, from 1 at threshold / ramp to ttft_weight at threshold x ramp: a wait
  // that hovers at the threshold no longer flips the value of the same groups by ttft_weight
  // times between two decisions, so the margin keeps its hysteresis. 0 or 1: a step at the
  // threshold. 4 by measurement (vamp-sim, bench/results/2026-12-04-ttft-weight-ramp/): against
  // the step, Q geomean VAMP-10/15/25 1.284/1.327/1.294 -> 1.307/1.340/1.314 and the worst row
  // 0.673 -> 0.801 (held out 1.284/1.309/1.280 -> 1.296/1.323/1.310), the LMCache magagent
  // trace's TTFT p99 x1.11 -> x0.41 static (it offloaded and restored 10 times, now 2); the
  // cost is TPOT on the cliff rows (Figure 9 at c = 28: TTFT p99 x0.47 -> x0.60, TPOT x1.20 ->
  // x1.25). A ramp of 2 left a held-out magagent row at TTFT p99 x1.79.
  double ttft_weight_ramp = 4.0;
  double compute_bound_share = 0.25;
  // Above this mean admission wait (µs) the TTFT weight no longer applies: a queue whose requests
  // wait longer than the evidence window is not draining, so its first tokens wait on
  // throughput, which GPU time alone (weight 1) measures; extra KV must then pay its tax in the
  // prefill it saves. 0: no bound. 180 s, the window, by measurement (vamp-sim,
  // bench/results/2026-12-04-ttft-max-queue/): the Mooncake trace on one H200 at 1x-4x its
  // recorded rate queues for 700-1,800 s; there the weight bought offloads that cost TPOT x1.06
  // for TTFT p99 x1.02-1.05, and now VAMP-25 equals static (rows over 5 % worse: 18 -> 14, held
  // out 8 -> 6); no other row moves.
  double ttft_max_queue_micros = 180e6;
  // When > 0, the TTFT weight buys at most this much TPOT: it applies to a move only while the
  // larger of its two offload levels adds no more than this share of the window's compute time
  // in staging stall; beyond it, extra KV must pay its tax in GPU time alone (weight 1). 0: no
  // bound. Off by measurement (bench/results/2026-12-03-ttft-tpot-budget/): at 0.1 every
  // Mooncake row and all but one held-out row stay within 5 % of static, but Figure 9's TTFT p99
  // at c = 28 falls from 0.37x static to 0.63x, and LMCache magagent's TTFT p99 goes to 1.48x;
  // for operators whose TPOT SLO outranks TTFT.
  double ttft_tpot_budget = 0;
  // Executed steps the window must hold before measured value may justify an offload or a
  // restore (a handful of steps says little about either).
  int64_t min_evidence_steps = 256;
};

struct VampArbiterConfig {
  VampCostModel cost_model = VampCostModel::kTax;
  TaxModelConfig tax;
  CostCoefficients costs;
  // Groups per offload step (the pool grows by whole steps; the last one may be smaller at the
  // offload limit).
  int32_t offload_step_groups = 4;
  // Admissions the observed hit rate is computed over (0 = since start).
  int32_t hit_rate_window_requests = 1000;
  // Weight of a new observation in t_queue's exponentially weighted mean (1 = latest only).
  double t_queue_ewma_weight = 0.5;
  RestoreConfig restore;
  SelfCalibrationConfig self_calibration;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Declares every field (prefixed "vamp_") with the defaults above; reads them back, validated.
void AddVampArbiterConfigFields(ConfigSchema& schema);
absl::StatusOr<VampArbiterConfig> VampArbiterConfigFromConfig(const Config& config);

// What the engine measured for one step, for the tax model and self-calibration.
struct StepTiming {
  double step_micros = 0;                   // the step as the slowest rank ran it
  double exposed_staging_micros = 0;        // of which waiting for expert staging copies
  int64_t prefill_tokens = 0;               // tokens of sequences still in prefill
  int64_t decode_tokens = 0;                // one per decoding sequence
  int32_t offloaded_experts_per_layer = 0;  // experts above the residency boundary
  int64_t end_micros = 0;                   // scheduler clock when the step's output arrived
  int64_t staged_bytes = 0;                 // host→device expert bytes copied (slowest rank)
  double staged_share = 1;                  // share of each offloaded group copied (StepCost)
  bool routed_staging = false;              // copies on the compute path only (StepCost)
};

// The coefficients the arbiter prices with now (learned values where it has them).
struct LiveCoefficients {
  double hit_rate = 0;
  double t_queue_micros = 0;
  double t_prefill_micros = 0;
  double c_eff_micros = 0;
  int64_t t_prefill_samples = 0;
  int64_t c_eff_samples = 0;
  int64_t t_queue_samples = 0;
  double h2d_bytes_per_s = 0;  // tax model: the bandwidth the tax is priced at
  int64_t h2d_samples = 0;
  double routed_h2d_bytes_per_s = 0;  // the same for routed staging's copies
  int64_t routed_h2d_samples = 0;
};

class VampArbiter final : public MemoryArbiter {
 public:
  // `config` must be valid (Validate).
  explicit VampArbiter(const VampArbiterConfig& config);

  absl::string_view name() const override { return "vamp"; }
  ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) override;
  int32_t OnStepBoundary(const ArbiterContext& context) override;
  ArbiterPlan PreemptForRestore(const ArbiterContext& context) override;
  TaxComparison LastRestoreComparison() const override { return last_restore_; }
  ReuseTracker* reuse_tracker() override { return reuse_.get(); }
  // False while the window's steps left requests queued for compute more often than
  // vamp_compute_bound_share (the test TtftWeight uses).
  bool ConcurrencyPays(int64_t now_micros) const override;
  // The share of tax.ttft_weight (0..1) that a mean admission wait of that many µs earns: 0 or 1
  // at the threshold, or the ramp of tax.ttft_weight_ramp.
  double QueueShare(double mean_queue_micros) const;

  // Feeds self-calibration (ignored unless enabled). Call once per executed step.
  void ObserveStep(const StepTiming& timing);

  LiveCoefficients live() const;
  const VampArbiterConfig& config() const { return config_; }
  // Replaces the configuration at a step boundary (the owner's thread): new coefficients,
  // offload step and restore settings. Learned values (t_queue, calibration) are kept.
  // InvalidArgument naming the field when `config` does not Validate.
  absl::Status Reconfigure(const VampArbiterConfig& config);

 private:
  // Follows the scheduler's cumulative counters: hit-rate window and t_queue.
  void Observe(const SchedulerCounters& counters);
  CostCoefficients Current() const;
  ArbiterPlan DecidePaper(const ArbiterContext& context, const MemoryGap& gap);
  ArbiterPlan DecideTax(const ArbiterContext& context, const MemoryGap& gap);
  int32_t RestorePaper(const ArbiterContext& context);
  int32_t RestoreTax(const ArbiterContext& context);
  // Both sides of moving from `from` to `to` offloaded groups over the window ending at `now`:
  // value = tokens served between the two sizes × t_prefill, tax = the difference in staging.
  TaxComparison Compare(int64_t step, int32_t from, int32_t to, double t_prefill) const;
  // µs of prefill on the first-token path per µs of GPU time now: tax.ttft_weight while first
  // tokens wait for memory (for a restore: while they wait at all), else 1.
  double TtftWeight(int64_t now, bool for_restore = false) const;

  struct HitSnapshot {
    int64_t requests;
    int64_t query_tokens;
    int64_t hit_tokens;
  };

  VampArbiterConfig config_;
  // Hit-rate window: snapshots of the cumulative counters, oldest first; the front is the latest
  // one at least a window older than the newest.
  std::deque<HitSnapshot> hit_snapshots_;
  double hit_rate_ = 0;
  double t_queue_micros_;
  int64_t t_queue_samples_ = 0;
  int64_t seen_resumed_ = 0;
  int64_t seen_resume_delay_micros_ = 0;
  double t_prefill_estimate_ = 0;
  int64_t t_prefill_samples_ = 0;
  double c_eff_estimate_ = 0;
  int64_t c_eff_samples_ = 0;
  int64_t last_pressure_step_ = 0;
  int64_t last_restore_step_ = 0;
  int64_t next_restore_check_step_ = 0;
  int64_t next_evacuation_check_step_ = 0;
  // Tax model (null under the paper model).
  std::unique_ptr<ReuseTracker> reuse_;
  std::unique_ptr<OffloadTax> tax_;
  int64_t last_offload_step_ = -1;
  TaxComparison last_restore_;
};

// "static" or "vamp" (the latter configured by `vamp`); InvalidArgument for anything else.
absl::StatusOr<std::unique_ptr<MemoryArbiter>> CreateArbiter(absl::string_view name,
                                                             const VampArbiterConfig& vamp);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_ARBITER_VAMP_ARBITER_H_
