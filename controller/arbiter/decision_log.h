// The arbiter decision log: the most recent arbiter records (inputs, the four costs, the choice
// and what applying it achieved), bounded, plus cumulative counts for metrics. The engine thread
// appends Scheduler::step_decisions() after each Schedule(); the Admin API, metrics and reports
// read from other threads.
//
// Thread-safe.
#ifndef VAMP_CONTROLLER_ARBITER_DECISION_LOG_H_
#define VAMP_CONTROLLER_ARBITER_DECISION_LOG_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/core/memory_arbiter.h"

namespace vamp {

struct DecisionLogEntry {
  int64_t time_micros = 0;  // when the step was planned (scheduler clock)
  ArbiterRecord record;
};

// Cumulative since the log was created (entries dropped from the ring still count).
struct DecisionCounts {
  int64_t decisions = 0;
  std::map<std::string, int64_t> by_choice;  // plan.choice → records
  int64_t offload_groups = 0;                // groups the plans asked for
  int64_t blocks_added = 0;                  // ... and the blocks they brought
  int64_t blocks_evicted = 0;
  int64_t requests_preempted = 0;
  int64_t restore_groups = 0;
};

class DecisionLog {
 public:
  // Keeps the latest `capacity` (> 0) entries.
  explicit DecisionLog(size_t capacity = 4096);

  DecisionLog(const DecisionLog&) = delete;
  DecisionLog& operator=(const DecisionLog&) = delete;

  void Append(int64_t time_micros, const ArbiterRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  void AppendAll(int64_t time_micros, const std::vector<ArbiterRecord>& records)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Up to `max_entries` of the newest entries, oldest first.
  std::vector<DecisionLogEntry> Recent(size_t max_entries) const ABSL_LOCKS_EXCLUDED(mu_);
  DecisionCounts Counts() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t capacity() const { return capacity_; }

  // One line for logs and vampctl: step, gap, inputs, the four costs (ms, "-" = not evaluated)
  // and the outcome.
  static std::string Format(const DecisionLogEntry& entry);

 private:
  void AppendLocked(int64_t time_micros, const ArbiterRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<DecisionLogEntry> ring_ ABSL_GUARDED_BY(mu_);  // grows to capacity_, then wraps
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;                     // slot of the next entry once full
  DecisionCounts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_ARBITER_DECISION_LOG_H_
