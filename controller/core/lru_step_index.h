// A run-length index of the cached free blocks' last-use steps, in LRU order: how many of the
// least recently used blocks were last used before a given step, without walking them.
//
// The cached segment of the free queue (free_block_queue.h) holds blocks in the order they were
// freed, each stamped with an increasing sequence number (KvBlock::lru_seq) and the step it was
// freed at (its last use). Consecutive blocks freed in the same step form a run; the index keeps
// one (first sequence number, step, count) entry per run. Blocks leave from anywhere (prefix hits
// take them out of the middle): their run is found by sequence number and counted down; empty
// runs are dropped from the front at once and compacted away once they are half the index. So
// the index holds at most 2 × min(cached free blocks, steps) runs, and
// CountFromOldestBefore(step) costs one pass over the runs it counts: O(distinct steps), where
// the walk over the blocks it replaces (one random access per block: 0.6 ms for 98k scattered
// blocks on the dev box) is O(blocks).
//
// Not thread-safe; owned by KvBlockPool.
#ifndef VAMP_CONTROLLER_CORE_LRU_STEP_INDEX_H_
#define VAMP_CONTROLLER_CORE_LRU_STEP_INDEX_H_

#include <cstdint>
#include <deque>

namespace vamp {

class LruStepIndex {
 public:
  // A block joined the most recently used end: `seq` is larger than every earlier Push's, `step`
  // its last use, `weight` (>= 1) what it counts for (the blocks evicting it frees).
  void Push(int64_t seq, int64_t step, int64_t weight = 1);
  // The block pushed with `seq` and `weight` left the segment (it must be in it).
  void Remove(int64_t seq, int64_t weight = 1);
  // Weights counted from the least recently used end up to (not including) the first block last
  // used at or after `step`: what a walk from the oldest block that stops there would count.
  int64_t CountFromOldestBefore(int64_t step) const;

  // The weights of the blocks in the segment.
  int64_t size() const { return size_; }
  // Runs held now, empty ones included (for tests).
  int64_t num_runs() const { return static_cast<int64_t>(runs_.size()); }
  // Calls fn(step, count) for the non-empty runs from the oldest (for consistency checks).
  template <typename Fn>
  void ForEachRun(Fn fn) const {
    for (const Run& r : runs_) {
      if (r.count > 0) fn(r.step, r.count);
    }
  }

 private:
  struct Run {
    int64_t first_seq;  // the sequence number of the run's first block
    int64_t step;
    int64_t count;  // weights of the run's blocks still in the segment
  };
  void Compact();

  std::deque<Run> runs_;  // oldest first; first_seq increasing
  int64_t size_ = 0;
  int64_t empty_runs_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_LRU_STEP_INDEX_H_
