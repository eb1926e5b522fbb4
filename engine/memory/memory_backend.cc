#include "engine/memory/memory_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/memory/host_backend.h"
#if VAMP_HAVE_CUDA
#include "engine/memory/cuda_backend.h"
#endif

namespace vamp {

absl::StatusOr<PinnedHostBuffer> PinnedHostBuffer::Allocate(MemoryBackend* backend,
                                                            uint64_t bytes) {
  absl::StatusOr<void*> ptr = backend->AllocatePinnedHost(bytes);
  if (!ptr.ok()) return ptr.status();
  PinnedHostBuffer buffer;
  buffer.backend_ = backend;
  buffer.data_ = static_cast<uint8_t*>(*ptr);
  buffer.size_ = bytes;
  return buffer;
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() { Reset(); }

void PinnedHostBuffer::Reset() {
  if (data_ != nullptr) backend_->FreePinnedHost(data_);
  backend_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<MemoryBackendOptions::Kind> ParseMemoryBackendKind(absl::string_view name) {
  if (name == "host") return MemoryBackendOptions::Kind::kHost;
  if (name == "cuda") return MemoryBackendOptions::Kind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("memory backend: unknown kind '", name, "' (expected host or cuda)"));
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateMemoryBackend(
    const MemoryBackendOptions& options) {
  switch (options.kind) {
    case MemoryBackendOptions::Kind::kHost: {
      auto backend = HostMemoryBackend::Create(
          options.host_page_bytes, options.host_device_memory_bytes, options.host_populate);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<MemoryBackend>(std::move(*backend));
    }
    case MemoryBackendOptions::Kind::kCuda:
#if VAMP_HAVE_CUDA
      return CreateCudaMemoryBackend(options.cuda_device);
#else
      return absl::UnavailableError("memory backend: this build has no CUDA support");
#endif
  }
  return absl::InvalidArgumentError("memory backend: unknown kind");
}

}  // namespace vamp
