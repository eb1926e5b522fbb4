// Internal to kernels/cuda: turning CUDA launch and library errors into absl::Status.
#ifndef VAMP_KERNELS_CUDA_LAUNCH_H_
#define VAMP_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace vamp::kernels::cuda::internal {

// The status of the kernel launch just made on this thread (cudaGetLastError, which also clears a
// non-sticky error), naming `kernel` in the message.
absl::Status LaunchStatus(const char* kernel);

// OK for cudaSuccess; otherwise an Internal error naming `what`.
absl::Status CudaStatus(cudaError_t error, const char* what);

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether `p` is 16-byte aligned (vector loads and stores, tensor-core tiles).
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Multiprocessor count of the current device (sizes persistent grids).
absl::Status MultiProcessorCount(int* count);

// Whether the Hopper warpgroup-MMA kernels (wgmma.cuh) may run on the current device: the library
// was built with sm_90a code (VAMP_CUDA_WGMMA) and the device is compute capability 9.0. The
// device query is made once per device and cached (thread-safe); false on any CUDA error.
bool WgmmaAvailable();

}  // namespace vamp::kernels::cuda::internal

#endif  // VAMP_KERNELS_CUDA_LAUNCH_H_
