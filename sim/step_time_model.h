// The performance model of vamp-sim's simulated agents: how long one model step takes on one
// rank, from the batch's shape and the residency boundary. Roofline terms with effective
// throughputs calibrated on a GPU (calibration.h); the defaults reproduce the H200 measurements
// in shared/DESIGN.md ("Performance references").
//
// Per layer l, compute_l = mixer + MoE + dense projections (+ TP all-reduce), where the mixer is
// attention over the KV cache in a full-attention layer and the delta rule in a Gated DeltaNet
// layer (Qwen3-Next's linear attention; calibrated per prefill token and per decode sequence,
// HardwareCalibration::delta_rule_*). With experts offloaded, layer l+1's offloaded bytes are
// copied host→device while layer l computes (double-buffered staging), so a layer costs
// max(compute_l, copy_{l+1}) and the step
//   total = overhead + Σ_l max(compute_l, copy_{l+1}) + LM head.
// Every offloaded byte is copied once per step whatever the router picks (the staging buffer holds
// all of [b, E) of a layer), which is VAMP's TPOT cost. Two other ways of staging:
//   - StagingMode::kRouted, the engine's routed staging (CudaForwardOptions::
//     routed_staging_max_tokens): a step of at most routed_max_tokens tokens copies, per eligible
//     layer, only the offloaded experts its tokens route to (uniform routing, as the MoE term),
//     after the layer's router and on the compute path, at the routed copy bandwidth:
//       layer l costs compute_l + copy_l;
//     larger steps copy the whole region as above;
//   - StagingMode::kRoutedPrefetch, the what-if issue 18 aims at: every step copies only the
//     routed experts, hidden behind the previous layer as the whole region is — an upper bound,
//     as if the next layer's experts were predicted without a miss.
#ifndef VAMP_SIM_STEP_TIME_MODEL_H_
#define VAMP_SIM_STEP_TIME_MODEL_H_

#include <cstdint>
#include <vector>

#include "sim/calibration.h"

namespace vamp::sim {

// One sequence's work in a step.
struct SequenceWork {
  int32_t new_tokens = 0;      // prefill chunk length, or 1 for decode
  int64_t context_tokens = 0;  // tokens already in the KV cache before this step
};

enum class StagingMode { kWholeRegion, kRouted, kRoutedPrefetch };

struct StepTime {
  double compute_us = 0;       // all layers' compute, no staging
  double copy_us = 0;          // host→device copy time of the bytes copied
  double copy_share = 1;       // share of the offloaded bytes copied (1 for kWholeRegion)
  bool routed = false;         // copied the routed way, on the compute path (kRouted)
  double exposed_copy_us = 0;  // copy time not hidden behind compute
  double total_us = 0;         // the step as the client sees it
};

class StepTimeModel {
 public:
  // routed_max_tokens: the largest step kRouted stages the routed way.
  explicit StepTimeModel(const Calibration& calibration,
                         StagingMode staging = StagingMode::kWholeRegion,
                         int64_t routed_max_tokens = 0)
      : c_(calibration), staging_(staging), routed_max_tokens_(routed_max_tokens) {}

  // `offloaded_experts_per_layer`: experts above the residency boundary in each eligible layer
  // (every MoE layer but the first). 0 = fully resident.
  StepTime Estimate(const std::vector<SequenceWork>& batch,
                    int32_t offloaded_experts_per_layer) const;

  // Microseconds of one MoE layer for `tokens` tokens (routed experts, this rank's shard).
  double MoeLayerMicros(int64_t tokens) const;
  // Microseconds of one Gated DeltaNet layer's delta rule (this rank's value heads) for
  // `prefill_tokens` tokens of prefill rows and `decode_seqs` decode rows; 0 for a model without
  // linear attention.
  double DeltaRuleLayerMicros(int64_t prefill_tokens, int64_t decode_seqs) const;
  // Expected share of a layer's experts that `tokens` tokens route to (uniform routing).
  double RoutedShare(int64_t tokens) const;

  const Calibration& calibration() const { return c_; }

 private:
  Calibration c_;
  StagingMode staging_;
  int64_t routed_max_tokens_;
};

}  // namespace vamp::sim

#endif  // VAMP_SIM_STEP_TIME_MODEL_H_
