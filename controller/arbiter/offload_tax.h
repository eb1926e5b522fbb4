// The offload tax: what holding g expert groups offloaded costs, per step, measured (shared/
// DESIGN.md, "Beyond the paper"). A step copies the offloaded bytes it needs host→device in one
// of two ways, and stalls for about:
//   - whole region (double-buffered, layer by layer behind compute): every offloaded byte, so a
//     step of compute time K with g groups offloaded stalls for
//         exposed(g) = max(0, s · g · B / bw − f · K) µs
//     with s = 1 (below 1 only in vamp-sim's what-if of prefetched routed experts);
//   - routed (a small step; StepCost::routed): only the offloaded experts its tokens route to, a
//     share s of each group's bytes, copied on the compute path after the layer's router, so
//     nothing hides behind compute:
//         exposed(g) = s · g · B / bw_routed µs;
// B is the bytes one group stages per step on a rank, bw and bw_routed the achieved host→device
// bandwidths of the two kinds of copy and f the share of a step's compute that whole-region
// copies can hide behind (all layers but the first, less the LM head and per-step overhead). The
// stall delays every request in the step.
//
// For each executed step this adds exposed(g) for every reachable g (0..max_groups) to a sliding
// window of time, so WindowMicros(now_micros, g) is the stall that g groups would have cost over
// exactly the recent steps — decode-only and mixed steps, small and large batches, each with
// its own compute time and way of copying. The arbiter compares differences of it with the value
// of extra KV over the same window (ReuseTracker).
//
// Model first, measurements as they arrive: each bandwidth starts at its configured value and
// follows the steps that stalled on that kind of copy with an exponentially weighted mean once
// min_samples such steps were seen: whole region staged bytes / (hidden + exposed) time, routed
// staged bytes / exposed time.
//
// Not thread-safe; the engine thread calls everything.
#ifndef VAMP_CONTROLLER_ARBITER_OFFLOAD_TAX_H_
#define VAMP_CONTROLLER_ARBITER_OFFLOAD_TAX_H_

#include <cstdint>

#include "controller/core/sliding_histogram.h"

namespace vamp {

struct OffloadTaxOptions {
  double h2d_bytes_per_s = 55.5e9;       // start value (DESIGN.md: pinned H2D on the H200 host)
  double routed_h2d_bytes_per_s = 50e9;  // start value of bw_routed (see TaxModelConfig)
  double overlap_fraction = 0.9;         // f
  bool learn_bandwidth = true;
  double ewma_weight = 0.05;
  int32_t min_samples = 16;
  int64_t window_micros = 60'000'000;
  int32_t window_slots = 16;
};

// One executed step as the tax model needs it.
struct StepCost {
  int64_t now_micros = 0;             // scheduler clock when the step's output arrived
  double step_micros = 0;             // as the slowest rank ran it
  double exposed_staging_micros = 0;  // of which waiting for expert copies
  int64_t staged_bytes = 0;           // host→device expert bytes copied in it (one rank)
  // Share of an offloaded group's bytes a step like this one copies: 1 for a whole-region step;
  // below 1 for a routed one (the engine's steps of at most routed_staging_max_tokens tokens),
  // reported for every step, offloaded or not.
  double staged_share = 1;
  // The step copies (or would copy) routed experts only, on the compute path (see above).
  bool routed = false;
};

class OffloadTax {
 public:
  explicit OffloadTax(const OffloadTaxOptions& options);

  // B (bytes one offloaded group stages per step on a rank) and the cap. Cheap when unchanged.
  void SetGeometry(int64_t staged_bytes_per_group, int32_t max_groups);
  int64_t staged_bytes_per_group() const { return bytes_per_group_; }

  void ObserveStep(const StepCost& step);

  // exposed(g) for one step of `compute_micros` (µs) that copies `staged_share` of each group,
  // the whole region's way or (routed) the routed way.
  double StepMicros(int32_t groups, double compute_micros, double staged_share = 1,
                    bool routed = false) const;
  // Σ exposed(g) over the executed steps in the window ending at `step` (µs); groups clamped to
  // [0, max_groups].
  double WindowMicros(int64_t now_micros, int32_t groups) const;
  // Executed steps observed in the window ending at `step`, and their mean duration (µs; 0
  // when none).
  int64_t StepsInWindow(int64_t now_micros) const;
  double MeanStepMicros(int64_t now_micros) const;
  // Σ compute (step time less its exposed staging) over those steps, µs: what the steps would
  // have taken with nothing offloaded.
  double ComputeMicros(int64_t now_micros) const;
  double h2d_bytes_per_s() const;
  int64_t bandwidth_samples() const { return bw_samples_; }
  double routed_h2d_bytes_per_s() const;
  int64_t routed_bandwidth_samples() const { return routed_bw_samples_; }
  int64_t window_micros() const { return tax_.window_micros(); }

 private:
  OffloadTaxOptions options_;
  int64_t bytes_per_group_ = 0;
  int32_t max_groups_ = 0;
  SlidingHistogram tax_;    // bucket g: Σ exposed(g)
  SlidingHistogram steps_;  // bucket 0: executed steps, 1: their µs, 2: their compute µs
  double bw_estimate_ = 0;
  int64_t bw_samples_ = 0;
  double routed_bw_estimate_ = 0;
  int64_t routed_bw_samples_ = 0;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_ARBITER_OFFLOAD_TAX_H_
