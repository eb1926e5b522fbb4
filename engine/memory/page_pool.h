// Physical pages and the virtual ranges they are mapped into (shared/DESIGN.md, "Memory model").
//
// PagePool creates every physical page once, at start-up; afterwards pages only change owner, and
// page ids are the currency the layers above trade in. The pool records where each page is:
//   free    - in the pool, mapped nowhere;
//   held    - taken from the pool (or unmapped from a region) and not mapped yet: in transit;
//   mapped  - mapped at exactly one slot of exactly one VirtualRegion.
// Mapping a page that is not held is refused, so no page can ever be mapped twice (invariant 3).
//
// VirtualRegion is one reserved address range of whole pages. Pages are mapped into and unmapped
// from page slots; the address range never moves, so whatever lives in a region keeps its address
// while its physical backing changes.
//
// Both classes are thread-safe.
#ifndef VAMP_ENGINE_MEMORY_PAGE_POOL_H_
#define VAMP_ENGINE_MEMORY_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/memory/memory_backend.h"

namespace vamp {

// Index of a physical page in its pool, 0 .. num_pages-1.
using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

// What a region holds; page accounting is reported per kind.
enum class RegionKind { kExpert, kKv, kStaging, kOther };

class VirtualRegion;

class PagePool {
 public:
  // Creates `num_pages` physical pages on `backend`, which must outlive the pool.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(MemoryBackend* backend,
                                                          int64_t num_pages);
  // Releases every page. All regions using the pool must be destroyed first.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  MemoryBackend* backend() const { return backend_; }
  uint64_t page_bytes() const { return page_bytes_; }
  int64_t num_pages() const { return static_cast<int64_t>(handles_.size()); }
  int64_t num_free() const;

  // Takes `n` free pages, which become held. ResourceExhausted (saying how many are free) when
  // fewer than `n` are.
  absl::StatusOr<std::vector<PageId>> Allocate(int64_t n);
  // Returns held pages to the pool. FailedPrecondition if any is not held (nothing is changed).
  absl::Status Free(absl::Span<const PageId> pages);

  // Pages by state, and mapped pages by the kind of region holding them. Every page is counted
  // exactly once: free + held + mapped_* == num_pages().
  struct Accounting {
    int64_t free = 0;
    int64_t held = 0;
    int64_t mapped_expert = 0;
    int64_t mapped_kv = 0;
    int64_t mapped_staging = 0;
    int64_t mapped_other = 0;
  };
  Accounting Account() const;

  // Checks that the pool's records and the regions' slot tables describe the same mapping: every
  // page a region shows at a slot is recorded as mapped there, and every page recorded as mapped is
  // in one of `regions` at that slot. Internal error naming the first disagreement.
  absl::Status Audit(absl::Span<const VirtualRegion* const> regions) const;

 private:
  friend class VirtualRegion;
  enum class State : uint8_t { kFree, kHeld, kMapped };
  struct Owner {
    State state = State::kFree;
    const VirtualRegion* region = nullptr;
    int64_t slot = -1;
  };

  PagePool(MemoryBackend* backend, std::vector<PhysicalPageHandle> handles);
  // The backend handle of a page (immutable after creation, so no lock).
  PhysicalPageHandle handle(PageId page) const { return handles_[static_cast<size_t>(page)]; }
  // held -> mapped at (region, first_slot + i); refuses (changing nothing) unless all are held.
  absl::Status RecordMapped(absl::Span<const PageId> pages, const VirtualRegion* region,
                            int64_t first_slot);
  // mapped -> held.
  void RecordUnmapped(absl::Span<const PageId> pages);

  MemoryBackend* const backend_;
  const uint64_t page_bytes_;
  const std::vector<PhysicalPageHandle> handles_;

  mutable absl::Mutex mu_;
  std::vector<Owner> owners_ ABSL_GUARDED_BY(mu_);
  // Free pages; Allocate takes from the back.
  std::vector<PageId> free_ ABSL_GUARDED_BY(mu_);
};

class VirtualRegion {
 public:
  // Reserves `capacity_pages` pages of address space; nothing is mapped yet. `label` names the
  // region in errors and logs ("experts.layer3", "kv").
  static absl::StatusOr<std::unique_ptr<VirtualRegion>> Reserve(PagePool* pool, RegionKind kind,
                                                                std::string label,
                                                                int64_t capacity_pages);
  // Unmaps every mapped page, returns it to the pool and frees the address range.
  ~VirtualRegion();
  VirtualRegion(const VirtualRegion&) = delete;
  VirtualRegion& operator=(const VirtualRegion&) = delete;

  DeviceAddress base() const { return base_; }
  int64_t capacity_pages() const { return capacity_pages_; }
  uint64_t capacity_bytes() const { return static_cast<uint64_t>(capacity_pages_) * page_bytes_; }
  uint64_t page_bytes() const { return page_bytes_; }
  RegionKind kind() const { return kind_; }
  const std::string& label() const { return label_; }
  PagePool* pool() const { return pool_; }

  // Maps held `pages` at slots [first_slot, first_slot + pages.size()), which must be unmapped, and
  // grants read/write access to the whole run with one call. On failure nothing stays mapped and
  // the pages are still held.
  absl::Status MapPages(int64_t first_slot, absl::Span<const PageId> pages);
  // Unmaps slots [first_slot, first_slot + count), which must all be mapped; the pages become held
  // and are returned in slot order. Their contents survive until someone writes them.
  absl::StatusOr<std::vector<PageId>> UnmapPages(int64_t first_slot, int64_t count);

  int64_t mapped_pages() const;
  // The page at `slot`, or kNoPage.
  PageId PageAt(int64_t slot) const;
  // The page at every slot (kNoPage where unmapped).
  std::vector<PageId> SlotTable() const;

 private:
  VirtualRegion(PagePool* pool, RegionKind kind, std::string label, int64_t capacity_pages,
                DeviceAddress base);
  absl::Status CheckSlots(int64_t first_slot, int64_t count) const;

  PagePool* const pool_;
  const RegionKind kind_;
  const std::string label_;
  const int64_t capacity_pages_;
  const uint64_t page_bytes_;
  const DeviceAddress base_;

  mutable absl::Mutex mu_;
  std::vector<PageId> slots_ ABSL_GUARDED_BY(mu_);
  int64_t mapped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_PAGE_POOL_H_
