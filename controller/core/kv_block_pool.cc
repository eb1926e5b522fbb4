#include "controller/core/kv_block_pool.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace vamp {

KvBlockPool::KvBlockPool(int32_t num_blocks, bool enable_caching)
    : caching_enabled_(enable_caching) {
  VAMP_CHECK(num_blocks > 0) << num_blocks;
  VAMP_CHECK(Grow(num_blocks).ok());
}

double KvBlockPool::Usage() const {
  return blocks_.empty() ? 0.0 : static_cast<double>(num_used_) / blocks_.size();
}

void KvBlockPool::AllocateUncached(int32_t n, std::vector<BlockId>* out) {
  VAMP_CHECK(n >= 0 && n <= free_.num_uncached())
      << "asked for " << n << " blocks, " << free_.num_uncached() << " uncached free";
  for (int32_t i = 0; i < n; ++i) {
    const BlockId id = free_.PopUncached();
    KvBlock& b = blocks_[id];
    b.ref_count = 1;
    b.last_used_step = step_;
    ++num_used_;
    out->push_back(id);
  }
}

void KvBlockPool::Uncache(KvBlock& b) {
  cache_.erase(b.hash);
  b.cached = false;
  b.hash = BlockHash{};
  if (b.snapshot != kNoSnapshot) {
    const SnapshotId id = b.snapshot;
    b.snapshot = kNoSnapshot;
    b.snapshot_blocks = 0;
    ReleaseSnapshotBlocks(id);
  }
}

void KvBlockPool::LeaveCachedSegment(KvBlock& b) {
  cached_steps_.Remove(b.lru_seq, b.EvictionBlocks());
  free_snapshot_blocks_ -= b.snapshot_blocks;
}

int32_t KvBlockPool::EvictCached(int32_t n) {
  int32_t freed = 0;
  while (freed < n && free_.num_cached() > 0) {
    KvBlock& b = blocks_[free_.DemoteOldestCached()];
    LeaveCachedSegment(b);
    if (on_evict_) on_evict_(b.hash, b.snapshot != kNoSnapshot);
    freed += b.EvictionBlocks();
    Uncache(b);
    ++num_evicted_;
  }
  return freed;
}

SnapshotId KvBlockPool::AllocateSnapshot(int32_t n) {
  VAMP_CHECK(n > 0 && n <= free_.num_uncached())
      << "a snapshot of " << n << " blocks, " << free_.num_uncached() << " uncached free";
  SnapshotId id;
  if (!free_snapshot_ids_.empty()) {
    id = free_snapshot_ids_.back();
    free_snapshot_ids_.pop_back();
  } else {
    id = static_cast<SnapshotId>(snapshots_.size());
    snapshots_.emplace_back();
  }
  StateSnapshot& snapshot = snapshots_[id];
  for (int32_t i = 0; i < n; ++i) {
    const BlockId b = free_.PopUncached();
    blocks_[b].stores = id;
    blocks_[b].last_used_step = step_;
    snapshot.blocks.push_back(b);
  }
  num_snapshot_blocks_ += n;
  return id;
}

bool KvBlockPool::AttachSnapshot(SnapshotId id, BlockId anchor, int32_t num_tokens) {
  StateSnapshot& snapshot = snapshots_[id];
  VAMP_CHECK(!snapshot.blocks.empty() && snapshot.anchor == kNoBlock)
      << "snapshot " << id << " is not held by a request";
  KvBlock& a = blocks_[anchor];
  if (!a.cached || a.ref_count == 0 || a.snapshot != kNoSnapshot || InShrinkingTail(anchor)) {
    return false;
  }
  for (BlockId b : snapshot.blocks) {
    if (InShrinkingTail(b)) return false;
  }
  snapshot.anchor = anchor;
  snapshot.num_tokens = num_tokens;
  a.snapshot = id;
  a.snapshot_blocks = static_cast<int32_t>(snapshot.blocks.size());
  return true;
}

void KvBlockPool::FreeSnapshot(SnapshotId id) {
  VAMP_CHECK(!snapshots_[id].blocks.empty() && snapshots_[id].anchor == kNoBlock)
      << "snapshot " << id << " is not held by a request";
  ReleaseSnapshotBlocks(id);
}

void KvBlockPool::ReleaseSnapshotBlocks(SnapshotId id) {
  StateSnapshot& snapshot = snapshots_[id];
  for (BlockId b : snapshot.blocks) {
    KvBlock& block = blocks_[b];
    block.stores = kNoSnapshot;
    block.last_used_step = step_;
    if (InShrinkingTail(b)) {
      block.withdrawn = true;
      ++num_withdrawn_;
    } else {
      free_.PushUncachedFront(b);
    }
  }
  num_snapshot_blocks_ -= static_cast<int32_t>(snapshot.blocks.size());
  snapshot = StateSnapshot{};
  free_snapshot_ids_.push_back(id);
}

