#include "engine/memory/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace vamp {
namespace {

absl::Status ErrnoError(absl::string_view call, int err) {
  return absl::InternalError(absl::StrCat(call, " failed: ", std::strerror(err)));
}

uint64_t OsPageBytes() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

absl::StatusOr<std::unique_ptr<HostMemoryBackend>> HostMemoryBackend::Create(
    uint64_t page_bytes, uint64_t device_memory_bytes, bool populate) {
  const uint64_t os_page = OsPageBytes();
  if (page_bytes == 0 || page_bytes % os_page != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host memory backend: page_bytes (", page_bytes,
                                                   ") must be a positive multiple of the OS page (",
                                                   os_page, " bytes)"));
  }
  if (device_memory_bytes == 0) {
    device_memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * os_page;
  }
  const int fd = memfd_create("vamp-pages", MFD_CLOEXEC);
  if (fd < 0) return ErrnoError("memfd_create", errno);
  return std::unique_ptr<HostMemoryBackend>(
      new HostMemoryBackend(fd, page_bytes, device_memory_bytes, populate));
}

HostMemoryBackend::HostMemoryBackend(int fd, uint64_t page_bytes, uint64_t device_memory_bytes,
                                     bool populate)
    : fd_(fd),
      page_bytes_(page_bytes),
      device_memory_bytes_(device_memory_bytes),
      populate_(populate) {}

HostMemoryBackend::~HostMemoryBackend() {
  absl::MutexLock lock(&mu_);
  // Owners free their reservations first; whatever is left is a leak worth reporting, and is
  // unmapped so the address space goes back with the process's other resources.
  for (const auto& [base, reservation] : reservations_) {
    VAMP_LOG(WARNING) << "host memory backend: reservation at 0x" << std::hex << base << std::dec
                      << " (" << reservation.bytes << " bytes) still held at shutdown";
    munmap(reinterpret_cast<void*>(base), reservation.bytes);
  }
  close(fd_);
}

absl::StatusOr<PhysicalPageHandle> HostMemoryBackend::CreatePhysicalPage() {
  absl::MutexLock lock(&mu_);
  uint64_t page = next_page_;
  if (!released_.empty()) page = released_.back();
  if (page == file_pages_) {
    // Grow the (sparse) file geometrically so creating N pages costs O(log N) ftruncate calls.
    const uint64_t new_pages = std::max<uint64_t>(64, 2 * file_pages_);
    if (ftruncate(fd_, static_cast<off_t>(new_pages * page_bytes_)) != 0) {
      return ErrnoError("ftruncate of the page memfd", errno);
    }
    file_pages_ = new_pages;
  }
  // Like a GPU, a populated backend cannot create more pages than its memory holds; without this
  // check the kernel would meet the shortage with the OOM killer instead of an error.
  if (populate_ && (live_pages_ + 1) * page_bytes_ > device_memory_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "CreatePhysicalPage: ", live_pages_, " pages of ", page_bytes_,
        " bytes already use the host backend's device memory of ", device_memory_bytes_, " bytes"));
  }
  if (populate_ && fallocate(fd_, 0, static_cast<off_t>(page * page_bytes_),
                             static_cast<off_t>(page_bytes_)) != 0) {
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrCat(
        "CreatePhysicalPage: allocating a ", page_bytes_, "-byte page: ", std::strerror(err)));
  }
  if (page == next_page_) {
    live_.push_back(true);
    map_count_.push_back(0);
    ++next_page_;
  } else {
    released_.pop_back();
    live_[page] = true;
  }
  ++live_pages_;
  return page;
}

absl::Status HostMemoryBackend::ReleasePhysicalPage(PhysicalPageHandle page) {
  absl::MutexLock lock(&mu_);
  if (page >= next_page_ || !live_[page]) {
    return absl::InvalidArgumentError(absl::StrCat("ReleasePhysicalPage: page ", page,
                                                   " does not exist or was already released"));
  }
  if (map_count_[page] != 0) {
    return absl::FailedPreconditionError(absl::StrCat("ReleasePhysicalPage: page ", page,
                                                      " is still mapped at ", map_count_[page],
                                                      " address(es)"));
  }
  // Give the memory back now; the slice is reused by the next CreatePhysicalPage.
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(page * page_bytes_), static_cast<off_t>(page_bytes_)) != 0) {
    return ErrnoError("fallocate(PUNCH_HOLE) of a released page", errno);
  }
  live_[page] = false;
  --live_pages_;
  released_.push_back(page);
  return absl::OkStatus();
}

