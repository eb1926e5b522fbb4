#include "engine/memory/cuda_buffers.h"

#include <utility>

#include "engine/memory/cuda_status.h"

namespace vamp {

absl::StatusOr<CudaStream> CudaStream::Create() {
  CudaStream s;
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  return s;
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void CudaStream::Reset() {
  if (stream_ == nullptr) return;
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(uint64_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  VAMP_CUDART_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  b.data_ = static_cast<uint8_t*>(p);
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(uint64_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  VAMP_CUDART_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  b.data_ = static_cast<uint8_t*>(p);
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace vamp
