#include "engine/runner/cuda/cuda_runner_support.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<KvCacheView> CudaKvRegionView(const KvRegion& region, int num_decoder_layers) {
  const KvBlockGeometry& g = region.geometry();
  if (region.region().pool()->backend()->name() != "cuda") {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU engine needs the KV region on the cuda memory backend, not '",
                     region.region().pool()->backend()->name(), "'"));
  }
  if (g.dtype_bytes != static_cast<int64_t>(sizeof(float))) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU engine stores KV in float32; the KV geometry has ", g.dtype_bytes,
                     "-byte elements"));
  }
  KvCacheView view;
  view.block_size = g.block_size;
  view.num_blocks = region.num_blocks();
  view.strides.block_stride = static_cast<int64_t>(g.block_bytes / sizeof(float));
  view.strides.token_stride = g.kv_heads_per_rank * g.head_dim;
  view.strides.head_stride = g.head_dim;
  view.k.assign(num_decoder_layers, nullptr);
  view.v.assign(num_decoder_layers, nullptr);
  auto* base = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(region.base()));
  for (int layer = 0; layer < num_decoder_layers; ++layer) {
    if (!g.HasKv(layer)) continue;
    view.k[layer] = reinterpret_cast<float*>(base + g.KOffset(layer));
    view.v[layer] = reinterpret_cast<float*>(base + g.VOffset(layer));
  }
  return view;
}

}  // namespace vamp