absl::StatusOr<DeviceAddress> HostMemoryBackend::ReserveAddressRange(uint64_t bytes) {
  if (bytes == 0 || bytes % page_bytes_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReserveAddressRange: ", bytes,
                     " bytes is not a positive multiple of the page (", page_bytes_, ")"));
  }
  // Over-reserve by one page and trim, so the range is aligned to the page like
  // cuMemAddressReserve's.
  const uint64_t padded = bytes + page_bytes_;
  void* raw = mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return ErrnoError("mmap(PROT_NONE) reservation", errno);
  const uint64_t start = reinterpret_cast<uint64_t>(raw);
  const uint64_t aligned = (start + page_bytes_ - 1) / page_bytes_ * page_bytes_;
  if (aligned > start) munmap(raw, aligned - start);
  const uint64_t tail = start + padded - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);

  absl::MutexLock lock(&mu_);
  Reservation& r = reservations_[aligned];
  r.bytes = bytes;
  r.mapped.assign(bytes / page_bytes_, kUnmapped);
  r.accessible.assign(bytes / page_bytes_, false);
  return aligned;
}

absl::Status HostMemoryBackend::FreeAddressRange(DeviceAddress base, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(base);
  if (it == reservations_.end() || it->second.bytes != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("FreeAddressRange: no reservation of ", bytes,
                                                   " bytes at 0x", absl::Hex(base)));
  }
  const auto mapped = std::count_if(it->second.mapped.begin(), it->second.mapped.end(),
                                    [](int64_t p) { return p != kUnmapped; });
  if (mapped != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("FreeAddressRange: ", mapped, " page(s) of the reservation are still mapped"));
  }
  if (munmap(reinterpret_cast<void*>(base), bytes) != 0) return ErrnoError("munmap", errno);
  reservations_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<HostMemoryBackend::Reservation*, uint64_t>> HostMemoryBackend::Locate(
    DeviceAddress address, uint64_t bytes) {
  auto it = reservations_.upper_bound(address);
  if (it == reservations_.begin()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address 0x", absl::Hex(address), " is not inside a reservation"));
  }
  --it;
  const uint64_t offset = address - it->first;
  if (offset + bytes > it->second.bytes || bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("range [0x", absl::Hex(address), ", +", bytes,
                                                   ") is not inside one reservation"));
  }
  return std::make_pair(&it->second, offset / page_bytes_);
}

absl::Status HostMemoryBackend::MapPage(DeviceAddress address, PhysicalPageHandle page) {
  absl::MutexLock lock(&mu_);
  if (address % page_bytes_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MapPage: address 0x", absl::Hex(address), " is not page-aligned"));
  }
  if (page >= next_page_ || !live_[page]) {
    return absl::InvalidArgumentError(absl::StrCat("MapPage: page ", page, " does not exist"));
  }
  auto located = Locate(address, page_bytes_);
  if (!located.ok()) return located.status();
  auto [reservation, slot] = *located;
  if (reservation->mapped[slot] != kUnmapped) {
    return absl::FailedPreconditionError(absl::StrCat("MapPage: address 0x", absl::Hex(address),
                                                      " already has page ",
                                                      reservation->mapped[slot], " mapped"));
  }
  void* got = mmap(reinterpret_cast<void*>(address), page_bytes_, PROT_NONE, MAP_SHARED | MAP_FIXED,
                   fd_, static_cast<off_t>(page * page_bytes_));
  if (got == MAP_FAILED) return ErrnoError("mmap(MAP_FIXED|MAP_SHARED) of a page", errno);
  reservation->mapped[slot] = static_cast<int64_t>(page);
  reservation->accessible[slot] = false;
  ++map_count_[page];
  return absl::OkStatus();
}

