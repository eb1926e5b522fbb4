// What a larger or smaller KV pool would have served: a miss-ratio curve over the pool sizes that
// expert offload can reach, measured from the traffic itself (shared/DESIGN.md, "Beyond the
// paper: offload is a tax, reuse is measurable").
//
// Pool sizes are counted in offloaded expert groups g (the pool has its base size at g = 0 and
// grows by blocks_per_group blocks per group). For every admission the tracker works out, block by
// block along the request's prompt, the smallest g at which the block would have been a prefix
// hit, and records its tokens against that g:
//   - a block found cached and free at LRU depth d (d cached free blocks would be evicted before
//     it) with u uncached free blocks in the pool survives a shrink by r groups only while
//     r·blocks_per_group <= u + d, so it needs g_now − floor((u + d) / blocks_per_group) groups;
//   - a block found cached and in use needs nothing (another request holds it);
//   - past the cached prefix, a block whose hash is in the ghost list (evicted, at stack distance
//     s) would have been kept by a pool s blocks larger, so it needs g_now + ceil(s / bpg);
//   - a prefix needs all its blocks, so each block's need is the running maximum along the
//     prompt, and the walk stops at the first block that no reachable pool size would have held;
//   - on a model with recurrent state a hit must end at a block anchoring a snapshot of it, so
//     the ghost blocks after the last one that anchored a snapshot when evicted count for nothing.
// Preemptions are recorded too: the recompute of a victim's tokens is what a pool large enough to
// cover the gap would have avoided. So is waiting for memory: a step in which the head of the
// waiting queue could not be admitted for lack of KV blocks costs every waiting request that
// step, which a pool covering the gap would have saved (request-steps, kept apart from tokens).
// Recorded tokens live in a sliding window of time (the scheduler's clock, µs: in steps, slow
// steps under a large offload would stretch the window); TokensBetween(a, b) is the prefix
// work that a pool with b groups would have served and one with a groups would not. The arbiter
// multiplies it by the measured prefill cost per token to get the value of (or the loss from)
// moving the boundary, and compares it with the offload tax over the same window.
//
// Reuse ages: for every cached free block a hit takes, its age in steps (since it was last used)
// goes into a log2 histogram over the same window; ReuseAgeSteps(q) is the age within which a
// share q of those hits came. Blocks older than that are, by the traffic's own measure, unlikely
// to be reused: the working-set restore rule (vamp_arbiter.h) reads it.
//
// Bounded memory: the ghost list holds at most max_groups × blocks_per_group hashes; the windows
// are window_slots × (2 · (max_groups + 2) + 48 + 6) doubles. Not thread-safe; the scheduler's
// thread feeds it.
#ifndef VAMP_CONTROLLER_CORE_REUSE_TRACKER_H_
#define VAMP_CONTROLLER_CORE_REUSE_TRACKER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "controller/core/block_hash.h"
#include "controller/core/ghost_list.h"
#include "controller/core/kv_block_pool.h"
#include "controller/core/kv_cache_manager.h"
#include "controller/core/request.h"
#include "controller/core/sliding_histogram.h"

namespace vamp {

struct ReuseTrackerOptions {
  int64_t window_micros = 60'000'000;  // how long recorded tokens are kept (µs)
  int32_t window_slots = 16;           // granularity of the window
};

class ReuseTracker {
 public:
  explicit ReuseTracker(const ReuseTrackerOptions& options);

  // The offload geometry now: blocks one group adds (0 = no offloading: nothing is recorded),
  // groups offloaded, and the most that can be (the cap). Cheap when unchanged.
  void SetGeometry(int32_t blocks_per_group, int32_t offloaded_groups, int32_t max_groups);
  int32_t blocks_per_group() const { return bpg_; }
  int32_t offloaded_groups() const { return offloaded_; }
  int32_t max_groups() const { return max_groups_; }

  // A cached block's entry was dropped while it was free (KvBlockPool's eviction listener);
  // `anchored`: it carried a snapshot of recurrent state.
  void OnEvicted(const BlockHash& hash, bool anchored = false) { ghosts_.Add(hash, anchored); }
  // A model with recurrent state (Qwen3-Next): a prefix hit must end at a block that anchors a
  // snapshot of the state there, so ghost blocks count only up to the last one that did when it
  // was evicted (a larger pool would have kept the snapshot with it); the blocks after it could
  // not have been served. Off: every ghost block of the chain counts.
  void set_hits_need_snapshots(bool on) { hits_need_snapshots_ = on; }

