// "Nothing in flight can read these pages any more": the wait the memory layer performs before it
// unmaps a page that kernels may still be reading (shared/DESIGN.md, invariant 3).
//
// The runner supplies the implementation: on CUDA a synchronisation of the streams that may read
// expert weights or KV blocks (cuda_backend.h); on the CPU engine a callable that waits for its
// worker threads, or nothing when every step finishes before the call returns.
#ifndef VAMP_ENGINE_MEMORY_FENCE_H_
#define VAMP_ENGINE_MEMORY_FENCE_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"

namespace vamp {

class InFlightFence {
 public:
  virtual ~InFlightFence() = default;
  // Blocks until no work submitted before the call can still access device memory.
  virtual absl::Status WaitUntilIdle() = 0;
};

// A fence that calls a function (CPU engines, tests).
class CallbackFence final : public InFlightFence {
 public:
  explicit CallbackFence(std::function<absl::Status()> wait) : wait_(std::move(wait)) {}
  absl::Status WaitUntilIdle() override { return wait_(); }

 private:
  std::function<absl::Status()> wait_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_FENCE_H_
