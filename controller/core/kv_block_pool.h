// The logical KV block pool: block states, reference counts, the prefix cache (hash → block) and
// the free queue. It never decides *whether* to evict: allocation draws only on uncached free
// blocks, and cached free blocks are evicted only when someone (the memory arbiter) asks for it.
// That split is what lets VAMP price eviction against the other ways of covering a shortfall.
//
// Capacity changes at step boundaries: Grow appends blocks (after the agents mapped pages at the
// end of their KV regions); BeginShrink/CommitShrink take the highest ids out once they are free
// (before the agents hand those pages back to experts). While a shrink is pending no block of the
// shrinking tail is handed out, shared through the prefix cache, or newly cached.
//
// Not thread-safe: one owner (the scheduler's thread). References to KvBlock stay valid until the
// next Grow or CommitShrink.
#ifndef VAMP_CONTROLLER_CORE_KV_BLOCK_POOL_H_
#define VAMP_CONTROLLER_CORE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "controller/core/block_hash.h"
#include "controller/core/free_block_queue.h"
#include "controller/core/kv_block.h"
#include "controller/core/lru_step_index.h"

namespace vamp {

class KvBlockPool {
 public:
  // `num_blocks` > 0. With caching disabled, Cache() is a no-op and every free block is uncached.
  KvBlockPool(int32_t num_blocks, bool enable_caching);

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // ---- Counts (blocks) ----
  // Current size, including a shrinking tail until CommitShrink.
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_used() const { return num_used_; }
  int32_t num_free_uncached() const { return free_.num_uncached(); }
  int32_t num_free_cached() const { return free_.num_cached(); }
  int32_t num_free() const { return free_.size(); }
  int32_t num_withdrawn() const { return num_withdrawn_; }
  // Blocks registered in the prefix cache, in use or free.
  int32_t num_cached() const { return static_cast<int32_t>(cache_.size()); }
  // Fraction of blocks held by requests (cached free blocks count as free, as in vLLM).
  double Usage() const;
  bool caching_enabled() const { return caching_enabled_; }
  // Cumulative number of cached blocks whose cache entry was dropped while free (arbiter evictions
  // and shrink withdrawals).
  int64_t num_evicted() const { return num_evicted_; }

  // Called with the hash of every cached block whose cache entry is dropped while it is free
  // (arbiter evictions and shrink withdrawals), in eviction order: the feed of a ghost list.
  using EvictionListener = std::function<void(const BlockHash&)>;
  void set_eviction_listener(EvictionListener listener) { on_evict_ = std::move(listener); }

  // The scheduler step stamped into blocks as they are acquired and released.
  void SetStep(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  // ---- Allocation and sharing ----
  // Hands out `n` uncached free blocks with ref_count 1, appending their ids to `out`. Requires
  // n <= num_free_uncached(): callers cover a shortfall through the arbiter first.
  void AllocateUncached(int32_t n, std::vector<BlockId>* out);
  // Drops the cache entries of up to `n` cached free blocks, least recently used first, turning
  // them into uncached free blocks. Returns how many were evicted.
  int32_t EvictCached(int32_t n);
  // The block cached under `hash`, or kNoBlock.
  BlockId Lookup(const BlockHash& hash) const;
  // Starts loading the cache-table slots a later Lookup(hash) reads (a hint; changes nothing).
  void PrefetchLookup(const BlockHash& hash) const { cache_.prefetch(hash); }
  // Adds a user to a block found by Lookup (taking it out of the free queue if it had none).
  void Acquire(BlockId id);
  // Removes a user. At zero users the block becomes free: cached blocks join the back of the queue
  // (most recently used), uncached ones the front; a block of a shrinking tail is withdrawn.
  void Release(BlockId id);
  // Registers a full block under `hash`. Returns false (and leaves it uncached) when caching is
  // disabled, the block is already cached, another block already holds `hash` (the duplicate
  // simply stays uncached and is reused first once free), or the block is in a shrinking tail.
  bool Cache(BlockId id, const BlockHash& hash);

  // ---- Capacity ----
  // Appends `n` > 0 uncached free blocks (ids num_blocks()..). Fails while a shrink is pending.
  absl::Status Grow(int32_t n);
  // Starts taking the highest `n` blocks out (0 < n < num_blocks()). Free ones are withdrawn at
  // once (cached ones lose their entry); in-use ones lose their cache entry so nobody new can
  // share them, and are withdrawn when their last user releases them.
  absl::Status BeginShrink(int32_t n);
  bool shrink_pending() const { return shrink_begin_ != kNoBlock; }
  // First id of the shrinking tail (kNoBlock when no shrink is pending).
  BlockId shrink_begin() const { return shrink_begin_; }
  // Blocks still to be withdrawn before CommitShrink can succeed (0 when none is pending).
  int32_t shrink_outstanding() const;
  // Removes the withdrawn tail; FailedPrecondition until shrink_outstanding() == 0.
  absl::Status CommitShrink();
  // Returns the withdrawn blocks to the free queue and ends the pending shrink.
  absl::Status CancelShrink();

  // ---- Read-only views (arbiters, stats, tests) ----
  const KvBlock& block(BlockId id) const { return blocks_[id]; }
  const FreeBlockQueue& free_queue() const { return free_; }
  // Cached free blocks counted from the LRU end up to the first one last used at or after `step`,
  // in O(distinct last-use steps) rather than one random access per block (LruStepIndex): what a
  // ForEachCachedFree walk stopping at that block counts. The queue is in non-decreasing last-use
  // order (CheckInvariants), so these are all cached free blocks last used before `step`.
  int64_t CountCachedFreeUsedBefore(int64_t step) const {
    return cached_steps_.CountFromOldestBefore(step);
  }
  // Calls fn(const KvBlock&) for cached free blocks in eviction order (least recently used first)
  // until fn returns false.
  template <typename Fn>
  void ForEachCachedFree(Fn fn) const {
    for (BlockId id = free_.OldestCached(); id != kNoBlock; id = free_.NextCached(id)) {
      if (!fn(blocks_[id])) return;
    }
  }
  // For a free cached block: about how many cached free blocks would be evicted before it (its
  // distance from the LRU end), in O(1). Exact while blocks leave the cached segment only from
  // its LRU end; prefix hits that take blocks out of the middle make it an interpolation between
  // the oldest and newest cached blocks' stamps. 0 for a block that is not free and cached.
  int64_t CachedFreeDepth(BlockId id) const;
  // Full consistency check, O(num_blocks) (tests and debugging): reference counts vs. queue
  // membership, queue segments and LRU order, cache map vs. block states, and the block totals.
  absl::Status CheckInvariants() const;

 private:
  bool InShrinkingTail(BlockId id) const {
    return shrink_begin_ != kNoBlock && id >= shrink_begin_;
  }
  void Uncache(KvBlock& b);
  void Withdraw(KvBlock& b);

  bool caching_enabled_;
  std::vector<KvBlock> blocks_;
  FreeBlockQueue free_;
  absl::flat_hash_map<BlockHash, BlockId, BlockHashHasher> cache_;
  int32_t num_used_ = 0;
  int32_t num_withdrawn_ = 0;
  BlockId shrink_begin_ = kNoBlock;  // first id of the shrinking tail, kNoBlock when none
  int64_t step_ = 0;
  int64_t num_evicted_ = 0;
  int64_t lru_clock_ = 0;  // blocks that have joined the cached segment so far
  LruStepIndex cached_steps_;  // the cached segment's last-use steps, by lru_seq
  EvictionListener on_evict_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_KV_BLOCK_POOL_H_
