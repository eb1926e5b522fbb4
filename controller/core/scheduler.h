// The scheduler: continuous batching with chunked prefill under a per-step token budget, prefix
// caching, recompute preemption, and a pluggable memory arbiter. The same code runs in the
// controller (driving agents over gRPC) and in vamp-sim (driving simulated agents in virtual time).
//
// Use, one step at a time:
//   AddRequest / AbortRequest   at any time between calls;
//   Schedule()                  → StepPlan for the agents;
//   UpdateFromOutput(output)    with the tokens they sampled → per-request outputs for clients.
// A non-empty plan must be answered by UpdateFromOutput before the next Schedule.
//
// Each step: running requests first (in admission order), each taking min(uncomputed tokens,
// long_prefill_token_threshold, remaining budget); then, if nobody was preempted this step,
// waiting requests in policy order while the budget, max_num_seqs and memory allow, each starting
// from its longest cached prefix. Whenever blocks are short the arbiter decides (memory_arbiter.h).
// Full blocks enter the prefix cache once their KV is computed, i.e. when the step's output
// arrives.
//
// Offload and restore (expert_offloader.h): an offload the arbiter chooses grows the pool at once
// and the step being planned may use the new blocks; the agents carry the remap out before they
// run that step. Restore (optional): at the start of each Schedule() the arbiter may ask for
// groups back (MemoryArbiter::OnStepBoundary). The scheduler then withdraws the pool's tail
// (BlocksRemovedByRestore blocks, KvBlockPool::BeginShrink); once no request holds any of them,
// at a later step boundary, it commits the shrink and calls ExpertOffloader::Restore, and the
// plan of that step carries the finished and preempted ids the agents must drop before they
// unmap the tail. While a restore is pending the arbiter may cancel it to cover a gap
// (ArbiterPlan::cancel_restore): the withdrawn blocks come back and the arbiter is asked again.
// Neither starts, and a pending restore is not committed, while the offloader is not Ready().
//
// A step the agents refused (a remap it carried failed on some rank, and no rank ran any of it)
// is undone with RevertStep: the next Schedule() plans the same work again.
//
// Not thread-safe: one thread (the engine loop) owns the scheduler; other threads hand requests to
// that thread. Deterministic: the same calls with the same clock readings give the same plans.
#ifndef VAMP_CONTROLLER_CORE_SCHEDULER_H_
#define VAMP_CONTROLLER_CORE_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/core/kv_cache_manager.h"
#include "controller/core/memory_arbiter.h"
#include "controller/core/request.h"
#include "controller/core/scheduler_config.h"
#include "controller/core/scheduler_stats.h"
#include "controller/core/step_plan.h"
#include "controller/core/waiting_queue.h"

namespace vamp {

class Scheduler {
 public:
  // `clock` (queue times) must outlive the scheduler. `offloader` may be null (the pool never
  // grows by offloading); otherwise it must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerConfig& config,
                                                           const Clock* clock,
                                                           std::unique_ptr<MemoryArbiter> arbiter,
                                                           ExpertOffloader* offloader = nullptr);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- Requests ----
  // The prefix-cache hashes of every full block of `prompt` under `cache_salt`, as a scheduler
  // created with `config` computes them (its block size and hash key): RequestSpec's
  // prompt_block_hashes. Empty when prefix caching is off. A pure function, safe on any thread:
  // callers hash where prompts arrive, off the scheduling thread.
  static std::vector<BlockHash> HashPromptBlocks(const SchedulerConfig& config,
                                                 absl::Span<const TokenId> prompt,
                                                 absl::string_view cache_salt);
  // Queues a request. AlreadyExists for a live id; InvalidArgument naming the field for an empty
  // prompt, negative token ids, a prompt that leaves no room for output under max_model_len, bad
  // sampling parameters, or prompt_block_hashes that are not the prompt's.
  absl::Status AddRequest(RequestSpec spec);
  // Finishes a live request with FinishReason::kAbort and frees its blocks; its id goes to the
  // next plan's finished_ids if agents know it. NotFound if not live. Safe while a step is in
  // flight (that step's tokens for it are then ignored).
  absl::Status AbortRequest(RequestId id);

