#include "engine/memory/page_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace vamp {

// ---------------------------------------------------------------------------------------------
// PagePool

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(MemoryBackend* backend,
                                                           int64_t num_pages) {
  if (num_pages < 0 || num_pages > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagePool: num_pages (", num_pages, ") must be in [0, 2^31)"));
  }
  std::vector<PhysicalPageHandle> handles;
  handles.reserve(static_cast<size_t>(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) {
    absl::StatusOr<PhysicalPageHandle> handle = backend->CreatePhysicalPage();
    if (!handle.ok()) {
      for (PhysicalPageHandle h : handles) backend->ReleasePhysicalPage(h).IgnoreError();
      return absl::Status(
          handle.status().code(),
          absl::StrCat("PagePool: creating page ", i, " of ", num_pages, " (",
                       backend->page_bytes(), " bytes each): ", handle.status().message()));
    }
    handles.push_back(*handle);
  }
  return std::unique_ptr<PagePool>(new PagePool(backend, std::move(handles)));
}

PagePool::PagePool(MemoryBackend* backend, std::vector<PhysicalPageHandle> handles)
    : backend_(backend), page_bytes_(backend->page_bytes()), handles_(std::move(handles)) {
  absl::MutexLock lock(&mu_);
  owners_.resize(handles_.size());
  // Allocate() pops from the back, so pages are handed out in ascending id order.
  for (int64_t i = static_cast<int64_t>(handles_.size()) - 1; i >= 0; --i) {
    free_.push_back(static_cast<PageId>(i));
  }
}

PagePool::~PagePool() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (owners_[i].state == State::kMapped) {
      VAMP_LOG(ERROR) << "PagePool: page " << i << " is still mapped in region '"
                      << owners_[i].region->label() << "' at shutdown; not releasing it";
      continue;
    }
    if (absl::Status s = backend_->ReleasePhysicalPage(handles_[i]); !s.ok()) {
      VAMP_LOG(ERROR) << "PagePool: " << s;
    }
  }
}

int64_t PagePool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

absl::StatusOr<std::vector<PageId>> PagePool::Allocate(int64_t n) {
  absl::MutexLock lock(&mu_);
  if (n < 0 || n > static_cast<int64_t>(free_.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "PagePool: asked for ", n, " pages, ", free_.size(), " of ", handles_.size(), " are free"));
  }
  std::vector<PageId> pages(free_.end() - n, free_.end());
  std::reverse(pages.begin(), pages.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  for (PageId p : pages) owners_[static_cast<size_t>(p)] = Owner{State::kHeld, nullptr, -1};
  return pages;
}

absl::Status PagePool::Free(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  for (PageId p : pages) {
    if (p < 0 || p >= num_pages() || owners_[static_cast<size_t>(p)].state != State::kHeld) {
      return absl::FailedPreconditionError(
          absl::StrCat("PagePool::Free: page ", p,
                       " is not held (only unmapped pages taken from "
                       "the pool can be returned)"));
    }
  }
  for (PageId p : pages) {
    owners_[static_cast<size_t>(p)] = Owner{};
    free_.push_back(p);
  }
  return absl::OkStatus();
}

absl::Status PagePool::RecordMapped(absl::Span<const PageId> pages, const VirtualRegion* region,
                                    int64_t first_slot) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId p = pages[i];
    if (p < 0 || p >= num_pages()) {
      return absl::InvalidArgumentError(absl::StrCat("page ", p, " does not exist"));
    }
    const Owner& owner = owners_[static_cast<size_t>(p)];
    if (owner.state == State::kMapped) {
      return absl::FailedPreconditionError(
          absl::StrCat("page ", p, " is already mapped in region '", owner.region->label(),
                       "' slot ", owner.slot, "; a page is never mapped twice"));
    }
    if (owner.state == State::kFree) {
      return absl::FailedPreconditionError(
          absl::StrCat("page ", p, " is free; allocate it from the pool before mapping it"));
    }
    // The same page twice in one call would also map it twice.
    for (size_t j = 0; j < i; ++j) {
      if (pages[j] == p) {
        return absl::FailedPreconditionError(
            absl::StrCat("page ", p, " appears twice in one mapping request"));
      }
    }
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    owners_[static_cast<size_t>(pages[i])] =
        Owner{State::kMapped, region, first_slot + static_cast<int64_t>(i)};
  }
  return absl::OkStatus();
}

void PagePool::RecordUnmapped(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  for (PageId p : pages) owners_[static_cast<size_t>(p)] = Owner{State::kHeld, nullptr, -1};
}