absl::StatusOr<std::pair<HostMemoryBackend::Reservation*, uint64_t>>
HostMemoryBackend::LocateMappedRange(DeviceAddress address, uint64_t bytes,
                                     absl::string_view what) {
  if (address % page_bytes_ != 0 || bytes % page_bytes_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": range is not page-aligned"));
  }
  auto located = Locate(address, bytes);
  if (!located.ok()) return located.status();
  auto [reservation, first] = *located;
  for (uint64_t i = first; i < first + bytes / page_bytes_; ++i) {
    if (reservation->mapped[i] == kUnmapped) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": page slot ", i, " of the range is not mapped"));
    }
  }
  return located;
}

absl::Status HostMemoryBackend::SetReadWriteAccess(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto located = LocateMappedRange(address, bytes, "SetReadWriteAccess");
  if (!located.ok()) return located.status();
  auto [reservation, first] = *located;
  const uint64_t n = bytes / page_bytes_;
  if (mprotect(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE) != 0) {
    return ErrnoError("mprotect", errno);
  }

  std::fill(reservation->accessible.begin() + first, reservation->accessible.begin() + first + n,
            true);
  return absl::OkStatus();
}

absl::Status HostMemoryBackend::UnmapPages(DeviceAddress address, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto located = LocateMappedRange(address, bytes, "UnmapPages");
  if (!located.ok()) return located.status();
  auto [reservation, first] = *located;
  const uint64_t n = bytes / page_bytes_;
  // Replace the pages with an inaccessible anonymous mapping: the range stays reserved.
  void* got = mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (got == MAP_FAILED) return ErrnoError("mmap(PROT_NONE) over unmapped pages", errno);
  for (uint64_t i = first; i < first + n; ++i) {
    --map_count_[static_cast<uint64_t>(reservation->mapped[i])];
    reservation->mapped[i] = kUnmapped;
    reservation->accessible[i] = false;
  }
  return absl::OkStatus();
}

absl::Status HostMemoryBackend::CheckAccessible(DeviceAddress address, uint64_t bytes,
                                                absl::string_view what) {
  auto located = Locate(address, bytes);
  if (!located.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", located.status().message()));
  }
  auto [reservation, first] = *located;
  // Slots touched by the range, which need not be page-aligned.
  const uint64_t n = (address % page_bytes_ + bytes + page_bytes_ - 1) / page_bytes_;
  for (uint64_t i = first; i < first + n; ++i) {
    if (!reservation->accessible[i]) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": range [0x", absl::Hex(address),
                                                        ", +", bytes, ") touches page slot ", i,
                                                        " which is not mapped with access"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostMemoryBackend::CopyHostToDevice(DeviceAddress dst, const void* src,
                                                 uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckAccessible(dst, bytes, "CopyHostToDevice"); !s.ok()) return s;
  }
  if (bytes >= page_bytes_) {
    // Fill the destination's page tables in one call: much cheaper than taking a fault per OS page
    // inside memcpy (restoring experts into freshly remapped pages copies whole groups).
    const uint64_t os_page = OsPageBytes();
    const uint64_t begin = dst / os_page * os_page;
    const uint64_t end = (dst + bytes + os_page - 1) / os_page * os_page;
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) != 0) {
      return ErrnoError("madvise(MADV_POPULATE_WRITE) before a copy", errno);
    }
  }
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return absl::OkStatus();
}

absl::Status HostMemoryBackend::CopyDeviceToHost(void* dst, DeviceAddress src, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckAccessible(src, bytes, "CopyDeviceToHost"); !s.ok()) return s;
  }
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return absl::OkStatus();
}

absl::StatusOr<void*> HostMemoryBackend::AllocatePinnedHost(uint64_t bytes) {
  void* ptr = nullptr;
  const int err = posix_memalign(&ptr, OsPageBytes(), std::max<uint64_t>(bytes, 1));
  if (err != 0) return ErrnoError("posix_memalign for a pinned host buffer", err);
  return ptr;
}

void HostMemoryBackend::FreePinnedHost(void* ptr) { std::free(ptr); }

}  // namespace vamp