  // ---- Steps ----
  // Plans the next step. FailedPrecondition while the previous non-empty plan is unanswered.
  absl::StatusOr<StepPlan> Schedule();
  // Applies the sampled tokens of the step in flight: appends them, applies stop conditions,
  // caches newly computed full blocks, and frees finished requests. Returns the outputs of the
  // requests that got tokens, in plan order. Validates everything before changing anything:
  // FailedPrecondition if no step is in flight or `output.step` is not it; InvalidArgument for an
  // id not scheduled in it, a duplicate id, a negative token id, or a request that had to sample
  // and got no token. Tokens for requests still in prefill are ignored.
  absl::StatusOr<std::vector<RequestOutput>> UpdateFromOutput(const StepOutput& output);

  // Replaces the memory arbiter between steps (a policy change); a restore the old arbiter
  // started is cancelled. FailedPrecondition while a step is in flight.
  absl::Status ReplaceArbiter(std::unique_ptr<MemoryArbiter> arbiter);

  // The agents refused the step of the latest plan: a remap it carried failed on some rank and
  // none of them ran any of it. Undoes that plan so that the next Schedule() plans the work
  // again: requests admitted in it go back to the waiting queue (new ones are announced again),
  // running ones lose the blocks it appended and their tokens count as not computed, its
  // preempted and finished ids go with the next plan; then the pool changes by
  // -pool_blocks_delta, the blocks the refused remaps added (negative: removed), back to the size
  // the agents return to when they roll the remaps back. What the step's arbiter calls did stays
  // done (evictions, preemptions, the arbiter's and its reuse tracker's bookkeeping); the counters
  // of planned work (steps, scheduled tokens, admissions, prefix-cache lookups, offloads and
  // restores) are restored; a restore the plan's step boundary began is cancelled when the pool
  // must change under it. FailedPrecondition when there is no plan to revert (it was answered or
  // reverted, or a later one made), Internal when the blocks to give back are not free.
  absl::Status RevertStep(int32_t pool_blocks_delta);

  // ---- Capacity (step boundaries; see KvBlockPool) ----
  // Commit/Cancel refuse (FailedPrecondition) while the pending shrink belongs to a restore.
  absl::Status GrowPool(int32_t blocks);
  absl::Status BeginShrinkPool(int32_t blocks);
  absl::Status CommitShrinkPool();
  absl::Status CancelShrinkPool();
  // Offloads `groups` groups now (an operator's order, between steps) and grows the pool by the
  // blocks they add; the next plan's step carries the remap. Returns the blocks added.
  // FailedPrecondition without an offloader, while a shrink is pending or the offloader is not
  // Ready(), or past the cap.
  absl::StatusOr<int32_t> OffloadGroups(int32_t groups);
  // Restores the last `groups` groups through the offloader once their blocks have left the pool
  // (CommitShrinkPool). The next plan carries the requests finished or preempted since the last
  // one, which the agents drop before they unmap the tail. FailedPrecondition without an
  // offloader or while it is not Ready().
  absl::Status RestoreGroups(int32_t groups);

  // ---- Read-only state ----
  const SchedulerConfig& config() const { return config_; }
  int64_t step() const { return step_; }
  bool step_in_flight() const { return !in_flight_.empty(); }
  bool has_unfinished_requests() const { return !requests_.empty(); }
  const Request* FindRequest(RequestId id) const;
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // Running requests in admission order.
  const Request& running(int32_t i) const { return *running_[i]; }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const KvBlockPool& pool() const { return kv_.pool(); }
  const KvCacheManager& kv_cache_manager() const { return kv_; }
  const MemoryArbiter& arbiter() const { return *arbiter_; }
  const SchedulerCounters& counters() const { return counters_; }
  // Snapshot: pool state, request counts, counters and the latest step's figures.
  SchedulerStats Stats() const;
  // Arbiter calls made by the latest Schedule() (gaps, and a restore it started).
  const std::vector<ArbiterRecord>& step_decisions() const { return step_decisions_; }
  // Expert groups of the restore under way (0 when none is pending).
  int32_t restore_pending_groups() const { return restore_pending_groups_; }
  // O(blocks + tokens) consistency check for tests: pool invariants, reference counts equal to the
  // number of block tables holding each block, cached blocks' hashes equal to their owners'
  // token hashes, and every live request in exactly one of running / waiting.
  absl::Status CheckInvariants() const;