PagePool::Accounting PagePool::Account() const {
  absl::MutexLock lock(&mu_);
  Accounting a;
  for (const Owner& owner : owners_) {
    switch (owner.state) {
      case State::kFree:
        ++a.free;
        break;
      case State::kHeld:
        ++a.held;
        break;
      case State::kMapped:
        switch (owner.region->kind()) {
          case RegionKind::kExpert:
            ++a.mapped_expert;
            break;
          case RegionKind::kKv:
            ++a.mapped_kv;
            break;
          case RegionKind::kStaging:
            ++a.mapped_staging;
            break;
          case RegionKind::kOther:
            ++a.mapped_other;
            break;
        }
        break;
    }
  }
  return a;
}

absl::Status PagePool::Audit(absl::Span<const VirtualRegion* const> regions) const {
  // Snapshot the regions first (each takes its own lock), then compare under the pool's lock.
  std::vector<std::vector<PageId>> tables;
  tables.reserve(regions.size());
  for (const VirtualRegion* region : regions) tables.push_back(region->SlotTable());

  absl::MutexLock lock(&mu_);
  int64_t mapped_in_regions = 0;
  for (size_t r = 0; r < regions.size(); ++r) {
    for (size_t slot = 0; slot < tables[r].size(); ++slot) {
      const PageId p = tables[r][slot];
      if (p == kNoPage) continue;
      ++mapped_in_regions;
      const Owner& owner = owners_[static_cast<size_t>(p)];
      if (owner.state != State::kMapped || owner.region != regions[r] ||
          owner.slot != static_cast<int64_t>(slot)) {
        return absl::InternalError(
            absl::StrCat("page audit: region '", regions[r]->label(), "' shows page ", p,
                         " at slot ", slot, " but the pool records it ",
                         owner.state == State::kMapped
                             ? absl::StrCat("at '", owner.region->label(), "' slot ", owner.slot)
                             : std::string(owner.state == State::kFree ? "free" : "held")));
      }
    }
  }
  const int64_t mapped_in_pool = std::count_if(
      owners_.begin(), owners_.end(), [](const Owner& o) { return o.state == State::kMapped; });
  if (mapped_in_pool != mapped_in_regions) {
    return absl::InternalError(absl::StrCat("page audit: the pool records ", mapped_in_pool,
                                            " mapped pages but the audited regions show ",
                                            mapped_in_regions));
  }
  if (static_cast<int64_t>(free_.size()) +
          std::count_if(owners_.begin(), owners_.end(),
                        [](const Owner& o) { return o.state != State::kFree; }) !=
      num_pages()) {
    return absl::InternalError("page audit: the free list disagrees with the page states");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// VirtualRegion

absl::StatusOr<std::unique_ptr<VirtualRegion>> VirtualRegion::Reserve(PagePool* pool,
                                                                      RegionKind kind,
                                                                      std::string label,
                                                                      int64_t capacity_pages) {
  if (capacity_pages <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("region '", label, "': capacity_pages (",
                                                   capacity_pages, ") must be positive"));
  }
  absl::StatusOr<DeviceAddress> base = pool->backend()->ReserveAddressRange(
      static_cast<uint64_t>(capacity_pages) * pool->page_bytes());
  if (!base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrCat("region '", label, "': reserving ", capacity_pages,
                                     " pages: ", base.status().message()));
  }
  return std::unique_ptr<VirtualRegion>(
      new VirtualRegion(pool, kind, std::move(label), capacity_pages, *base));
}

VirtualRegion::VirtualRegion(PagePool* pool, RegionKind kind, std::string label,
                             int64_t capacity_pages, DeviceAddress base)
    : pool_(pool),
      kind_(kind),
      label_(std::move(label)),
      capacity_pages_(capacity_pages),
      page_bytes_(pool->page_bytes()),
      base_(base) {
  absl::MutexLock lock(&mu_);
  slots_.assign(static_cast<size_t>(capacity_pages), kNoPage);
}

VirtualRegion::~VirtualRegion() {
  std::vector<PageId> pages;
  {
    absl::MutexLock lock(&mu_);
    for (size_t slot = 0; slot < slots_.size(); ++slot) {
      const PageId p = slots_[slot];
      if (p == kNoPage) continue;
      absl::Status s = pool_->backend()->UnmapPages(base_ + slot * page_bytes_, page_bytes_);
      if (!s.ok()) {
        VAMP_LOG(ERROR) << "region '" << label_ << "': unmapping slot " << slot << ": " << s;
        continue;
      }
      pages.push_back(p);
      slots_[slot] = kNoPage;
    }
  }
  pool_->RecordUnmapped(pages);
  if (absl::Status s = pool_->Free(pages); !s.ok()) VAMP_LOG(ERROR) << s;
  if (absl::Status s = pool_->backend()->FreeAddressRange(base_, capacity_bytes()); !s.ok()) {
    VAMP_LOG(ERROR) << "region '" << label_ << "': " << s;
  }
}

