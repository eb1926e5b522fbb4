// The host memory backend: CUDA VMM semantics on CPU memory.
//
// Physical pages are page-sized slices of one memfd; a released page's memory is returned with
// FALLOC_FL_PUNCH_HOLE. With `populate` (the default, like cuMemCreate) a page's memory is
// allocated when the page is created (fallocate), so a shortage shows at start-up rather than as a
// fault mid-serving, and creating more pages than device_memory_bytes() is refused. Without it
// memory is committed only when touched, which lets a host run reserve model-sized pools it never
// fills. Page tables are filled lazily, except that copies of a page or more fill the
// destination's first (MADV_POPULATE_WRITE): several times cheaper than a fault per OS page.
//
// A reservation is a PROT_NONE anonymous mapping; mapping a page replaces one page of it with
// mmap(MAP_FIXED|MAP_SHARED) of its memfd slice (still PROT_NONE, as cuMemMap grants no access);
// SetReadWriteAccess is mprotect; unmap puts a PROT_NONE anonymous mapping back so the range stays
// reserved. Device addresses are plain host pointers, so CPU kernels read them directly.
//
// The backend checks what the CUDA driver checks (alignment, reservation bounds, mapping over a
// mapped page, access on unmapped pages, freeing a reservation that still has mappings, releasing a
// mapped page, copies into inaccessible memory) and returns FailedPrecondition or InvalidArgument.
#ifndef VAMP_ENGINE_MEMORY_HOST_BACKEND_H_
#define VAMP_ENGINE_MEMORY_HOST_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/memory/memory_backend.h"

namespace vamp {

class HostMemoryBackend final : public MemoryBackend {
 public:
  // `page_bytes` must be a positive multiple of the OS page size. `device_memory_bytes` is what
  // device_memory_bytes() reports (0 = physical RAM).
  static absl::StatusOr<std::unique_ptr<HostMemoryBackend>> Create(uint64_t page_bytes,
                                                                   uint64_t device_memory_bytes = 0,
                                                                   bool populate = true);
  ~HostMemoryBackend() override;

  absl::string_view name() const override { return "host"; }
  uint64_t page_bytes() const override { return page_bytes_; }
  uint64_t device_memory_bytes() const override { return device_memory_bytes_; }

  absl::StatusOr<PhysicalPageHandle> CreatePhysicalPage() override;
  absl::Status ReleasePhysicalPage(PhysicalPageHandle page) override;
  absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) override;
  absl::Status FreeAddressRange(DeviceAddress base, uint64_t bytes) override;
  absl::Status MapPage(DeviceAddress address, PhysicalPageHandle page) override;
  absl::Status SetReadWriteAccess(DeviceAddress address, uint64_t bytes) override;
  absl::Status UnmapPages(DeviceAddress address, uint64_t bytes) override;
  absl::Status CopyHostToDevice(DeviceAddress dst, const void* src, uint64_t bytes) override;
  absl::Status CopyDeviceToHost(void* dst, DeviceAddress src, uint64_t bytes) override;
  absl::StatusOr<void*> AllocatePinnedHost(uint64_t bytes) override;
  void FreePinnedHost(void* ptr) override;

 private:
  // Per reserved page slot: the mapped page (or kUnmapped) and whether access was granted.
  static constexpr int64_t kUnmapped = -1;
  struct Reservation {
    uint64_t bytes = 0;
    std::vector<int64_t> mapped;
    std::vector<bool> accessible;
  };

  HostMemoryBackend(int fd, uint64_t page_bytes, uint64_t device_memory_bytes, bool populate);

  // The reservation holding [address, address + bytes) and the index of its first page slot.
  absl::StatusOr<std::pair<Reservation*, uint64_t>> Locate(DeviceAddress address, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Locate for a page-aligned range whose every slot holds a page; errors start with `what`.
  absl::StatusOr<std::pair<Reservation*, uint64_t>> LocateMappedRange(DeviceAddress address,
                                                                       uint64_t bytes,
                                                                       absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that every page of [address, address + bytes) is mapped and accessible.
  absl::Status CheckAccessible(DeviceAddress address, uint64_t bytes, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  const uint64_t page_bytes_;
  const uint64_t device_memory_bytes_;
  const bool populate_;

  absl::Mutex mu_;
  // Pages the memfd has room for (its size / page_bytes_).
  uint64_t file_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // Pages handed out so far (slices [0, next_page_) of the file have been created at least once).
  uint64_t next_page_ ABSL_GUARDED_BY(mu_) = 0;
  // Released slices, reused before the file grows.
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
  // Pages created and not released.
  uint64_t live_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // Per created slice: live (created and not released) and how many places it is mapped at.
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> map_count_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceAddress, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_HOST_BACKEND_H_