 private:
  Scheduler(const SchedulerConfig& config, const Clock* clock,
            std::unique_ptr<MemoryArbiter> arbiter, ExpertOffloader* offloader);

  // A request scheduled in the step being planned.
  struct Scheduled {
    Request* request;
    int32_t num_new_tokens;
    int32_t num_computed_before;  // tokens in KV before this step (the hit, for admissions)
    size_t first_new_block;       // index in the block table of the first block added this step
    bool admitted;                // came from the waiting queue this step
    RequestStatus status_before;  // kRunning, or the waiting status it was admitted from
    // Recurrent state: where the step captures it (0: no capture), and whether the snapshot it
    // captures into was taken for this step.
    int32_t capture_tokens = 0;
    bool snapshot_taken = false;
  };
  // A request of the step in flight (seq tells a re-added id apart).
  struct InFlight {
    RequestId id;
    uint64_t seq;
  };
  // What RevertStep needs of a request the latest plan scheduled: its Scheduled entry and what
  // planning it changed.
  struct Planned {
    RequestId id;
    uint64_t seq;
    Scheduled scheduled;
    bool known_before;  // known_to_agents before the plan
    int32_t num_cached_tokens_before;
  };
  // The latest plan, until it is answered, reverted or replaced.
  struct LastPlan {
    bool revertible = false;
    std::vector<Planned> requests;  // in scheduling order
    std::vector<RequestId> preempted_ids;
    std::vector<RequestId> finished_ids;
    SchedulerCounters counters_before;  // at the start of the Schedule() that made it
  };
  enum class Room { kOk, kNoRoom, kRequesterPreempted };

  // Makes room (via the arbiter) for `request`'s table to cover `num_total_tokens`, then allocates.
  Room EnsureBlocks(Request* request, int32_t num_total_tokens, bool running);
  // A step computing tokens [s.num_computed_before, + s.num_new_tokens) of a model with recurrent
  // state captures the state where KvCacheManager::SnapshotPoint says, when a snapshot's blocks
  // can be had.
  void PlanCapture(Scheduled& s);
  OffloadState OffloadStateNow() const;
  // SchedulerConfig::admit_within_baseline, asked while the arbiter says more concurrency does
  // not pay (needs an offloader): whether `r` (holding its hit blocks) may grow to `num_tokens`
  // tokens with the blocks no eviction frees within the pool less the offloaded groups' blocks,
  // i.e. what a static split could admit. Such an admission never makes the arbiter grow the
  // pool; the arbiter grows it for running requests and to keep cached prefixes.
  bool FitsBaseline(const Request& r, int64_t num_tokens) const;
  // Hands the offload geometry to the arbiter's reuse tracker (if it keeps one).
  void SyncReuseGeometry();
  // Step-boundary work for restores: commits a pending one whose blocks are all released, or asks
  // the arbiter whether to start one.
  void StepBoundary();
  void CancelRestore();
  void Preempt(Request* victim);
  void RecordAdmission(const Scheduled& s, int64_t now);

  SchedulerConfig config_;
  const Clock* clock_;
  std::unique_ptr<MemoryArbiter> arbiter_;
  ExpertOffloader* offloader_;
  KvCacheManager kv_;

  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;  // every live request
  WaitingQueue waiting_;
  std::vector<Request*> running_;  // admission order
  int32_t num_waiting_preempted_ = 0;
  std::vector<RequestId> pending_finished_ids_;  // for the next plan
  uint64_t next_seq_ = 0;
  int64_t step_ = 0;
  std::vector<InFlight> in_flight_;

  // State of the Schedule() call under way.
  std::vector<Scheduled> scheduled_;
  size_t running_cursor_ = 0;
  int32_t token_budget_ = 0;
  std::vector<RequestId> step_preempted_ids_;
  int32_t step_num_preempted_ = 0;

  SchedulerCounters counters_;
  int32_t step_num_scheduled_tokens_ = 0;
  std::vector<QueueTimeSample> step_queue_times_;
  std::vector<ArbiterRecord> step_decisions_;
  int32_t restore_pending_groups_ = 0;
  // Preemptions of a reverted plan, delivered with the next one.
  std::vector<RequestId> undelivered_preempted_ids_;
  LastPlan last_plan_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SCHEDULER_H_