  // The needs of a request's cached prefix, measured before its blocks are acquired (acquiring
  // takes them out of the free queue, where their depth is read).
  struct HitNeeds {
    std::vector<std::pair<int32_t, int32_t>> runs;  // (groups needed, blocks), in prompt order
    int32_t max_need = 0;                           // running maximum at the end of the hit
    // (log2 age bucket, blocks) of the cached free blocks hit; bucket b holds ages (steps) in
    // [2^(b-1), 2^b - 1], bucket 0 age 0.
    std::vector<std::pair<int32_t, int32_t>> ages;
  };
  // `step` is the scheduler's step now (blocks' last_used_step is on the same clock).
  HitNeeds MeasureHit(const KvBlockPool& pool, const PrefixHit& hit, int64_t step) const;
  // Records an admitted request's prefix: the hit runs, then the blocks past the hit found in the
  // ghost list (hashing them as far as the walk goes; those hashes are needed later anyway).
  void RecordAdmission(int64_t now_micros, const HitNeeds& needs, Request& request,
                       int32_t block_size, const BlockHasher& hasher);
  // A running request was preempted to cover a gap of `gap_blocks`; `recompute_tokens` tokens
  // will be computed again.
  void RecordPreemption(int64_t now_micros, int32_t gap_blocks, int32_t recompute_tokens);
  // The head of the waiting queue was left waiting this step for `gap_blocks` missing blocks,
  // with `waiting` requests in the queue.
  void RecordMemoryWait(int64_t now_micros, int32_t gap_blocks, int32_t waiting);

  // Tokens over the window ending at `now_micros` that a pool with `to` offloaded groups would have
  // served and one with `from` would not (0 <= from < to; reversed arguments give the negative).
  double TokensBetween(int64_t now_micros, int32_t from, int32_t to) const;
  // The same for request-steps spent waiting for memory.
  double WaitStepsBetween(int64_t now_micros, int32_t from, int32_t to) const;
  // Once per scheduled step: whether requests were left waiting for compute (token budget or
  // max_num_seqs) rather than for memory.
  void RecordQueueState(int64_t now_micros, bool waiting_for_compute);
  // Share of the window's steps that left requests waiting for compute (0 when none recorded).
  double ComputeBoundShare(int64_t now_micros) const;
  // A first admission after `queue_micros` in the waiting queue; the window's mean (µs, 0 when
  // none) tells whether users are waiting for their first token at all.
  void RecordQueueTime(int64_t now_micros, int64_t queue_micros);
  double MeanQueueMicros(int64_t now_micros) const;
  // Of those, the ones found in the ghost list (past the cached prefix) and in preemptions, over
  // the window, for any pool size above the current one (decision-log figures).
  double GhostTokens(int64_t now_micros) const;
  // The age (steps, a power of two minus one: the upper end of its log2 bucket) within which a
  // share `quantile` of the window's cached-block hits came; 0 when the window holds none.
  int64_t ReuseAgeSteps(int64_t now_micros, double quantile) const;
  // Forgets the window's evidence for pool sizes above `groups` offloaded groups (tokens and
  // memory waits that needed more): after the arbiter found that memory idle and gave it back,
  // the demand that once needed it is history and must not grow the pool again.
  void ForgetAbove(int32_t groups);
  double PreemptionTokens(int64_t now_micros) const;
  int64_t window_micros() const { return tokens_.window_micros(); }
  const GhostList& ghosts() const { return ghosts_; }

 private:
  void Record(int64_t now_micros, int32_t need, double tokens);

  int32_t bpg_ = 0;
  int32_t offloaded_ = 0;
  int32_t max_groups_ = 0;
  GhostList ghosts_;
  bool hits_need_snapshots_ = false;
  std::vector<int32_t> ghost_needs_;  // RecordAdmission's per-block needs (reused scratch)
  // Bucket g: tokens first served at g offloaded groups (0..max_groups; max_groups + 1 = out of
  // reach, kept for the totals).
  SlidingHistogram tokens_;
  SlidingHistogram wait_steps_;         // same buckets: request-steps waiting for memory
  SlidingHistogram ghost_tokens_;       // one bucket
  SlidingHistogram queue_state_;        // bucket 0: steps, bucket 1: steps waiting for compute
  SlidingHistogram queue_time_;         // bucket 0: admissions, bucket 1: their µs queued
  SlidingHistogram preemption_tokens_;  // one bucket
  SlidingHistogram hit_ages_;           // kAgeBuckets log2 buckets: blocks hit at that age
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_REUSE_TRACKER_H_
