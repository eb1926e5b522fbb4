// The baseline arbiter, vLLM 0.15's behaviour: cover the gap by evicting cached free blocks in LRU
// order; if that is not enough and the requester is running, preempt the newest running request
// (the requester itself when it is the newest). A waiting requester never preempts anyone: it
// waits. It never offloads.
#ifndef VAMP_CONTROLLER_CORE_STATIC_ARBITER_H_
#define VAMP_CONTROLLER_CORE_STATIC_ARBITER_H_

#include "controller/core/memory_arbiter.h"

namespace vamp {

class StaticArbiter final : public MemoryArbiter {
 public:
  absl::string_view name() const override { return "static"; }
  ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) override;
};

// The running request preemption takes first under `policy`: the most recently admitted (FCFS), or
// the one with the largest (priority, arrival, seq) key (priority). Null when none runs.
const Request* NewestRunningRequest(const ArbiterContext& context, SchedulingPolicy policy);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_STATIC_ARBITER_H_
