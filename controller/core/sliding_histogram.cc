#include "controller/core/sliding_histogram.h"

#include <algorithm>

#include "common/logging.h"

namespace vamp {

SlidingHistogram::SlidingHistogram(int64_t window_micros, int32_t num_slots, int32_t num_buckets)
    : num_buckets_(num_buckets) {
  VAMP_CHECK(num_slots >= 1 && window_micros >= num_slots && num_buckets >= 1)
      << window_micros << " µs, " << num_slots << " slots, " << num_buckets << " buckets";
  slot_micros_ = window_micros / num_slots;
  slots_.resize(num_slots);
  for (Slot& s : slots_) s.buckets.assign(num_buckets, 0.0);
}

void SlidingHistogram::Resize(int32_t num_buckets) {
  VAMP_CHECK(num_buckets >= 1) << num_buckets;
  num_buckets_ = num_buckets;
  for (Slot& s : slots_) s.buckets.resize(num_buckets, 0.0);
}

void SlidingHistogram::Add(int64_t now_micros, int32_t bucket, double amount) {
  const int64_t epoch = std::max<int64_t>(0, now_micros) / slot_micros_;
  Slot& slot = slots_[epoch % static_cast<int64_t>(slots_.size())];
  if (slot.epoch != epoch) {
    if (slot.epoch > epoch) return;  // older than the window
    slot.epoch = epoch;
    std::fill(slot.buckets.begin(), slot.buckets.end(), 0.0);
  }
  slot.buckets[std::clamp(bucket, 0, num_buckets_ - 1)] += amount;
}

void SlidingHistogram::Clear(int32_t lo, int32_t hi) {
  lo = std::max(lo, 0);
  hi = std::min(hi, num_buckets_ - 1);
  for (Slot& s : slots_) {
    for (int32_t b = lo; b <= hi; ++b) s.buckets[b] = 0;
  }
}

double SlidingHistogram::Sum(int64_t now_micros, int32_t lo, int32_t hi) const {
  lo = std::max(lo, 0);
  hi = std::min(hi, num_buckets_ - 1);
  if (lo > hi) return 0;
  const int64_t epoch = std::max<int64_t>(0, now_micros) / slot_micros_;
  double sum = 0;
  for (const Slot& s : slots_) {
    if (!Live(s, epoch)) continue;
    for (int32_t b = lo; b <= hi; ++b) sum += s.buckets[b];
  }
  return sum;
}

}  // namespace vamp