BlockId KvBlockPool::Lookup(const BlockHash& hash) const {
  auto it = cache_.find(hash);
  return it == cache_.end() ? kNoBlock : it->second;
}

void KvBlockPool::Acquire(BlockId id) {
  KvBlock& b = blocks_[id];
  VAMP_CHECK(!b.withdrawn) << "block " << id << " is withdrawn";
  if (b.ref_count == 0) {
    if (free_.ContainsCached(id)) LeaveCachedSegment(b);
    free_.Remove(id);
    ++num_used_;
  }
  ++b.ref_count;
  b.last_used_step = step_;
}

void KvBlockPool::Withdraw(KvBlock& b) {
  if (b.cached) {
    if (on_evict_) on_evict_(b.hash, b.snapshot != kNoSnapshot);
    Uncache(b);
    ++num_evicted_;
  }
  b.withdrawn = true;
  ++num_withdrawn_;
}

void KvBlockPool::Release(BlockId id) {
  KvBlock& b = blocks_[id];
  VAMP_CHECK(b.ref_count > 0) << "block " << id << " released with no user";
  b.last_used_step = step_;
  if (--b.ref_count > 0) return;
  --num_used_;
  if (InShrinkingTail(id)) {
    Withdraw(b);
  } else if (b.cached) {
    b.lru_seq = lru_clock_;
    lru_clock_ += b.EvictionBlocks();
    free_.PushCached(id);
    cached_steps_.Push(b.lru_seq, b.last_used_step, b.EvictionBlocks());
    free_snapshot_blocks_ += b.snapshot_blocks;
  } else {
    free_.PushUncachedFront(id);
  }
}

bool KvBlockPool::Cache(BlockId id, const BlockHash& hash) {
  KvBlock& b = blocks_[id];
  if (!caching_enabled_ || b.cached || InShrinkingTail(id)) return false;
  // A free uncached block holds no content worth registering (it was never filled for anyone).
  VAMP_CHECK(b.ref_count > 0) << "caching free block " << id;
  if (!cache_.try_emplace(hash, id).second) return false;
  b.cached = true;
  b.hash = hash;
  return true;
}

