// The CUDA VMM memory backend (CUDA builds only; see memory_backend.h for the semantics).
//
// Physical pages are cuMemCreate allocations of the device's minimum granularity, created with
// POSIX file-descriptor export allowed so they can later be shared over CUDA IPC; reservations are
// cuMemAddressReserve ranges; MapPage is cuMemMap, SetReadWriteAccess one cuMemSetAccess over the
// range, UnmapPages one cuMemUnmap per page (each page is its own mapping).
//
// The binary does not link libcuda: driver entry points are looked up at run time through
// cudaGetDriverEntryPointByVersion (cudart is linked statically), so binaries load on machines
// without an NVIDIA driver and the factory returns Unavailable there.
#ifndef VAMP_ENGINE_MEMORY_CUDA_BACKEND_H_
#define VAMP_ENGINE_MEMORY_CUDA_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/memory/fence.h"
#include "engine/memory/memory_backend.h"

namespace vamp {

// Unavailable when there is no driver or no device; InvalidArgument for a device ordinal that does
// not exist.
absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend(int device);

// A fence that synchronises `streams` (cudaStream_t values; empty = the whole device) on `device`.
std::unique_ptr<InFlightFence> CreateCudaStreamFence(int device, std::vector<void*> streams);

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_CUDA_BACKEND_H_
