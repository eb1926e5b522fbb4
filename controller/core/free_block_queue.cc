#include "controller/core/free_block_queue.h"

#include "common/logging.h"

namespace vamp {

FreeBlockQueue::FreeBlockQueue(int32_t capacity) { Resize(capacity); }

void FreeBlockQueue::Resize(int32_t capacity) {
  VAMP_CHECK(capacity >= 0) << capacity;
  for (BlockId id = capacity; id < static_cast<BlockId>(segment_.size()); ++id) {
    VAMP_CHECK(segment_[id] == kNone) << "block " << id << " is still queued";
  }
  prev_.resize(capacity, kNoBlock);
  next_.resize(capacity, kNoBlock);
  segment_.resize(capacity, kNone);
}

void FreeBlockQueue::LinkBefore(BlockId id, BlockId before) {
  if (before == kNoBlock) {
    prev_[id] = tail_;
    next_[id] = kNoBlock;
    if (tail_ != kNoBlock) next_[tail_] = id;
    tail_ = id;
    if (head_ == kNoBlock) head_ = id;
    return;
  }
  const BlockId p = prev_[before];
  prev_[id] = p;
  next_[id] = before;
  prev_[before] = id;
  if (p != kNoBlock) {
    next_[p] = id;
  } else {
    head_ = id;
  }
}

void FreeBlockQueue::Unlink(BlockId id) {
  const BlockId p = prev_[id];
  const BlockId n = next_[id];
  if (p != kNoBlock) {
    next_[p] = n;
  } else {
    head_ = n;
  }
  if (n != kNoBlock) {
    prev_[n] = p;
  } else {
    tail_ = p;
  }
  prev_[id] = kNoBlock;
  next_[id] = kNoBlock;
}

void FreeBlockQueue::PushUncachedFront(BlockId id) {
  VAMP_CHECK(segment_[id] == kNone) << "block " << id << " already queued";
  LinkBefore(id, head_);
  segment_[id] = kUncached;
  ++num_uncached_;
}

void FreeBlockQueue::PushUncachedBack(BlockId id) {
  VAMP_CHECK(segment_[id] == kNone) << "block " << id << " already queued";
  LinkBefore(id, first_cached_);
  segment_[id] = kUncached;
  ++num_uncached_;
}

void FreeBlockQueue::PushCached(BlockId id) {
  VAMP_CHECK(segment_[id] == kNone) << "block " << id << " already queued";
  LinkBefore(id, kNoBlock);
  segment_[id] = kCached;
  if (first_cached_ == kNoBlock) first_cached_ = id;
  ++num_cached_;
}

BlockId FreeBlockQueue::PopUncached() {
  VAMP_CHECK(num_uncached_ > 0) << "no uncached free block";
  const BlockId id = head_;
  Unlink(id);
  segment_[id] = kNone;
  --num_uncached_;
  return id;
}

void FreeBlockQueue::Remove(BlockId id) {
  VAMP_CHECK(segment_[id] != kNone) << "block " << id << " is not queued";
  if (segment_[id] == kCached) {
    if (first_cached_ == id) first_cached_ = next_[id];  // the next node is cached or none
    --num_cached_;
  } else {
    --num_uncached_;
  }
  Unlink(id);
  segment_[id] = kNone;
}

BlockId FreeBlockQueue::DemoteOldestCached() {
  VAMP_CHECK(num_cached_ > 0) << "no cached free block";
  const BlockId id = first_cached_;
  first_cached_ = next_[id];
  segment_[id] = kUncached;
  --num_cached_;
  ++num_uncached_;
  return id;
}

std::vector<BlockId> FreeBlockQueue::ToVector() const {
  std::vector<BlockId> out;
  out.reserve(size());
  for (BlockId id = head_; id != kNoBlock; id = next_[id]) out.push_back(id);
  return out;
}

}  // namespace vamp
