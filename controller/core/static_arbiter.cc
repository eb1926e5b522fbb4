#include "controller/core/static_arbiter.h"

#include <algorithm>
#include <tuple>

namespace vamp {

const Request* NewestRunningRequest(const ArbiterContext& context, SchedulingPolicy policy) {
  if (context.num_running() == 0) return nullptr;
  if (policy == SchedulingPolicy::kFcfs) return &context.running(context.num_running() - 1);
  const Request* victim = &context.running(0);
  for (int32_t i = 1; i < context.num_running(); ++i) {
    const Request& r = context.running(i);
    if (std::make_tuple(r.priority(), r.arrival_micros(), r.seq()) >
        std::make_tuple(victim->priority(), victim->arrival_micros(), victim->seq())) {
      victim = &r;
    }
  }
  return victim;
}

ArbiterPlan StaticArbiter::Decide(const ArbiterContext& context, const MemoryGap& gap) {
  ArbiterPlan plan;
  plan.evict_blocks = std::min(gap.blocks, context.pool().num_free_cached());
  if (plan.evict_blocks < gap.blocks && gap.requester_running) {
    if (const Request* victim = NewestRunningRequest(context, context.config().policy)) {
      plan.preempt.push_back(victim->id());
    }
  }
  if (plan.evict_blocks > 0 && !plan.preempt.empty()) {
    plan.choice = "evict+preempt";
  } else if (plan.evict_blocks > 0) {
    plan.choice = "evict";
  } else if (!plan.preempt.empty()) {
    plan.choice = "preempt";
  } else {
    plan.choice = "wait";
  }
  return plan;
}

}  // namespace vamp
