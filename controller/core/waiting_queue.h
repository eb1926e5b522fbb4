// Requests waiting for admission, in the order the policy admits them.
//  - FCFS: arrivals join the back; preempted requests go to the front (they were admitted before
//    anything still waiting, and the last one preempted, the oldest victim, ends up first).
//  - Priority: ordered by (priority, arrival, seq), lower first, preempted or not.
// Not thread-safe; owned by the scheduler.
#ifndef VAMP_CONTROLLER_CORE_WAITING_QUEUE_H_
#define VAMP_CONTROLLER_CORE_WAITING_QUEUE_H_

#include <cstddef>
#include <deque>
#include <set>

#include "controller/core/request.h"
#include "controller/core/scheduler_config.h"

namespace vamp {

class WaitingQueue {
 public:
  explicit WaitingQueue(SchedulingPolicy policy) : policy_(policy) {}

  void AddArrival(Request* r);
  void AddPreempted(Request* r);
  // The next request to admit, or null.
  Request* Front() const;
  // Removes `r` (O(1) at the front, O(n) elsewhere under FCFS). Returns false if absent.
  bool Remove(Request* r);
  bool empty() const { return size() == 0; }
  size_t size() const {
    return policy_ == SchedulingPolicy::kFcfs ? fifo_.size() : ordered_.size();
  }
  // Calls fn(const Request&) in admission order (diagnostics and invariant checks).
  template <typename Fn>
  void ForEach(Fn fn) const {
    if (policy_ == SchedulingPolicy::kFcfs) {
      for (const Request* r : fifo_) fn(*r);
    } else {
      for (const Request* r : ordered_) fn(*r);
    }
  }

 private:
  struct ByPriority {
    bool operator()(const Request* a, const Request* b) const;
  };
  SchedulingPolicy policy_;
  std::deque<Request*> fifo_;
  std::set<Request*, ByPriority> ordered_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_WAITING_QUEUE_H_
