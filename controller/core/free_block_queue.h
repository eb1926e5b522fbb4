// The free block queue: one intrusive doubly linked list over block ids with O(1) push, pop and
// remove, and no allocation after construction.
//
// The list has two segments:
//   front [ uncached free blocks ... | cached free blocks, least recently used first ... ] back
// Uncached blocks (never filled, partially filled, or no longer cached) carry no reusable KV, so
// allocation takes them first from the front. Cached blocks (full blocks still registered in the
// prefix cache, no user) wait at the back in LRU order: a block freed later goes behind one freed
// earlier, and is evicted only when nothing uncached is left. A block re-used by a prefix hit
// leaves the queue from wherever it is. Evicting the oldest cached block is just moving the segment
// boundary one step, since that block is already adjacent to the uncached segment.
//
// The queue keeps its links in arrays indexed by block id (rather than pointers in the blocks) so
// that growing the pool never invalidates anything. Not thread-safe; owned by KvBlockPool.
#ifndef VAMP_CONTROLLER_CORE_FREE_BLOCK_QUEUE_H_
#define VAMP_CONTROLLER_CORE_FREE_BLOCK_QUEUE_H_

#include <cstdint>
#include <vector>

#include "controller/core/kv_block.h"

namespace vamp {

class FreeBlockQueue {
 public:
  // An empty queue for ids 0..capacity-1.
  explicit FreeBlockQueue(int32_t capacity = 0);

  // Changes the id range to 0..capacity-1. Ids being dropped must not be in the queue.
  void Resize(int32_t capacity);
  int32_t capacity() const { return static_cast<int32_t>(segment_.size()); }

  // Uncached block to the very front (it is reused first).
  void PushUncachedFront(BlockId id);
  // Uncached block to the end of the uncached segment (used for fresh blocks so that the pool
  // hands out low ids first).
  void PushUncachedBack(BlockId id);
  // Cached block to the back: the most recently used end.
  void PushCached(BlockId id);

  // Pops the front uncached block. Requires num_uncached() > 0.
  BlockId PopUncached();
  // Removes `id` from wherever it is. Requires Contains(id).
  void Remove(BlockId id);

  // The least recently used cached block, or kNoBlock.
  BlockId OldestCached() const { return first_cached_; }
  // The most recently used cached block (the back of the queue), or kNoBlock.
  BlockId NewestCached() const { return num_cached_ > 0 ? tail_ : kNoBlock; }
  // Turns the least recently used cached block into the last uncached one (its cache entry is
  // being dropped). Requires num_cached() > 0. Returns its id.
  BlockId DemoteOldestCached();
  // The next cached block toward the most recently used end, or kNoBlock.
  BlockId NextCached(BlockId id) const { return next_[id]; }

  bool Contains(BlockId id) const { return segment_[id] != kNone; }
  bool ContainsCached(BlockId id) const { return segment_[id] == kCached; }
  int32_t num_uncached() const { return num_uncached_; }
  int32_t num_cached() const { return num_cached_; }
  int32_t size() const { return num_uncached_ + num_cached_; }

  // Ids from front to back (O(size); for tests and diagnostics).
  std::vector<BlockId> ToVector() const;

 private:
  enum Segment : uint8_t { kNone = 0, kUncached = 1, kCached = 2 };
  void LinkBefore(BlockId id, BlockId before);  // before == kNoBlock appends at the back
  void Unlink(BlockId id);

  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  std::vector<Segment> segment_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  BlockId first_cached_ = kNoBlock;  // boundary between the segments
  int32_t num_uncached_ = 0;
  int32_t num_cached_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_FREE_BLOCK_QUEUE_H_
