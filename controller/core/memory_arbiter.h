// The memory arbiter: what to do when an allocation needs more uncached free KV blocks than exist.
//
// The scheduler computes the gap (uncached free blocks missing) and asks the arbiter for a plan.
// A plan may combine three actions, applied in this order:
//   1. offload: move expert groups out of the expert region into the KV pool (ExpertOffloader),
//   2. evict cached free blocks in LRU order,
//   3. preempt running requests (recompute later).
// While a restore is pending (offload().restore_pending), a plan may instead cancel it
// (cancel_restore), which returns the withdrawn blocks to the pool; offloading is unavailable
// until the restore is committed or cancelled.
// After applying a plan the scheduler recomputes the gap and asks again while it is positive and
// the previous plan made progress, so an arbiter may cover a gap in several rounds (the static
// arbiter preempts one request per round, as vLLM does). An empty plan means "no way now": a
// running requester is not scheduled this step, a waiting one stays waiting.
//
// Besides covering gaps, an arbiter may give memory back: at every step boundary the scheduler
// calls OnStepBoundary, and a positive answer starts a restore (expert groups go back from the KV
// pool to the experts; see Scheduler). The paper's VAMP never restores; the cost-model arbiter
// does so behind a flag.
//
// Implementations: StaticArbiter (vLLM 0.15 baseline, here) and VampArbiter (controller/arbiter/).
// Arbiters only read: everything they see is const.
#ifndef VAMP_CONTROLLER_CORE_MEMORY_ARBITER_H_
#define VAMP_CONTROLLER_CORE_MEMORY_ARBITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/core/expert_offloader.h"
#include "controller/core/kv_block_pool.h"
#include "controller/core/request.h"
#include "controller/core/reuse_tracker.h"
#include "controller/core/scheduler_config.h"
#include "controller/core/scheduler_stats.h"

namespace vamp {

// The shortfall the arbiter is asked to cover.
struct MemoryGap {
  int32_t blocks = 0;  // uncached free blocks missing (> 0)
  // The request that needs them: running (its next chunk or decode token) or waiting (admission).
  const Request* requester = nullptr;
  bool requester_running = false;
  int32_t num_new_tokens = 0;  // tokens the requester wants to compute this step
};

// Decision-log figures of a cost-model arbiter, in µs of estimated future cost (negative = not
// evaluated). The static arbiter leaves them unset.
struct ArbiterCosts {
  double evict_micros = -1;
  double offload_micros = -1;
  double preempt_micros = -1;
  double combined_micros = -1;
};

// The inputs a cost-model arbiter priced its plans with, for the decision log (the static arbiter
// leaves them at their defaults).
struct ArbiterInputs {
  double hit_rate = 0;        // r_hit: observed prefix-cache hit rate, 0..1
  int32_t horizon_steps = 0;  // w: decode steps the offload cost is counted over
  int32_t free_cached_blocks = 0;
  int32_t remaining_groups = 0;  // expert groups that could still move into the pool
  int32_t blocks_per_group = 0;
  int32_t victims = 0;          // G: running requests a preemption plan needs (0 = infeasible)
  double t_prefill_micros = 0;  // per token
  double c_eff_micros = 0;      // per offloaded expert shard per step
  double t_queue_micros = 0;    // preemption → reschedule delay
};

// Both sides of the tax model's comparison (the vamp arbiter's cost model "tax"), summed over the
// arbiter's window of recent steps, for the decision log.
struct TaxComparison {
  bool evaluated = false;
  // The boundary move priced: groups to offload (> 0) or to give back (< 0).
  int32_t groups = 0;
  // Exposed staging those groups would have cost (offload) or did cost (restore), µs.
  double tax_micros = 0;
  // Prefill work the extra KV would have saved (offload) or that giving it back would lose
  // (restore): tokens × t_prefill, µs, plus (offload against a preemption) the preemption's cost.
  double value_micros = 0;
  double ghost_tokens = 0;    // prefix tokens found in the ghost list over the window
  double preempt_tokens = 0;  // tokens recomputed after preemptions over the window
  int64_t window_micros = 0;
  int64_t observed_steps = 0;         // executed steps in the window (the sums cover these)
  double h2d_bytes_per_s = 0;         // the bandwidth the tax was priced at
  double routed_h2d_bytes_per_s = 0;  // the same for routed staging's copies
  // The weight the value's prefill tokens carried (1 up to the TTFT weight as first tokens wait
  // longer for memory) and the evidence it was chosen on: the window's mean queue time of first
  // admissions (µs) and the share of its steps that left requests queued for compute.
  double ttft_weight = 1;
  // Share of the window's compute time the larger offload level of the move adds in staging
  // stall; the TTFT weight applies only within the TPOT budget (vamp_ttft_tpot_budget).
  double tpot_overhead = 0;
  double mean_queue_micros = 0;
  double compute_bound_share = 0;
  // Restores: the working set (blocks) and the reuse age (steps) that bounded it; -1 otherwise.
  int64_t working_set_blocks = -1;
  int64_t reuse_age_steps = -1;
};

struct ArbiterPlan {
  // Give the blocks withdrawn for a pending restore back to the pool first (pressure is back).
  bool cancel_restore = false;
  int32_t offload_groups = 0;      // expert groups to move into the KV pool
  int32_t evict_blocks = 0;        // cached free blocks to evict, least recently used first
  std::vector<RequestId> preempt;  // running requests to preempt, in this order
  // Short name of the choice for logs and metrics, e.g. "evict", "preempt", "offload+evict".
  std::string choice;
  ArbiterCosts costs;
  ArbiterInputs inputs;
  TaxComparison tax;

