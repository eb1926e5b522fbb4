// Tensor parallelism as the model's layers see it: which shard this rank holds, and the one
// collective the forward pass needs. Implementations in engine/runner/comm/: host_communicator.h
// (ranks as threads of one process, for CPU runs and tests) and tcp_communicator.h (CPU agents);
// CUDA agents all-reduce on the device (nccl_communicator.h).
#ifndef VAMP_ENGINE_MODEL_PARALLEL_H_
#define VAMP_ENGINE_MODEL_PARALLEL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace vamp {

struct ParallelConfig {
  int tp_rank = 0;
  int tp_size = 1;
};

// One rank's handle on a tensor-parallel group.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Replaces data[0, count) on every rank by the element-wise sum over all ranks. Every rank must
  // call it with the same count, in the same order of collectives; every rank receives
  // bit-identical sums. Blocks until the sum is available.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_PARALLEL_H_
