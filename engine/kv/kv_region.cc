#include "engine/kv/kv_region.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<KvRegion>> KvRegion::Create(PagePool* pool,
                                                           const KvBlockGeometry& geometry,
                                                           int64_t baseline_pages,
                                                           int64_t max_extra_pages) {
  if (geometry.block_bytes == 0) {
    return absl::InvalidArgumentError("KvRegion: block_bytes must be positive");
  }
  if (baseline_pages < 0 || max_extra_pages < 0 || baseline_pages + max_extra_pages == 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvRegion: baseline_pages (", baseline_pages,
                                                   ") and max_extra_pages (", max_extra_pages,
                                                   ") must not be negative and not both zero"));
  }
  VAMP_ASSIGN_OR_RETURN(
      std::unique_ptr<VirtualRegion> region,
      VirtualRegion::Reserve(pool, RegionKind::kKv, "kv", baseline_pages + max_extra_pages));
  VAMP_ASSIGN_OR_RETURN(std::vector<PageId> pages, pool->Allocate(baseline_pages));
  if (absl::Status s = region->MapPages(0, pages); !s.ok()) {
    pool->Free(pages).IgnoreError();
    return s;
  }
  return std::unique_ptr<KvRegion>(new KvRegion(geometry, baseline_pages, std::move(region)));
}

KvRegion::KvRegion(KvBlockGeometry geometry, int64_t baseline_pages,
                   std::unique_ptr<VirtualRegion> region)
    : geometry_(std::move(geometry)), baseline_pages_(baseline_pages), region_(std::move(region)) {}

// The region unmaps its pages and returns them to the pool.
KvRegion::~KvRegion() = default;

int64_t KvRegion::mapped_pages() const { return region_->mapped_pages(); }

uint64_t KvRegion::mapped_bytes() const {
  return static_cast<uint64_t>(mapped_pages()) * region_->page_bytes();
}

int64_t KvRegion::num_blocks() const { return BlocksWithPages(mapped_pages()); }

int64_t KvRegion::BlocksWithPages(int64_t pages) const {
  return geometry_.BlocksIn(static_cast<uint64_t>(pages) * region_->page_bytes());
}

absl::Status KvRegion::Grow(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&resize_mu_);
  const int64_t mapped = mapped_pages();
  const int64_t n = static_cast<int64_t>(pages.size());
  if (mapped + n > capacity_pages()) {
    return absl::OutOfRangeError(absl::StrCat("KvRegion::Grow: ", mapped, " + ", n,
                                              " pages exceed the reservation of ",
                                              capacity_pages()));
  }
  return region_->MapPages(mapped, pages);
}

absl::StatusOr<std::vector<PageId>> KvRegion::ShrinkTail(int64_t n_pages) {
  absl::MutexLock lock(&resize_mu_);
  const int64_t mapped = mapped_pages();
  if (n_pages < 0 || mapped - n_pages < baseline_pages_) {
    return absl::OutOfRangeError(absl::StrCat("KvRegion::ShrinkTail(", n_pages, "): ", mapped,
                                              " pages are mapped and the baseline of ",
                                              baseline_pages_, " pages stays"));
  }
  return region_->UnmapPages(mapped - n_pages, n_pages);
}

}  // namespace vamp