  bool empty() const {
    return !cancel_restore && offload_groups == 0 && evict_blocks == 0 && preempt.empty();
  }
};

// One arbiter call as the scheduler recorded it: a gap it was asked to cover, or a restore it
// started (gap_blocks 0, restore_groups > 0, plan.choice "restore").
struct ArbiterRecord {
  int64_t step = 0;
  RequestId requester = 0;
  bool requester_running = false;
  int32_t gap_blocks = 0;
  int32_t restore_groups = 0;
  // Preemptions that let a pending restore complete (MemoryArbiter::PreemptForRestore): no gap;
  // plan.tax holds the tax the wait would have kept (tax) against the recompute (value).
  bool for_restore = false;
  ArbiterPlan plan;  // for a restore: choice "restore" and the comparison that started it
  // What applying the plan achieved.
  int32_t blocks_added = 0;
  int32_t blocks_evicted = 0;
  int32_t requests_preempted = 0;
};

// What the arbiter sees of expert offloading (ExpertOffloader, expert_offloader.h) at a decision.
struct OffloadState {
  bool available = false;  // an offloader exists and the pool is not shrinking
  int32_t remaining_groups = 0;
  int32_t blocks_per_group = 0;
  int32_t experts_per_group = 1;       // g
  int32_t experts_per_layer = 0;       // E (0 = unknown)
  int32_t offloaded_groups = 0;        // groups in the pool now (what a restore could give back)
  int32_t max_groups = 0;              // the cap: offloaded + remaining when nothing is pending
  int64_t staged_bytes_per_group = 0;  // ExpertOffloader::StagedBytesPerGroup
  bool restore_pending = false;        // a restore is waiting for its blocks to be released
  int32_t restore_pending_groups = 0;  // ... and the groups it gives back
};

// Read-only view of the scheduler for an arbiter call.
class ArbiterContext {
 public:
  ArbiterContext(const KvBlockPool& pool, const std::vector<Request*>& running,
                 const SchedulerCounters& counters, const SchedulerConfig& config, int64_t step,
                 int64_t now_micros, OffloadState offload, int32_t num_waiting)
      : pool_(pool),
        running_(running),
        counters_(counters),
        config_(config),
        step_(step),
        now_micros_(now_micros),
        offload_(offload),
        num_waiting_(num_waiting) {}

  // Block states, free counts, and cached free blocks in eviction order with their ages
  // (step() - last_used_step) via pool().ForEachCachedFree.
  const KvBlockPool& pool() const { return pool_; }
  // Running requests in admission order (oldest first). Each exposes its remaining output budget
  // (RemainingOutputBudget), prefill progress (num_computed_tokens / num_tokens), blocks and
  // priority.
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  const Request& running(int32_t i) const { return *running_[i]; }
  // Cumulative counters: prefix-cache hit rate, preemptions, observed resume delays.
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerConfig& config() const { return config_; }
  int64_t step() const { return step_; }
  // The scheduler's clock (µs; virtual in vamp-sim).
  int64_t now_micros() const { return now_micros_; }
  const OffloadState& offload() const { return offload_; }
  // Requests in the waiting queue now (new and preempted): whatever a recompute queues ahead of.
  int32_t num_waiting() const { return num_waiting_; }

 private:
  const KvBlockPool& pool_;
  const std::vector<Request*>& running_;
  const SchedulerCounters& counters_;
  const SchedulerConfig& config_;
  int64_t step_;
  int64_t now_micros_;
  OffloadState offload_;
  int32_t num_waiting_;
};

class MemoryArbiter {
 public:
  virtual ~MemoryArbiter() = default;
  // "static", "vamp", ...
  virtual absl::string_view name() const = 0;
  virtual ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) = 0;
  // Called at the start of every Schedule() (a step boundary), before anything is planned, so that
  // an arbiter can follow the scheduler's counters over time. Returns how many expert groups to
  // give back to the experts now (0 = none); the scheduler acts on it only when groups are
  // offloaded (context.offload().offloaded_groups > 0) and no restore or shrink is pending.
  // An arbiter that starts restores should cancel them (ArbiterPlan::cancel_restore) when a gap
  // shows that the memory is needed.
  virtual int32_t OnStepBoundary(const ArbiterContext& context) { return 0; }
  // While a restore waits for running requests to release blocks of the withdrawn tail (ids >=
  // context.pool().shrink_begin()), called at every step boundary: the running requests to
  // preempt now so that the restore completes sooner (ArbiterPlan::preempt, with the comparison
  // behind it in ArbiterPlan::tax). Default: none, the restore waits for them to finish.
  virtual ArbiterPlan PreemptForRestore(const ArbiterContext& context) { return {}; }
  // The comparison behind the latest positive OnStepBoundary answer (for the decision log).
  virtual TaxComparison LastRestoreComparison() const { return {}; }
  // An arbiter that prices extra KV by measured reuse returns its tracker; the scheduler then
  // feeds it evictions, admissions and preemptions (reuse_tracker.h). Null: nothing is tracked
  // (the static arbiter pays nothing for it).
  virtual ReuseTracker* reuse_tracker() { return nullptr; }
  // Whether requests admitted now may hold more KV than the pool without the offloaded groups
  // (SchedulerConfig::admit_within_baseline asks it before each step's admissions): false where
  // more running requests would only share a compute-bound GPU, slowing every request's decoding
  // for no more tokens per second. Default: always.
  virtual bool ConcurrencyPays(int64_t now_micros) const { return true; }
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_MEMORY_ARBITER_H_
