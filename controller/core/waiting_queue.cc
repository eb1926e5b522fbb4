#include "controller/core/waiting_queue.h"

#include <algorithm>
#include <tuple>

namespace vamp {

bool WaitingQueue::ByPriority::operator()(const Request* a, const Request* b) const {
  return std::make_tuple(a->priority(), a->arrival_micros(), a->seq()) <
         std::make_tuple(b->priority(), b->arrival_micros(), b->seq());
}

void WaitingQueue::AddArrival(Request* r) {
  if (policy_ == SchedulingPolicy::kFcfs) {
    fifo_.push_back(r);
  } else {
    ordered_.insert(r);
  }
}

void WaitingQueue::AddPreempted(Request* r) {
  if (policy_ == SchedulingPolicy::kFcfs) {
    fifo_.push_front(r);
  } else {
    ordered_.insert(r);
  }
}

Request* WaitingQueue::Front() const {
  if (policy_ == SchedulingPolicy::kFcfs) return fifo_.empty() ? nullptr : fifo_.front();
  return ordered_.empty() ? nullptr : *ordered_.begin();
}

bool WaitingQueue::Remove(Request* r) {
  if (policy_ == SchedulingPolicy::kPriority) return ordered_.erase(r) > 0;
  if (!fifo_.empty() && fifo_.front() == r) {
    fifo_.pop_front();
    return true;
  }
  auto it = std::find(fifo_.begin(), fifo_.end(), r);
  if (it == fifo_.end()) return false;
  fifo_.erase(it);
  return true;
}

}  // namespace vamp
