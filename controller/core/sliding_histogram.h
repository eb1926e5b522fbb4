// Amounts per bucket summed over a sliding window of time: a ring of `num_slots` slots of
// window_micros / num_slots µs each; a slot is cleared when the window moves past it. Sums cover
// the slots inside the window at the time asked about (the current slot partly), so two
// histograms with the same window give comparable totals — the arbiter compares the offload tax
// and the value of extra KV over the same recent interval this way. Time is the scheduler's
// clock (virtual in vamp-sim), in µs.
//
// Not thread-safe; O(num_buckets) memory per slot.
#ifndef VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_
#define VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace vamp {

class SlidingHistogram {
 public:
  // window_micros >= num_slots >= 1, num_buckets >= 1.
  SlidingHistogram(int64_t window_micros, int32_t num_slots, int32_t num_buckets);

  // Changes the bucket count, keeping the amounts of the buckets that remain.
  void Resize(int32_t num_buckets);
  int32_t num_buckets() const { return num_buckets_; }
  int64_t window_micros() const { return slot_micros_ * static_cast<int64_t>(slots_.size()); }

  // Adds `amount` to `bucket` (clamped to [0, num_buckets)) at time `now_micros`. Time must not
  // go backwards by more than the window (older adds are dropped).
  void Add(int64_t now_micros, int32_t bucket, double amount);
  // Sum of buckets [lo, hi] (clamped) over the window ending at `now_micros`; 0 when lo > hi.
  double Sum(int64_t now_micros, int32_t lo, int32_t hi) const;
  // Zeroes buckets [lo, hi] (clamped) in every slot: what they held is forgotten.
  void Clear(int32_t lo, int32_t hi);

 private:
  struct Slot {
    int64_t epoch = -1;  // time / slot_micros_ of the amounts it holds
    std::vector<double> buckets;
  };
  bool Live(const Slot& slot, int64_t epoch) const {
    return slot.epoch >= 0 && slot.epoch <= epoch &&
           slot.epoch > epoch - static_cast<int64_t>(slots_.size());
  }

  int64_t slot_micros_;
  int32_t num_buckets_;
  std::vector<Slot> slots_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_
