#include "controller/core/lru_step_index.h"

#include <algorithm>

#include "common/logging.h"

namespace vamp {

void LruStepIndex::Push(int64_t seq, int64_t step, int64_t weight) {
  VAMP_CHECK(runs_.empty() || seq > runs_.back().first_seq)
      << "sequence number " << seq << " is not the newest";
  VAMP_CHECK(weight >= 1) << weight;
  if (!runs_.empty() && runs_.back().step == step) {
    // The newest run continues (its sequence range is open-ended at the back).
    if (runs_.back().count == 0) --empty_runs_;
    runs_.back().count += weight;
  } else {
    runs_.push_back({seq, step, weight});
  }
  size_ += weight;
}

void LruStepIndex::Remove(int64_t seq, int64_t weight) {
  // The run holding `seq`: the last one starting at or before it.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), seq,
                             [](int64_t s, const Run& r) { return s < r.first_seq; });
  VAMP_CHECK(it != runs_.begin()) << "sequence number " << seq << " is not indexed";
  --it;
  VAMP_CHECK(it->count >= weight) << "sequence number " << seq << " is not indexed";
  size_ -= weight;
  it->count -= weight;
  if (it->count > 0) return;
  ++empty_runs_;
  while (!runs_.empty() && runs_.front().count == 0) {
    runs_.pop_front();
    --empty_runs_;
  }
  if (empty_runs_ > 64 && 2 * empty_runs_ > num_runs()) Compact();
}

void LruStepIndex::Compact() {
  // An empty run's sequence range falls to the run before it, which holds no block from that
  // range, so lookups of the blocks still indexed find the same runs. (The front is never empty.)
  runs_.erase(std::remove_if(runs_.begin(), runs_.end(), [](const Run& r) { return r.count == 0; }),
              runs_.end());
  empty_runs_ = 0;
}

int64_t LruStepIndex::CountFromOldestBefore(int64_t step) const {
  int64_t n = 0;
  for (const Run& r : runs_) {
    if (r.count == 0) continue;
    if (r.step >= step) break;
    n += r.count;
  }
  return n;
}

}  // namespace vamp
