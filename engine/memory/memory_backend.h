// The virtual-memory primitives the memory layer is built on, with two implementations:
//   - CUDA VMM (cuda_backend.h): cuMemCreate / cuMemAddressReserve / cuMemMap / cuMemSetAccess /
//     cuMemUnmap on device memory;
//   - host (host_backend.h): the same semantics on CPU memory (memfd pages mapped with
//     mmap(MAP_FIXED|MAP_SHARED) into a PROT_NONE reservation), so everything above runs and is
//     tested without a GPU.
//
// Semantics both backends share (and the host backend enforces, so CPU tests catch what the GPU
// would reject):
//   - A physical page is `page_bytes()` of memory created once; its contents survive unmapping and
//     remapping elsewhere until it is released.
//   - An address range is reserved first (aligned to the page) and only pages are mapped into it,
//     each at a page-aligned address inside a reservation, never over an already mapped page.
//   - A freshly mapped page is inaccessible until SetReadWriteAccess covers it.
//   - Unmap leaves the range reserved (it can be mapped again); a reservation is freed only when
//     none of it is mapped; a page is released only when it is mapped nowhere.
//
// Device addresses are `DeviceAddress` (an integer, like CUdeviceptr): on the CUDA backend they are
// not dereferenceable on the host; use the copy functions. Thread-safe.
#ifndef VAMP_ENGINE_MEMORY_MEMORY_BACKEND_H_
#define VAMP_ENGINE_MEMORY_MEMORY_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

using DeviceAddress = uint64_t;
// Opaque handle of one physical page (CUmemGenericAllocationHandle on CUDA).
using PhysicalPageHandle = uint64_t;

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;

  // "host" or "cuda".
  virtual absl::string_view name() const = 0;
  // Bytes of one physical page: the mapping granularity (2 MiB on H100/H200, read from the device).
  virtual uint64_t page_bytes() const = 0;
  // Total memory of the device (host: physical RAM), bytes.
  virtual uint64_t device_memory_bytes() const = 0;

  virtual absl::StatusOr<PhysicalPageHandle> CreatePhysicalPage() = 0;
  virtual absl::Status ReleasePhysicalPage(PhysicalPageHandle page) = 0;

  // Reserves `bytes` (a multiple of page_bytes()) of address space aligned to the page.
  virtual absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) = 0;
  virtual absl::Status FreeAddressRange(DeviceAddress base, uint64_t bytes) = 0;

  // Maps one page at `address` (page-aligned, inside a reservation, not mapped). No access yet.
  virtual absl::Status MapPage(DeviceAddress address, PhysicalPageHandle page) = 0;
  // Makes [address, address + bytes) readable and writable; every page in it must be mapped.
  virtual absl::Status SetReadWriteAccess(DeviceAddress address, uint64_t bytes) = 0;
  // Unmaps every page in [address, address + bytes); each must be mapped.
  virtual absl::Status UnmapPages(DeviceAddress address, uint64_t bytes) = 0;

  // Synchronous copies between host memory and mapped, accessible device memory.
  virtual absl::Status CopyHostToDevice(DeviceAddress dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status CopyDeviceToHost(void* dst, DeviceAddress src, uint64_t bytes) = 0;

  // Host memory the device copies from at full bandwidth (cudaHostAlloc on CUDA; page-aligned
  // memory on the host backend).
  virtual absl::StatusOr<void*> AllocatePinnedHost(uint64_t bytes) = 0;
  virtual void FreePinnedHost(void* ptr) = 0;
};

// Owns one pinned host allocation from a backend; frees it on destruction. Move-only.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  static absl::StatusOr<PinnedHostBuffer> Allocate(MemoryBackend* backend, uint64_t bytes);
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  void Reset();
  MemoryBackend* backend_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Which backend to create, and its options.
struct MemoryBackendOptions {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  // Host backend: the page size, a multiple of the OS page (the CUDA backend reads the device's
  // granularity instead). 2 MiB like the GPU by default; tests use smaller pages.
  uint64_t host_page_bytes = uint64_t{2} << 20;
  // Host backend: the memory it reports as the device's (0 = the machine's physical RAM).
  uint64_t host_device_memory_bytes = 0;
  // Host backend: commit a page's memory when it is created, as cuMemCreate does (see
  // host_backend.h). Off: memory is committed when first touched.
  bool host_populate = true;
  // CUDA backend: the device ordinal.
  int cuda_device = 0;
};

// Parses "host" or "cuda".
absl::StatusOr<MemoryBackendOptions::Kind> ParseMemoryBackendKind(absl::string_view name);

// Creates a backend. The CUDA backend returns Unavailable when the build has no CUDA, or the
// machine no driver or device, so callers (and GPU tests) can skip cleanly.
absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateMemoryBackend(
    const MemoryBackendOptions& options);

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_MEMORY_BACKEND_H_
