// One logical KV cache block: `block_size` token slots of K and V for every attention layer. The
// controller only does the bookkeeping; agents hold the memory at the same block index on every
// rank (see DESIGN.md, "Memory model").
#ifndef VAMP_CONTROLLER_CORE_KV_BLOCK_H_
#define VAMP_CONTROLLER_CORE_KV_BLOCK_H_

#include <cstdint>

#include "controller/core/block_hash.h"

namespace vamp {

// Index of a block in the KV region, 0..num_blocks-1. Stable for the block's lifetime: growing the
// pool appends ids, shrinking removes the highest ones.
using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

// A snapshot of one request's recurrent state (models with recurrent state, e.g. Qwen3-Next's
// linear attention), stored by the agents in KV blocks of the pool (KvBlockPool::snapshot).
using SnapshotId = int32_t;
inline constexpr SnapshotId kNoSnapshot = -1;

struct KvBlock {
  BlockId id = kNoBlock;
  // Number of requests whose block table holds this block. 0 means free (in the free queue),
  // withdrawn for a pending shrink, or storing a snapshot (`stores`).
  int32_t ref_count = 0;
  // Whether `hash` is valid and the block is registered in the prefix cache under it.
  bool cached = false;
  // Taken out of circulation for a pending shrink (never free, never handed out).
  bool withdrawn = false;
  BlockHash hash;
  // Scheduler step at which a request last acquired or released the block. For a free cached block
  // this is when it became free, so `current step - last_used_step` is its age in steps (the cost
  // model's recency term).
  int64_t last_used_step = 0;
  // For a free cached block: the blocks that had joined the cached LRU segment before this one,
  // each weighted by EvictionBlocks() (KvBlockPool::CachedFreeDepth reads LRU positions from it).
  int64_t lru_seq = 0;
  // A cached block may anchor the snapshot of the recurrent state after its last token, where a
  // prefix-cache hit on a model with recurrent state can end; the snapshot lives as long as the
  // block stays cached and is evicted with it. snapshot_blocks: the blocks that snapshot fills.
  SnapshotId snapshot = kNoSnapshot;
  int32_t snapshot_blocks = 0;
  // The snapshot whose data this block stores (in no table, not free), or kNoSnapshot.
  SnapshotId stores = kNoSnapshot;

  // Blocks that evicting this block frees: itself and the snapshot it anchors.
  int32_t EvictionBlocks() const { return 1 + snapshot_blocks; }
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_KV_BLOCK_H_
