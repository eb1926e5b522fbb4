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
// Snapshots of recurrent state (models with linear attention, where a prefix-cache hit must also
// restore the state at its end): a snapshot takes whole blocks out of circulation, in no request's
// table, where the agents store a copy of one request's state. A request holds one while its steps
// capture into it (AllocateSnapshot); afterwards it is attached to the cached block whose last
// token it follows (AttachSnapshot), or freed. An attached snapshot lives as long as its anchor
// block stays cached and goes with it: evicting the anchor frees its snapshot's blocks too, so the
// cached free blocks the pool reports (num_free_cached, ForEachCachedFree with
// KvBlock::EvictionBlocks) count them.
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
  // Blocks evicting every cached free block would free: the blocks and the snapshots they anchor.
  int32_t num_free_cached() const { return free_.num_cached() + free_snapshot_blocks_; }
  // Blocks in the free queue (cached or not; snapshots excluded).
  int32_t num_free() const { return free_.size(); }
  int32_t num_withdrawn() const { return num_withdrawn_; }
  // Blocks storing snapshots (held by requests or attached), and the snapshots.
  int32_t num_snapshot_blocks() const { return num_snapshot_blocks_; }
  int32_t num_snapshots() const {
    return static_cast<int32_t>(snapshots_.size() - free_snapshot_ids_.size());
  }
  // Blocks registered in the prefix cache, in use or free.
  int32_t num_cached() const { return static_cast<int32_t>(cache_.size()); }
  // Fraction of blocks held by requests (cached free blocks count as free, as in vLLM).
  double Usage() const;
  bool caching_enabled() const { return caching_enabled_; }
  // Cumulative number of cached blocks whose cache entry was dropped while free (arbiter evictions
  // and shrink withdrawals).
  int64_t num_evicted() const { return num_evicted_; }

  // Called with the hash of every cached block whose cache entry is dropped while it is free
  // (arbiter evictions and shrink withdrawals), in eviction order, and whether the block
  // anchored a snapshot of recurrent state then: the feed of a ghost list.
  using EvictionListener = std::function<void(const BlockHash&, bool anchored)>;
  void set_eviction_listener(EvictionListener listener) { on_evict_ = std::move(listener); }

  // The scheduler step stamped into blocks as they are acquired and released.
  void SetStep(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  // ---- Allocation and sharing ----
  // Hands out `n` uncached free blocks with ref_count 1, appending their ids to `out`. Requires
  // n <= num_free_uncached(): callers cover a shortfall through the arbiter first.
  void AllocateUncached(int32_t n, std::vector<BlockId>* out);
  // Drops the cache entries of cached free blocks, least recently used first, until at least `n`
  // blocks have become uncached free (a block anchoring a snapshot frees the snapshot's blocks
  // too) or none is left. Returns how many blocks became uncached free.
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

  // ---- Snapshots of recurrent state ----
  // A snapshot of `n` > 0 blocks taken from the uncached free blocks (requires n <=
  // num_free_uncached()), held by a request until AttachSnapshot or FreeSnapshot.
  SnapshotId AllocateSnapshot(int32_t n);
  // Attaches held snapshot `id`, the state after `num_tokens` tokens, to `anchor`: the cached block
  // in use whose last token is token num_tokens - 1. Returns false (and leaves the snapshot held)
  // when the anchor is not cached, is free, already anchors one, or when the anchor or a block of
  // the snapshot is in a shrinking tail.
  bool AttachSnapshot(SnapshotId id, BlockId anchor, int32_t num_tokens);
  // Frees a held snapshot's blocks (to the uncached front; withdrawn in a shrinking tail).
  void FreeSnapshot(SnapshotId id);
  struct StateSnapshot {
    std::vector<BlockId> blocks;  // where the agents store it, in order
    BlockId anchor = kNoBlock;    // kNoBlock while a request holds it
    int32_t num_tokens = 0;       // attached: the state after this many tokens
  };
  const StateSnapshot& snapshot(SnapshotId id) const { return snapshots_[id]; }

  // ---- Capacity ----
  // Appends `n` > 0 uncached free blocks (ids num_blocks()..). Fails while a shrink is pending.
  absl::Status Grow(int32_t n);
  // Starts taking the highest `n` blocks out (0 < n < num_blocks()). Free ones are withdrawn at
  // once (cached ones lose their entry); in-use ones lose their cache entry so nobody new can
  // share them, and are withdrawn when their last user releases them. Attached snapshots with a
  // block or their anchor in the tail are dropped (a free anchor is evicted with them); held
  // ones are withdrawn when freed.
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
  // ForEachCachedFree walk stopping at that block counts (in EvictionBlocks). The queue is in
  // non-decreasing last-use order (CheckInvariants), so these are all cached free blocks last used
  // before `step`.
  int64_t CountCachedFreeUsedBefore(int64_t step) const {
    return cached_steps_.CountFromOldestBefore(step);
  }
  // Calls fn(const KvBlock&) for cached free blocks in eviction order (least recently used first)
  // until fn returns false. Evicting a block frees its EvictionBlocks().
  template <typename Fn>
  void ForEachCachedFree(Fn fn) const {
    for (BlockId id = free_.OldestCached(); id != kNoBlock; id = free_.NextCached(id)) {
      if (!fn(blocks_[id])) return;
    }
  }
  // For a free cached block: about how many blocks evictions would free before it (its distance
  // from the LRU end, snapshots counted), in O(1). Exact while blocks leave the cached segment only
  // from its LRU end; prefix hits that take blocks out of the middle make it an interpolation
  // between the oldest and newest cached blocks' stamps. 0 for a block that is not free and cached.
  int64_t CachedFreeDepth(BlockId id) const;
  // Full consistency check, O(num_blocks) (tests and debugging): reference counts vs. queue
  // membership, queue segments and LRU order, cache map vs. block states, and the block totals.
  absl::Status CheckInvariants() const;

 private:
  bool InShrinkingTail(BlockId id) const {
    return shrink_begin_ != kNoBlock && id >= shrink_begin_;
  }
  // Drops b's cache entry, and the snapshot it anchors.
  void Uncache(KvBlock& b);
  void Withdraw(KvBlock& b);
  // A free cached block leaves the cached segment of the free queue (b.ref_count == 0).
  void LeaveCachedSegment(KvBlock& b);
  // Returns a snapshot's blocks to the free queue (withdrawn in a shrinking tail) and its id.
  void ReleaseSnapshotBlocks(SnapshotId id);

  bool caching_enabled_;
  std::vector<KvBlock> blocks_;
  FreeBlockQueue free_;
  absl::flat_hash_map<BlockHash, BlockId, BlockHashHasher> cache_;
  int32_t num_used_ = 0;
  int32_t num_withdrawn_ = 0;
  BlockId shrink_begin_ = kNoBlock;  // first id of the shrinking tail, kNoBlock when none
  int64_t step_ = 0;
  int64_t num_evicted_ = 0;
  int64_t lru_clock_ = 0;      // EvictionBlocks() of the blocks that have joined the cached segment
  LruStepIndex cached_steps_;  // the cached segment's last-use steps, by lru_seq, weighted
  EvictionListener on_evict_;
  std::vector<StateSnapshot> snapshots_;
  std::vector<SnapshotId> free_snapshot_ids_;
  int32_t num_snapshot_blocks_ = 0;
  // Blocks of the snapshots that free cached blocks anchor.
  int32_t free_snapshot_blocks_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_KV_BLOCK_POOL_H_
