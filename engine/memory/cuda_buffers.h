// Owned CUDA resources the GPU path shares (CUDA builds only): a CUDA stream, and device and pinned
// host allocations, each released with its object.
#ifndef VAMP_ENGINE_MEMORY_CUDA_BUFFERS_H_
#define VAMP_ENGINE_MEMORY_CUDA_BUFFERS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace vamp {

// A non-blocking CUDA stream (it does not synchronise with the legacy default stream), destroyed
// with the object. Move-only.
class CudaStream {
 public:
  // Unavailable without a driver or device.
  static absl::StatusOr<CudaStream> Create();
  CudaStream() = default;
  CudaStream(CudaStream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() { Reset(); }

  cudaStream_t get() const { return stream_; }

 private:
  void Reset();
  cudaStream_t stream_ = nullptr;
};

// One cudaMalloc allocation, freed with the object. Move-only.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(uint64_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset();
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// One cudaHostAlloc (pinned) allocation, freed with the object. Move-only.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(uint64_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset();
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_CUDA_BUFFERS_H_
