// Scheduler statistics for metrics, logs and arbiters. Counters are cumulative since start; the
// snapshot adds the pool's state and what happened in the latest step.
#ifndef VAMP_CONTROLLER_CORE_SCHEDULER_STATS_H_
#define VAMP_CONTROLLER_CORE_SCHEDULER_STATS_H_

#include <cstdint>
#include <vector>

#include "controller/core/request.h"

namespace vamp {

// Prefix-cache lookups, counted once per admission (not per failed attempt, which would make the
// rate depend on how long a request waited). Admissions of preempted requests are kept apart, as
// in vLLM, so that recompute after preemption does not flatter the hit rate.
struct PrefixCacheStats {
  int64_t requests = 0;
  int64_t query_tokens = 0;
  int64_t hit_tokens = 0;
  int64_t preempted_requests = 0;
  int64_t preempted_query_tokens = 0;
  int64_t preempted_hit_tokens = 0;

  // hit_tokens / query_tokens (0 when nothing was queried).
  double HitRate() const {
    return query_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / query_tokens;
  }
};

struct SchedulerCounters {
  PrefixCacheStats prefix_cache;
  int64_t num_steps = 0;             // non-empty plans
  int64_t num_scheduled_tokens = 0;  // over all steps
  int64_t num_requests_added = 0;
  int64_t num_finished = 0;  // stop or length
  int64_t num_aborted = 0;
  int64_t num_preemptions = 0;
  int64_t num_arbiter_calls = 0;
  int64_t num_evicted_blocks = 0;  // blocks cached ones' evictions freed (with their snapshots)
  int64_t num_offloads = 0;        // successful offloads
  int64_t num_offloaded_blocks = 0;
  int64_t num_restores_started = 0;       // restores the arbiter asked for
  int64_t num_restores = 0;               // restores completed (groups back with the experts)
  int64_t num_restores_cancelled = 0;     // restores abandoned because a gap arose meanwhile
  int64_t num_restored_blocks = 0;        // blocks the completed restores took out of the pool
  int64_t num_reverted_steps = 0;         // plans the agents refused (Scheduler::RevertStep)
  int64_t num_admitted = 0;               // first admissions
  int64_t total_queue_micros = 0;         // arrival → first admission, summed
  int64_t num_resumed = 0;                // admissions after a preemption
  int64_t total_resume_delay_micros = 0;  // preemption → re-admission, summed (the cost model's
                                          // observed t_queue)
  // Models with recurrent state: snapshots of it captured (planned), and captures skipped for
  // want of blocks.
  int64_t num_state_captures = 0;
  int64_t num_state_captures_skipped = 0;
  // Steps whose admissions stopped at the static pool's size (SchedulerConfig::
  // admit_within_baseline) while the offloaded groups had room.
  int64_t num_admissions_held = 0;
};

// Queue time of one admission in the latest step.
struct QueueTimeSample {
  RequestId request_id = 0;
  int64_t queue_micros = 0;  // since arrival, or since the preemption for a resumed request
  bool resumed = false;
};

struct SchedulerStats {
  int64_t step = 0;
  // Pool, in blocks.
  int32_t num_blocks = 0;
  int32_t num_used_blocks = 0;
  int32_t num_free_uncached_blocks = 0;
  int32_t num_free_cached_blocks = 0;
  int32_t num_withdrawn_blocks = 0;  // held back for a pending shrink
  int32_t num_cached_blocks = 0;     // registered in the prefix cache (used or free)
  int32_t num_snapshot_blocks = 0;   // storing snapshots of recurrent state
  int32_t num_snapshots = 0;         // those snapshots (held by requests or attached)
  double kv_usage = 0;               // used / num_blocks
  // Requests.
  int32_t num_running = 0;
  int32_t num_waiting = 0;  // including preempted ones
  int32_t num_waiting_preempted = 0;
  SchedulerCounters counters;
  // Latest step.
  int32_t step_num_scheduled_tokens = 0;
  int32_t step_num_preempted = 0;
  std::vector<QueueTimeSample> step_queue_times;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SCHEDULER_STATS_H_