absl::Status VirtualRegion::CheckSlots(int64_t first_slot, int64_t count) const {
  if (first_slot < 0 || count < 0 || first_slot + count > capacity_pages_) {
    return absl::OutOfRangeError(absl::StrCat("region '", label_, "': slots [", first_slot, ", ",
                                              first_slot + count, ") are outside [0, ",
                                              capacity_pages_, ")"));
  }
  return absl::OkStatus();
}

absl::Status VirtualRegion::MapPages(int64_t first_slot, absl::Span<const PageId> pages) {
  const int64_t n = static_cast<int64_t>(pages.size());
  absl::MutexLock lock(&mu_);
  VAMP_RETURN_IF_ERROR(CheckSlots(first_slot, n));
  for (int64_t i = 0; i < n; ++i) {
    if (slots_[static_cast<size_t>(first_slot + i)] != kNoPage) {
      return absl::FailedPreconditionError(
          absl::StrCat("region '", label_, "': slot ", first_slot + i, " is already mapped"));
    }
  }
  if (absl::Status s = pool_->RecordMapped(pages, this, first_slot); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("region '", label_, "': ", s.message()));
  }
  MemoryBackend* backend = pool_->backend();
  const DeviceAddress first = base_ + static_cast<uint64_t>(first_slot) * page_bytes_;
  int64_t mapped = 0;
  absl::Status status;
  for (; mapped < n; ++mapped) {
    status = backend->MapPage(first + static_cast<uint64_t>(mapped) * page_bytes_,
                              pool_->handle(pages[static_cast<size_t>(mapped)]));
    if (!status.ok()) break;
  }
  if (status.ok() && n > 0) {
    status = backend->SetReadWriteAccess(first, static_cast<uint64_t>(n) * page_bytes_);
  }
  if (!status.ok()) {
    // Leave nothing half-done: the caller still holds the pages and can retry or put them back.
    if (mapped > 0) {
      absl::Status undo = backend->UnmapPages(first, static_cast<uint64_t>(mapped) * page_bytes_);
      if (!undo.ok()) VAMP_LOG(ERROR) << "region '" << label_ << "': undoing a map: " << undo;
    }
    pool_->RecordUnmapped(pages);
    return absl::Status(status.code(),
                        absl::StrCat("region '", label_, "': mapping ", n, " page(s) at slot ",
                                     first_slot, ": ", status.message()));
  }
  std::copy(pages.begin(), pages.end(), slots_.begin() + first_slot);
  mapped_ += n;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PageId>> VirtualRegion::UnmapPages(int64_t first_slot, int64_t count) {
  absl::MutexLock lock(&mu_);
  VAMP_RETURN_IF_ERROR(CheckSlots(first_slot, count));
  std::vector<PageId> pages(slots_.begin() + first_slot, slots_.begin() + first_slot + count);
  for (int64_t i = 0; i < count; ++i) {
    if (pages[static_cast<size_t>(i)] == kNoPage) {
      return absl::FailedPreconditionError(
          absl::StrCat("region '", label_, "': slot ", first_slot + i, " is not mapped"));
    }
  }
  if (count == 0) return pages;
  absl::Status s =
      pool_->backend()->UnmapPages(base_ + static_cast<uint64_t>(first_slot) * page_bytes_,
                                   static_cast<uint64_t>(count) * page_bytes_);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("region '", label_, "': unmapping ", count,
                                               " page(s) at slot ", first_slot, ": ", s.message()));
  }
  std::fill(slots_.begin() + first_slot, slots_.begin() + first_slot + count, kNoPage);
  mapped_ -= count;
  pool_->RecordUnmapped(pages);
  return pages;
}

int64_t VirtualRegion::mapped_pages() const {
  absl::MutexLock lock(&mu_);
  return mapped_;
}

PageId VirtualRegion::PageAt(int64_t slot) const {
  absl::MutexLock lock(&mu_);
  if (slot < 0 || slot >= capacity_pages_) return kNoPage;
  return slots_[static_cast<size_t>(slot)];
}

std::vector<PageId> VirtualRegion::SlotTable() const {
  absl::MutexLock lock(&mu_);
  return slots_;
}

}  // namespace vamp
