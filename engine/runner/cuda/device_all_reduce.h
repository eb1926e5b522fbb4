// The tensor-parallel collective of the GPU forward pass: an in-place sum over the ranks of a
// device buffer, enqueued on the compute stream (no host synchronisation). Implemented by
// NcclCommunicator (engine/runner/comm/nccl_communicator.h); the model only sees this interface.
#ifndef VAMP_ENGINE_RUNNER_CUDA_DEVICE_ALL_REDUCE_H_
#define VAMP_ENGINE_RUNNER_CUDA_DEVICE_ALL_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/dtype.h"

namespace vamp {

class DeviceAllReduce {
 public:
  virtual ~DeviceAllReduce() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Enqueues on `stream`: data[0, count) (device memory, `dtype` elements) becomes the
  // element-wise sum over all ranks, identical on every rank. Every rank must issue the same
  // sequence of calls with the same counts. Errors are those of enqueuing; a failure of the
  // collective itself surfaces at the next stream synchronisation or Check().
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype,
                                    cudaStream_t stream) = 0;
  // Reports an asynchronous failure of the group (a peer died, a timeout): OK while healthy.
  virtual absl::Status Check() = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_DEVICE_ALL_REDUCE_H_
