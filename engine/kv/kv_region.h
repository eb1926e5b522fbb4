// KvRegion: the paged KV cache's device memory (shared/DESIGN.md, "Memory model").
//
// One reserved range sized for the baseline pool plus everything that could ever be offloaded, laid
// out block-major (KvBlockGeometry): block i at base() + i * block_bytes holds K and V of every
// attention layer for block_size tokens. The pool grows by mapping pages at its end and shrinks
// only from its tail, so an existing block never moves and keeps its contents while the pool grows.
// num_blocks() = floor(mapped_bytes / block_bytes): bytes at the end that do not fill a whole block
// wait for the next page.
//
// Thread-safe.
#ifndef VAMP_ENGINE_KV_KV_REGION_H_
#define VAMP_ENGINE_KV_KV_REGION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/memory/geometry.h"
#include "engine/memory/page_pool.h"

namespace vamp {

class KvRegion {
 public:
  // Reserves baseline_pages + max_extra_pages pages and maps the baseline with pages from `pool`.
  // The pool must outlive the region.
  static absl::StatusOr<std::unique_ptr<KvRegion>> Create(PagePool* pool,
                                                          const KvBlockGeometry& geometry,
                                                          int64_t baseline_pages,
                                                          int64_t max_extra_pages);
  ~KvRegion();
  KvRegion(const KvRegion&) = delete;
  KvRegion& operator=(const KvRegion&) = delete;

  const KvBlockGeometry& geometry() const { return geometry_; }
  DeviceAddress base() const { return region_->base(); }
  // Address of block `block` (valid while block < num_blocks()).
  DeviceAddress BlockAddress(int64_t block) const {
    return base() + static_cast<uint64_t>(block) * geometry_.block_bytes;
  }
  // Addresses of one layer's K and V in a block (the layer must have KV).
  DeviceAddress KAddress(int64_t block, int layer) const {
    return BlockAddress(block) + geometry_.KOffset(layer);
  }
  DeviceAddress VAddress(int64_t block, int layer) const {
    return BlockAddress(block) + geometry_.VOffset(layer);
  }

  int64_t baseline_pages() const { return baseline_pages_; }
  int64_t capacity_pages() const { return region_->capacity_pages(); }
  int64_t mapped_pages() const;
  uint64_t mapped_bytes() const;
  int64_t num_blocks() const;
  // Blocks the region would have with `pages` pages mapped.
  int64_t BlocksWithPages(int64_t pages) const;

  // Maps held `pages` at the end. OutOfRange past the reservation (nothing mapped).
  absl::Status Grow(absl::Span<const PageId> pages);
  // Unmaps the last `n_pages` pages and returns them (held, in slot order). The caller guarantees
  // that blocks at or above BlocksWithPages(mapped_pages() - n_pages) are free and not read by
  // anything in flight. OutOfRange below the baseline.
  absl::StatusOr<std::vector<PageId>> ShrinkTail(int64_t n_pages);

  const VirtualRegion& region() const { return *region_; }

 private:
  KvRegion(KvBlockGeometry geometry, int64_t baseline_pages, std::unique_ptr<VirtualRegion> region);

  const KvBlockGeometry geometry_;
  const int64_t baseline_pages_;
  const std::unique_ptr<VirtualRegion> region_;
  // Serialises growth and shrinking (each is several region calls that must see the same tail).
  absl::Mutex resize_mu_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_KV_KV_REGION_H_
