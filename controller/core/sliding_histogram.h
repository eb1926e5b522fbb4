// Amounts per bucket summed over the latest scheduler steps: a ring of `num_slots` slots of
// window_steps / num_slots steps each; a slot is cleared when the window moves past it. Sums cover
// the slots inside the window at the step asked about (the current slot partly), so two
// histograms with the same window give comparable totals — the arbiter compares the offload tax
// and the value of extra KV over the same recent steps this way.
//
// Not thread-safe; O(num_buckets) memory per slot.
#ifndef VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_
#define VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace vamp {

class SlidingHistogram {
 public:
  // window_steps >= num_slots >= 1, num_buckets >= 1.
  SlidingHistogram(int64_t window_steps, int32_t num_slots, int32_t num_buckets);

  // Changes the bucket count, keeping the amounts of the buckets that remain.
  void Resize(int32_t num_buckets);
  int32_t num_buckets() const { return num_buckets_; }
  int64_t window_steps() const { return slot_steps_ * static_cast<int64_t>(slots_.size()); }

  // Adds `amount` to `bucket` (clamped to [0, num_buckets)) at scheduler step `step`. Steps must
  // not go backwards by more than the window (older adds are dropped).
  void Add(int64_t step, int32_t bucket, double amount);
  // Sum of buckets [lo, hi] (clamped) over the window ending at `step`; 0 when lo > hi.
  double Sum(int64_t step, int32_t lo, int32_t hi) const;

 private:
  struct Slot {
    int64_t epoch = -1;  // step / slot_steps_ of the amounts it holds
    std::vector<double> buckets;
  };
  bool Live(const Slot& slot, int64_t epoch) const {
    return slot.epoch >= 0 && slot.epoch <= epoch &&
           slot.epoch > epoch - static_cast<int64_t>(slots_.size());
  }

  int64_t slot_steps_;
  int32_t num_buckets_;
  std::vector<Slot> slots_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_SLIDING_HISTOGRAM_H_
