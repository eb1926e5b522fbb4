// How one executed step staged offloaded experts, as the agent reports it to the controller
// (StepTimings.routed_staging and staged_share): the controller prices holding experts offloaded
// per step (controller/arbiter/offload_tax.h), and it needs that figure for steps taken while
// nothing is offloaded too, to price the first offload.
//
//   - routed: the step had at most routed_max_tokens tokens (> 0), so the device copied (or would
//     have copied) only the offloaded experts its tokens route to, on the compute path; a step
//     that staged bytes without a routed pass is whole-region whatever its size;
//   - share: the share of each offloaded layer's bytes the step copied: 1 for whole-region steps;
//     for routed steps the measured routed bytes / offloaded bytes of the layers served when
//     there were any, else the uniform-routing expectation for the step's tokens
//     (common/uniform_routing.h).
#ifndef VAMP_AGENT_STEP_STAGING_H_
#define VAMP_AGENT_STEP_STAGING_H_

#include <cstdint>

#include "engine/staging/host_staging_engine.h"

namespace vamp {

struct StepStaging {
  bool routed = false;
  double share = 1;  // in [0, 1]
};

// `before` and `after`: the rank's staging statistics around the step; `step_tokens`: the tokens
// the step computed; top_k and num_experts: the model's routing.
StepStaging DescribeStepStaging(const StagingStats& before, const StagingStats& after,
                                int64_t step_tokens, int64_t routed_max_tokens, int64_t top_k,
                                int64_t num_experts);

}  // namespace vamp

#endif  // VAMP_AGENT_STEP_STAGING_H_
