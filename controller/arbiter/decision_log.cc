#include "controller/arbiter/decision_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace vamp {

DecisionLog::DecisionLog(size_t capacity) : capacity_(capacity) {
  VAMP_CHECK(capacity > 0) << "decision log capacity must be positive";
}

void DecisionLog::AppendLocked(int64_t time_micros, const ArbiterRecord& record) {
  DecisionLogEntry entry{time_micros, record};
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(entry));
  } else {
    ring_[next_] = std::move(entry);
    next_ = (next_ + 1) % capacity_;
  }
  ++counts_.decisions;
  ++counts_.by_choice[record.plan.choice];
  counts_.offload_groups += record.plan.offload_groups;
  counts_.blocks_added += record.blocks_added;
  counts_.blocks_evicted += record.blocks_evicted;
  counts_.requests_preempted += record.requests_preempted;
  counts_.restore_groups += record.restore_groups;
}

void DecisionLog::Append(int64_t time_micros, const ArbiterRecord& record) {
  absl::MutexLock lock(&mu_);
  AppendLocked(time_micros, record);
}

void DecisionLog::AppendAll(int64_t time_micros, const std::vector<ArbiterRecord>& records) {
  if (records.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const ArbiterRecord& r : records) AppendLocked(time_micros, r);
}

std::vector<DecisionLogEntry> DecisionLog::Recent(size_t max_entries) const {
  absl::MutexLock lock(&mu_);
  const size_t n = std::min(max_entries, ring_.size());
  std::vector<DecisionLogEntry> out;
  out.reserve(n);
  // Oldest entry sits at next_ once the ring is full, at 0 before.
  const size_t oldest = ring_.size() < capacity_ ? 0 : next_;
  for (size_t i = ring_.size() - n; i < ring_.size(); ++i) {
    out.push_back(ring_[(oldest + i) % ring_.size()]);
  }
  return out;
}

DecisionCounts DecisionLog::Counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

namespace {

std::string Millis(double micros) {
  return micros < 0 ? "-" : absl::StrFormat("%.3f", micros * 1e-3);
}

}  // namespace

std::string DecisionLog::Format(const DecisionLogEntry& e) {
  const ArbiterRecord& r = e.record;
  const ArbiterPlan& p = r.plan;
  // The tax model's comparison, when it priced this decision.
  const TaxComparison& t = p.tax;
  const std::string tax =
      t.evaluated ? absl::StrFormat(
                        " tax[%+d groups]=%sms value=%sms ghost_tokens=%.0f preempt_tokens=%.0f "
                        "window=%.0fs (%d steps) h2d=%.1fGB/s routed_h2d=%.1fGB/s "
                        "weight=%g tpot_overhead=%.3f queue=%.2fs compute_share=%.2f",
                        t.groups, Millis(t.tax_micros), Millis(t.value_micros), t.ghost_tokens,
                        t.preempt_tokens, t.window_micros * 1e-6, t.observed_steps,
                        t.h2d_bytes_per_s * 1e-9, t.routed_h2d_bytes_per_s * 1e-9, t.ttft_weight,
                        t.tpot_overhead, t.mean_queue_micros * 1e-6, t.compute_bound_share)
                  : "";
  if (r.restore_groups > 0) {
    const std::string working_set =
        t.working_set_blocks >= 0 ? absl::StrFormat(" working_set=%d blocks reuse_age=%d steps",
                                                    t.working_set_blocks, t.reuse_age_steps)
                                  : "";
    return absl::StrCat(absl::StrFormat("t=%.6fs step=%d restore groups=%d", e.time_micros * 1e-6,
                                        r.step, r.restore_groups),
                        tax, working_set);
  }
  if (r.for_restore) {
    return absl::StrCat(
        absl::StrFormat("t=%.6fs step=%d %s preempted=%d first=%d", e.time_micros * 1e-6, r.step,
                        p.choice, r.requests_preempted, r.requester),
        tax);
  }
  const ArbiterInputs& in = p.inputs;
  return absl::StrCat(
      absl::StrFormat("t=%.6fs step=%d req=%d%s gap=%d", e.time_micros * 1e-6, r.step, r.requester,
                      r.requester_running ? "(running)" : "(waiting)", r.gap_blocks),
      absl::StrFormat(" r_hit=%.3f w=%d cached_free=%d groups_left=%d blocks/group=%d G=%d",
                      in.hit_rate, in.horizon_steps, in.free_cached_blocks, in.remaining_groups,
                      in.blocks_per_group, in.victims),
      absl::StrFormat(" t_prefill=%.2fus c_eff=%.2fus t_queue=%.0fus", in.t_prefill_micros,
                      in.c_eff_micros, in.t_queue_micros),
      " C_c=", Millis(p.costs.evict_micros), "ms C_e=", Millis(p.costs.offload_micros),
      "ms C_p=", Millis(p.costs.preempt_micros), "ms C_b=", Millis(p.costs.combined_micros), "ms",
      tax, " choice=", p.choice.empty() ? "-" : p.choice,
      absl::StrFormat(" offload=%d evict=%d preempt=%d -> added=%d evicted=%d preempted=%d",
                      p.offload_groups, p.evict_blocks, p.preempt.size(), r.blocks_added,
                      r.blocks_evicted, r.requests_preempted));
}

}  // namespace vamp
