// PageRemapper: one agent's side of expert <-> KV remapping (shared/DESIGN.md, "Offload",
// "Restore"; paper §IV-C, §V-A). Physical pages move between the expert regions and the end of the
// KV region; no virtual address ever moves.
//
// The controller sizes every remap itself from the geometry the agent declared at Init (KV pages
// per group, block bytes; BlocksAddedByOffload and BlocksRemovedByRestore are the same
// arithmetic on this side), and the agent applies the remap it chose at a step boundary:
//   Offload(n): b moves down by n groups; wait until nothing in flight reads the pages; unmap them
//               from the expert regions; carved staging buffers take their share (ExpertStore);
//               map the rest at the end of the KV region; report the blocks.
//   Restore(n): only tail pages whose blocks the KV manager has freed and stopped handing out
//               (it says how many tail blocks are free); wait; unmap them from the KV region; map
//               them, with the staging buffers' share, back into the expert regions; copy the
//               weights from the pinned copies; b up.
//
// Invariants (Audit checks them): no page is mapped twice; every page of the pool is accounted for
// as expert, KV, staging or free; KV pages = baseline + offloaded groups x kv_pages_per_group;
// staging pages = reserved + offloaded groups x staging_pages_per_group; expert pages = all
// regions minus the offloaded pages.
//
// Thread-safe; remaps are serialised.
#ifndef VAMP_ENGINE_KV_PAGE_REMAPPER_H_
#define VAMP_ENGINE_KV_PAGE_REMAPPER_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/experts/expert_store.h"
#include "engine/kv/kv_region.h"
#include "engine/memory/fence.h"
#include "engine/memory/memory_backend.h"
#include "engine/memory/memory_plan.h"
#include "engine/memory/page_pool.h"

namespace vamp {

struct RemapResult {
  int64_t groups = 0;  // group steps moved (each: one group in every eligible layer)
  int64_t pages = 0;   // pages that changed owner
  int64_t kv_blocks_before = 0;
  int64_t kv_blocks_after = 0;
  int64_t boundary = 0;  // b afterwards
  RemapTimings timings;
  double total_us = 0;
};

class PageRemapper {
 public:
  // None of the pointers is owned; all must outlive the page remapper. `experts` and `kv` must use
  // the same pool.
  PageRemapper(PagePool* pool, ExpertStore* experts, KvRegion* kv, InFlightFence* fence);

  int64_t offloaded_groups() const { return experts_->offloaded_groups(); }
  int64_t remaining_groups() const { return experts_->remaining_groups(); }

  // KV blocks that offloading `n_groups` more groups would add. OutOfRange past the cap.
  absl::StatusOr<int64_t> BlocksAddedByOffload(int64_t n_groups) const;
  // KV blocks that restoring `n_groups` groups would remove from the tail: blocks
  // [num_blocks - result, num_blocks) must be free first. OutOfRange beyond what is offloaded.
  absl::StatusOr<int64_t> BlocksRemovedByRestore(int64_t n_groups) const;

  absl::StatusOr<RemapResult> Offload(int64_t n_groups);
  // `free_tail_blocks`: how many blocks at the tail of the KV pool the caller has verified free and
  // will not hand out; FailedPrecondition when the restore would take more than those.
  absl::StatusOr<RemapResult> Restore(int64_t n_groups, int64_t free_tail_blocks);

  // Checks the page invariants above; Internal error describing the first violation.
  absl::Status Audit() const;

 private:
  PagePool* const pool_;
  ExpertStore* const experts_;
  KvRegion* const kv_;
  InFlightFence* const fence_;
  absl::Mutex mu_;  // serialises remaps
};

}  // namespace vamp

#endif  // VAMP_ENGINE_KV_PAGE_REMAPPER_H_
