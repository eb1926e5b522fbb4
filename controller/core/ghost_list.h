// A ghost list: the hashes of KV blocks evicted from the prefix cache, without their data, in
// eviction order, so that a later miss on one of them can be told apart from a miss on content
// never seen — and priced: a pool larger by `Depth(hash)` blocks would still have held it under
// LRU (the block's stack distance). This is the "ghost" half of ARC and the basis of miss-ratio
// curves (Megiddo & Modha, FAST'03; Mattson et al., 1970).
//
// Memory is bounded: at most `capacity` hashes are remembered (the oldest are forgotten first),
// so a pool that could grow by at most N blocks needs a ghost list of N entries. Each entry costs
// a hash-map slot and a FIFO slot (≈ 56 bytes).
//
// Not thread-safe; owned by the scheduler.
#ifndef VAMP_CONTROLLER_CORE_GHOST_LIST_H_
#define VAMP_CONTROLLER_CORE_GHOST_LIST_H_

#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "controller/core/block_hash.h"

namespace vamp {

class GhostList {
 public:
  // `capacity` >= 0 hashes (0 = remembers nothing).
  explicit GhostList(int64_t capacity = 0) : capacity_(capacity) {}

  // Changes the bound; forgets the oldest entries beyond it.
  void set_capacity(int64_t capacity);
  int64_t capacity() const { return capacity_; }

  // Records that the block cached under `hash` was evicted now; `anchored`: it carried a
  // snapshot of recurrent state (a prefix hit on a model with recurrent state may end only at
  // such a block). A hash evicted again replaces its older entry.
  void Add(const BlockHash& hash, bool anchored = false);
  // Evictions since `hash` was evicted, counting its own (1 = the latest eviction), or 0 when the
  // hash is not remembered. A pool with Depth(hash) more blocks would still hold it.
  int64_t Depth(const BlockHash& hash) const;
  // Whether `hash`'s block carried a snapshot when it was (last) evicted; false when forgotten.
  bool Anchored(const BlockHash& hash) const;

  // Hashes remembered now (<= capacity).
  int64_t size() const { return static_cast<int64_t>(seq_.size()); }
  // Evictions recorded since construction.
  int64_t num_evictions() const { return clock_; }

 private:
  void Trim();

  struct Entry {
    BlockHash hash;
    int64_t seq;
  };
  int64_t capacity_;
  int64_t clock_ = 0;
  struct Evicted {
    int64_t seq;  // the eviction count when it was (last) evicted
    bool anchored;
  };
  absl::flat_hash_map<BlockHash, Evicted, BlockHashHasher> seq_;
  // Eviction order, oldest first. An entry whose seq no longer matches seq_ is a stale duplicate
  // of a hash evicted again later; it is skipped when trimmed. At most 2 × capacity long.
  std::deque<Entry> order_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_GHOST_LIST_H_
