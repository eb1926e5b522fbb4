// A thread-safe queue of one request's EngineEvents: the engine thread pushes (its sink never
// blocks), a frontend thread pops and writes to the client.
#ifndef VAMP_CONTROLLER_SERVING_EVENT_QUEUE_H_
#define VAMP_CONTROLLER_SERVING_EVENT_QUEUE_H_

#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/serving/serving_engine.h"

namespace vamp {

class EventQueue {
 public:
  void Push(const EngineEvent& event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
  }
  // The next event, or nullopt after `timeout` without one.
  std::optional<EngineEvent> Pop(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
    EngineEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  absl::Mutex mu_;
  std::deque<EngineEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_EVENT_QUEUE_H_