absl::Status KvBlockPool::Grow(int32_t n) {
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("Grow: n must be > 0, got ", n));
  if (shrink_pending()) {
    return absl::FailedPreconditionError("Grow: a shrink is pending; commit or cancel it first");
  }
  if (n > std::numeric_limits<BlockId>::max() - num_blocks()) {
    return absl::OutOfRangeError(absl::StrCat("Grow: ", n, " more blocks overflow block ids"));
  }
  const BlockId first = num_blocks();
  blocks_.resize(first + n);
  free_.Resize(first + n);
  for (BlockId id = first; id < first + n; ++id) {
    blocks_[id].id = id;
    blocks_[id].last_used_step = step_;
    free_.PushUncachedBack(id);
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::BeginShrink(int32_t n) {
  if (shrink_pending()) return absl::FailedPreconditionError("BeginShrink: a shrink is pending");
  if (n <= 0 || n >= num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginShrink: n must be in [1, ", num_blocks() - 1, "], got ", n));
  }
  shrink_begin_ = num_blocks() - n;
  // Attached snapshots with their anchor or a block in the tail go first: a free anchor is evicted
  // with its snapshot (its weight in the LRU segment cannot change in place), one in use loses it.
  for (SnapshotId id = 0; id < static_cast<SnapshotId>(snapshots_.size()); ++id) {
    const StateSnapshot& snapshot = snapshots_[id];
    if (snapshot.anchor == kNoBlock) continue;  // free or held
    const bool in_tail = InShrinkingTail(snapshot.anchor) ||
                         std::any_of(snapshot.blocks.begin(), snapshot.blocks.end(),
                                     [&](BlockId b) { return InShrinkingTail(b); });
    if (!in_tail) continue;
    KvBlock& anchor = blocks_[snapshot.anchor];
    if (anchor.ref_count > 0) {
      anchor.snapshot = kNoSnapshot;
      anchor.snapshot_blocks = 0;
      ReleaseSnapshotBlocks(id);
      continue;
    }
    LeaveCachedSegment(anchor);
    free_.Remove(anchor.id);
    if (on_evict_) on_evict_(anchor.hash, /*anchored=*/true);
    Uncache(anchor);
    ++num_evicted_;
    free_.PushUncachedFront(anchor.id);  // withdrawn below when in the tail
  }
  for (BlockId id = shrink_begin_; id < num_blocks(); ++id) {
    KvBlock& b = blocks_[id];
    if (b.withdrawn || b.stores != kNoSnapshot) continue;  // a snapshot's, withdrawn when freed
    if (b.ref_count == 0) {
      if (free_.ContainsCached(id)) LeaveCachedSegment(b);
      free_.Remove(id);
      Withdraw(b);
    } else if (b.cached) {
      // Its content leaves the cache with the tail; still in use, just no longer shareable.
      if (on_evict_) on_evict_(b.hash, b.snapshot != kNoSnapshot);
      Uncache(b);
    }
  }
  return absl::OkStatus();
}

int32_t KvBlockPool::shrink_outstanding() const {
  return shrink_pending() ? (num_blocks() - shrink_begin_) - num_withdrawn_ : 0;
}

absl::Status KvBlockPool::CommitShrink() {
  if (!shrink_pending()) return absl::FailedPreconditionError("CommitShrink: no shrink pending");
  if (shrink_outstanding() > 0) {
    return absl::FailedPreconditionError(absl::StrCat("CommitShrink: ", shrink_outstanding(),
                                                      " blocks of the tail are still in use"));
  }
  blocks_.resize(shrink_begin_);
  free_.Resize(shrink_begin_);
  num_withdrawn_ = 0;
  shrink_begin_ = kNoBlock;
  return absl::OkStatus();
}

absl::Status KvBlockPool::CancelShrink() {
  if (!shrink_pending()) return absl::FailedPreconditionError("CancelShrink: no shrink pending");
  for (BlockId id = shrink_begin_; id < num_blocks(); ++id) {
    KvBlock& b = blocks_[id];
    if (b.withdrawn) {
      b.withdrawn = false;
      free_.PushUncachedBack(id);
    }
  }
  num_withdrawn_ = 0;
  shrink_begin_ = kNoBlock;
  return absl::OkStatus();
}

int64_t KvBlockPool::CachedFreeDepth(BlockId id) const {
  if (id < 0 || id >= num_blocks() || !free_.ContainsCached(id)) return 0;
  const int64_t oldest = blocks_[free_.OldestCached()].lru_seq;
  const KvBlock& newest_block = blocks_[free_.NewestCached()];
  const int64_t newest = newest_block.lru_seq;
  if (newest <= oldest) return 0;
  // Stamps grow by each block's EvictionBlocks() from the LRU end to the back; scale the stamp
  // distance by the share of the weight in that range still present.
  const double share =
      static_cast<double>(num_free_cached() - newest_block.EvictionBlocks()) / (newest - oldest);
  return static_cast<int64_t>(static_cast<double>(blocks_[id].lru_seq - oldest) * share);
}

absl::Status KvBlockPool::CheckInvariants() const {
  int32_t used = 0, withdrawn = 0, cached = 0, snapshot_blocks = 0, free_snapshot_blocks = 0;
  for (BlockId id = 0; id < num_blocks(); ++id) {
    const KvBlock& b = blocks_[id];
    if (b.id != id) return absl::InternalError(absl::StrCat("block ", id, " has id ", b.id));
    if (b.ref_count < 0) return absl::InternalError(absl::StrCat("block ", id, " ref < 0"));
    if (b.ref_count > 0) ++used;
    if (b.stores != kNoSnapshot) {
      ++snapshot_blocks;
      const std::vector<BlockId>& held = b.stores < static_cast<SnapshotId>(snapshots_.size())
                                             ? snapshots_[b.stores].blocks
                                             : std::vector<BlockId>{};
      if (b.ref_count != 0 || free_.Contains(id) || b.withdrawn || b.cached ||
          std::find(held.begin(), held.end(), id) == held.end()) {
        return absl::InternalError(
            absl::StrCat("block ", id, " stores snapshot ", b.stores, " but is also live"));
      }
      continue;
    }
    if (b.snapshot != kNoSnapshot) {
      if (!b.cached || b.snapshot >= static_cast<SnapshotId>(snapshots_.size()) ||
          snapshots_[b.snapshot].anchor != id ||
          static_cast<int32_t>(snapshots_[b.snapshot].blocks.size()) != b.snapshot_blocks) {
        return absl::InternalError(
            absl::StrCat("block ", id, " anchors snapshot ", b.snapshot, " inconsistently"));
      }
      if (free_.ContainsCached(id)) free_snapshot_blocks += b.snapshot_blocks;
    } else if (b.snapshot_blocks != 0) {
      return absl::InternalError(absl::StrCat("block ", id, " counts a snapshot it lacks"));
    }
    if (b.withdrawn) {
      ++withdrawn;
      if (b.ref_count != 0 || free_.Contains(id) || !InShrinkingTail(id) || b.cached) {
        return absl::InternalError(absl::StrCat("withdrawn block ", id, " is also live"));
      }
    } else if ((b.ref_count == 0) != free_.Contains(id)) {
      return absl::InternalError(absl::StrCat("block ", id, " ref_count ", b.ref_count,
                                              " but in free queue: ", free_.Contains(id)));
    }
    if (free_.Contains(id) && free_.ContainsCached(id) != b.cached) {
      return absl::InternalError(absl::StrCat("block ", id, " in the wrong queue segment"));
    }
    if (b.cached) {
      ++cached;
      if (InShrinkingTail(id)) {
        return absl::InternalError(absl::StrCat("block ", id, " cached in a shrinking tail"));
      }
      auto it = cache_.find(b.hash);
      if (it == cache_.end() || it->second != id) {
        return absl::InternalError(absl::StrCat("block ", id, " cached but not in the map"));
      }
    }
  }
  if (cached != static_cast<int32_t>(cache_.size())) {
    return absl::InternalError(
        absl::StrCat("cache map has ", cache_.size(), " entries, ", cached, " cached blocks"));
  }
  if (used != num_used_ || withdrawn != num_withdrawn_) {
    return absl::InternalError(absl::StrCat("counters: used ", num_used_, " vs ", used,
                                            ", withdrawn ", num_withdrawn_, " vs ", withdrawn));
  }
  if (snapshot_blocks != num_snapshot_blocks_ || free_snapshot_blocks != free_snapshot_blocks_) {
    return absl::InternalError(absl::StrCat("snapshot blocks ", num_snapshot_blocks_, " vs ",
                                            snapshot_blocks, ", of free anchors ",
                                            free_snapshot_blocks_, " vs ", free_snapshot_blocks));
  }
  for (SnapshotId id = 0; id < static_cast<SnapshotId>(snapshots_.size()); ++id) {
    const StateSnapshot& snapshot = snapshots_[id];
    for (BlockId b : snapshot.blocks) {
      if (b < 0 || b >= num_blocks() || blocks_[b].stores != id) {
        return absl::InternalError(absl::StrCat("snapshot ", id, " lists block ", b));
      }
    }
    if (snapshot.anchor != kNoBlock &&
        (snapshot.anchor >= num_blocks() || blocks_[snapshot.anchor].snapshot != id)) {
      return absl::InternalError(absl::StrCat("snapshot ", id, " has anchor ", snapshot.anchor,
                                              " that does not anchor it"));
    }
  }
  if (used + free_.size() + withdrawn + snapshot_blocks != num_blocks()) {
    return absl::InternalError(absl::StrCat("used ", used, " + free ", free_.size(),
                                            " + withdrawn ", withdrawn, " + snapshots ",
                                            snapshot_blocks, " != ", num_blocks()));
  }
  // Queue layout: all uncached blocks, then cached ones in non-decreasing last-use order.
  bool seen_cached = false;
  int64_t last_step = std::numeric_limits<int64_t>::min();
  std::vector<std::pair<int64_t, int64_t>> runs;  // (step, blocks) of the cached segment
  for (BlockId id : free_.ToVector()) {
    const KvBlock& b = blocks_[id];
    if (b.cached) {
      seen_cached = true;
      if (b.last_used_step < last_step) {
        return absl::InternalError(absl::StrCat("cached free block ", id, " out of LRU order"));
      }
      if (runs.empty() || b.last_used_step != last_step) runs.emplace_back(b.last_used_step, 0);
      runs.back().second += b.EvictionBlocks();
      last_step = b.last_used_step;
    } else if (seen_cached) {
      return absl::InternalError(absl::StrCat("uncached block ", id, " behind cached ones"));
    }
  }
  // The step index agrees with the queue (neighbouring runs of one step merged on both sides).
  std::vector<std::pair<int64_t, int64_t>> indexed;
  cached_steps_.ForEachRun([&](int64_t step, int64_t count) {
    if (!indexed.empty() && indexed.back().first == step) {
      indexed.back().second += count;
    } else {
      indexed.emplace_back(step, count);
    }
  });
  if (indexed != runs || cached_steps_.size() != num_free_cached()) {
    return absl::InternalError("the LRU step index disagrees with the cached free blocks");
  }
  return absl::OkStatus();
}

}  // namespace vamp
