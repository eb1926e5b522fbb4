#include "controller/arbiter/offload_tax.h"

#include <algorithm>
#include <cmath>

namespace vamp {

OffloadTax::OffloadTax(const OffloadTaxOptions& options)
    : options_(options),
      tax_(options.window_micros, options.window_slots, 1),
      steps_(options.window_micros, options.window_slots, 3) {}

double OffloadTax::MeanStepMicros(int64_t now_micros) const {
  const double n = steps_.Sum(now_micros, 0, 0);
  return n > 0 ? steps_.Sum(now_micros, 1, 1) / n : 0;
}

double OffloadTax::ComputeMicros(int64_t now_micros) const {
  return steps_.Sum(now_micros, 2, 2);
}

int64_t OffloadTax::StepsInWindow(int64_t now_micros) const {
  return static_cast<int64_t>(steps_.Sum(now_micros, 0, 0));
}

void OffloadTax::SetGeometry(int64_t staged_bytes_per_group, int32_t max_groups) {
  bytes_per_group_ = std::max<int64_t>(0, staged_bytes_per_group);
  if (max_groups != max_groups_) {
    max_groups_ = std::max(0, max_groups);
    tax_.Resize(max_groups_ + 1);
  }
}

double OffloadTax::h2d_bytes_per_s() const {
  return bw_samples_ >= options_.min_samples ? bw_estimate_ : options_.h2d_bytes_per_s;
}

double OffloadTax::routed_h2d_bytes_per_s() const {
  return routed_bw_samples_ >= options_.min_samples ? routed_bw_estimate_
                                                    : options_.routed_h2d_bytes_per_s;
}

double OffloadTax::StepMicros(int32_t groups, double compute_micros, double staged_share,
                              bool routed) const {
  const double bw = routed ? routed_h2d_bytes_per_s() : h2d_bytes_per_s();
  if (groups <= 0 || bytes_per_group_ <= 0 || !(bw > 0)) return 0;
  const double share = std::isfinite(staged_share) ? std::clamp(staged_share, 0.0, 1.0) : 1.0;
  const double copy = 1e6 * share * static_cast<double>(groups) * bytes_per_group_ / bw;
  if (routed) return copy;
  return std::max(0.0, copy - options_.overlap_fraction * std::max(0.0, compute_micros));
}

void OffloadTax::ObserveStep(const StepCost& s) {
  if (!std::isfinite(s.step_micros) || !std::isfinite(s.exposed_staging_micros) ||
      s.step_micros <= 0) {
    return;
  }
  const double exposed = std::clamp(s.exposed_staging_micros, 0.0, s.step_micros);
  const double compute = s.step_micros - exposed;
  if (options_.learn_bandwidth && s.staged_bytes > 0 && exposed > 0) {
    // Copy-bound: whole-region copies ran through the hidden share of compute and the exposed
    // stall; routed copies through the exposed time alone.
    const double seconds =
        (s.routed ? exposed : options_.overlap_fraction * compute + exposed) * 1e-6;
    const double sample = static_cast<double>(s.staged_bytes) / seconds;
    double& estimate = s.routed ? routed_bw_estimate_ : bw_estimate_;
    int64_t& samples = s.routed ? routed_bw_samples_ : bw_samples_;
    estimate = samples == 0 ? sample
                            : (1 - options_.ewma_weight) * estimate + options_.ewma_weight * sample;
    ++samples;
  }
  steps_.Add(s.now_micros, 0, 1);
  steps_.Add(s.now_micros, 1, s.step_micros);
  steps_.Add(s.now_micros, 2, compute);
  for (int32_t g = 1; g <= max_groups_; ++g) {
    tax_.Add(s.now_micros, g, StepMicros(g, compute, s.staged_share, s.routed));
  }
}

double OffloadTax::WindowMicros(int64_t now_micros, int32_t groups) const {
  groups = std::clamp(groups, 0, max_groups_);
  return groups == 0 ? 0 : tax_.Sum(now_micros, groups, groups);
}

}  // namespace vamp
