#include "controller/core/ghost_list.h"

namespace vamp {

void GhostList::set_capacity(int64_t capacity) {
  capacity_ = capacity < 0 ? 0 : capacity;
  Trim();
}

void GhostList::Add(const BlockHash& hash, bool anchored) {
  ++clock_;
  if (capacity_ == 0) return;
  seq_[hash] = {clock_, anchored};
  order_.push_back({hash, clock_});
  Trim();
}

int64_t GhostList::Depth(const BlockHash& hash) const {
  auto it = seq_.find(hash);
  return it == seq_.end() ? 0 : clock_ - it->second.seq + 1;
}

bool GhostList::Anchored(const BlockHash& hash) const {
  auto it = seq_.find(hash);
  return it != seq_.end() && it->second.anchored;
}

void GhostList::Trim() {
  // Forget the oldest live entries beyond capacity, and stale duplicates when the FIFO has grown
  // past twice the capacity (so re-evicted hashes cannot make it grow without bound).
  while (!order_.empty() &&
         (static_cast<int64_t>(seq_.size()) > capacity_ ||
          static_cast<int64_t>(order_.size()) > 2 * capacity_)) {
    const Entry& e = order_.front();
    auto it = seq_.find(e.hash);
    if (it != seq_.end() && it->second.seq == e.seq) seq_.erase(it);
    order_.pop_front();
  }
}

}  // namespace vamp
