// absl::Status from CUDA runtime errors (CUDA builds only). Driver API calls are checked inside the
// CUDA memory backend, which loads the driver's entry points at run time.
#ifndef VAMP_ENGINE_MEMORY_CUDA_STATUS_H_
#define VAMP_ENGINE_MEMORY_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace vamp {

// OK for cudaSuccess; otherwise an error naming the call, the error's name and its description.
// Out-of-memory maps to ResourceExhausted, a missing driver or device to Unavailable, bad arguments
// to InvalidArgument, anything else to Internal.
inline absl::Status CudaRuntimeStatus(cudaError_t err, absl::string_view call) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(call, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorCallRequiresNewerDriver:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace vamp

// Returns the status of a CUDA runtime call from the enclosing function when it fails.
#define VAMP_CUDART_RETURN_IF_ERROR(call)                                          \
  do {                                                                             \
    ::absl::Status vamp_cudart_status_ = ::vamp::CudaRuntimeStatus((call), #call); \
    if (!vamp_cudart_status_.ok()) return vamp_cudart_status_;                     \
  } while (0)

#endif  // VAMP_ENGINE_MEMORY_CUDA_STATUS_H_
