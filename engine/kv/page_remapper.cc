#include "engine/kv/page_remapper.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace vamp {

PageRemapper::PageRemapper(PagePool* pool, ExpertStore* experts, KvRegion* kv, InFlightFence* fence)
    : pool_(pool), experts_(experts), kv_(kv), fence_(fence) {}

absl::StatusOr<int64_t> PageRemapper::BlocksAddedByOffload(int64_t n_groups) const {
  const int64_t remaining = experts_->remaining_groups();
  if (n_groups < 0 || n_groups > remaining) {
    return absl::OutOfRangeError(
        absl::StrCat("capacity query for ", n_groups, " groups: ", remaining,
                     " more can be offloaded (cap ", experts_->geometry().max_groups, ")"));
  }
  const int64_t pages = kv_->mapped_pages();
  return kv_->BlocksWithPages(pages + n_groups * experts_->geometry().kv_pages_per_group()) -
         kv_->BlocksWithPages(pages);
}

absl::StatusOr<int64_t> PageRemapper::BlocksRemovedByRestore(int64_t n_groups) const {
  const int64_t offloaded = experts_->offloaded_groups();
  if (n_groups < 0 || n_groups > offloaded) {
    return absl::OutOfRangeError(
        absl::StrCat("restore of ", n_groups, " groups: only ", offloaded, " are offloaded"));
  }
  const int64_t pages = kv_->mapped_pages();
  return kv_->BlocksWithPages(pages) -
         kv_->BlocksWithPages(pages - n_groups * experts_->geometry().kv_pages_per_group());
}

absl::StatusOr<RemapResult> PageRemapper::Offload(int64_t n_groups) {
  absl::MutexLock lock(&mu_);
  const auto start = std::chrono::steady_clock::now();
  RemapResult result;
  result.groups = n_groups;
  result.kv_blocks_before = kv_->num_blocks();
  VAMP_ASSIGN_OR_RETURN(std::vector<PageId> pages,
                        experts_->Offload(n_groups, *fence_, &result.timings));
  const auto map_start = std::chrono::steady_clock::now();
  if (absl::Status s = kv_->Grow(pages); !s.ok()) {
    // The pages are still ours: give them back to the experts (which rewrites their weights).
    if (absl::Status undo = experts_->Restore(pages); !undo.ok()) {
      return absl::InternalError(absl::StrCat("offload failed (", s.message(),
                                              ") and so did putting the experts back (",
                                              undo.message(), ")"));
    }
    return s;
  }
  result.timings.map_us += MicrosSince(map_start);
  result.pages = static_cast<int64_t>(pages.size());
  result.kv_blocks_after = kv_->num_blocks();
  result.boundary = experts_->boundary();
  result.total_us = MicrosSince(start);
  return result;
}

absl::StatusOr<RemapResult> PageRemapper::Restore(int64_t n_groups, int64_t free_tail_blocks) {
  absl::MutexLock lock(&mu_);
  const auto start = std::chrono::steady_clock::now();
  VAMP_ASSIGN_OR_RETURN(const int64_t removed, BlocksRemovedByRestore(n_groups));
  if (n_groups < 1) {
    return absl::OutOfRangeError(absl::StrCat("restore of ", n_groups, " groups: need at least 1"));
  }
  if (removed > free_tail_blocks) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore of ", n_groups, " groups removes the last ", removed, " KV blocks [",
                     kv_->num_blocks() - removed, ", ", kv_->num_blocks(), ") but only ",
                     free_tail_blocks, " tail blocks are free"));
  }
  RemapResult result;
  result.groups = n_groups;
  result.kv_blocks_before = kv_->num_blocks();

  auto step = std::chrono::steady_clock::now();
  if (absl::Status s = fence_->WaitUntilIdle(); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("restore: waiting for in-flight work: ", s.message()));
  }
  result.timings.fence_us += MicrosSince(step);

  step = std::chrono::steady_clock::now();
  const int64_t n_pages = n_groups * experts_->geometry().kv_pages_per_group();
  VAMP_ASSIGN_OR_RETURN(std::vector<PageId> pages, kv_->ShrinkTail(n_pages));
  result.timings.unmap_us += MicrosSince(step);

  if (absl::Status s = experts_->Restore(pages, &result.timings); !s.ok()) {
    // The tail blocks were free: map the pages back where they were.
    if (absl::Status undo = kv_->Grow(pages); !undo.ok()) {
      return absl::InternalError(absl::StrCat("restore failed (", s.message(),
                                              ") and so did returning the pages to the KV pool (",
                                              undo.message(), ")"));
    }
    return s;
  }
  result.pages = n_pages;
  result.kv_blocks_after = kv_->num_blocks();
  result.boundary = experts_->boundary();
  result.total_us = MicrosSince(start);
  return result;
}

absl::Status PageRemapper::Audit() const {
  std::vector<const VirtualRegion*> regions = experts_->regions();
  for (const VirtualRegion* region : experts_->staging_regions()) regions.push_back(region);
  regions.push_back(&kv_->region());
  VAMP_RETURN_IF_ERROR(pool_->Audit(regions));

  const PagePool::Accounting a = pool_->Account();
  const ExpertGeometry& g = experts_->geometry();
  const int64_t groups = experts_->offloaded_groups();
  const int64_t expected_expert = g.total_pages() - groups * g.pages_per_group();
  const int64_t expected_kv = kv_->baseline_pages() + groups * g.kv_pages_per_group();
  const int64_t expected_staging =
      g.reserved_staging_pages() + groups * g.staging_pages_per_group();
  if (a.held != 0 || a.mapped_other != 0 || a.mapped_expert != expected_expert ||
      a.mapped_kv != expected_kv || a.mapped_staging != expected_staging ||
      a.free + a.mapped_expert + a.mapped_kv + a.mapped_staging != pool_->num_pages()) {
    return absl::InternalError(absl::StrCat(
        "page accounting: pool of ", pool_->num_pages(), " pages has ", a.free, " free, ", a.held,
        " held, ", a.mapped_expert, " expert (expected ", expected_expert, "), ", a.mapped_kv,
        " KV (expected ", expected_kv, "), ", a.mapped_staging, " staging (expected ",
        expected_staging, "), ", a.mapped_other, " other"));
  }
  return absl::OkStatus();
}

}  // namespace vamp
