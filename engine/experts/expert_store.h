// ExpertStore: where every rank-local expert shard lives, and the pages that can leave.
// (shared/DESIGN.md, "Memory model"; paper §IV-C, §V-A, §V-B.)
//
// Each MoE layer owns one VirtualRegion laid out expert-major (ExpertGeometry): expert e's shard
// [w13 | w2] at RegionBase(layer) + geometry().ExpertOffset(e), at the same address for the life of
// the store. In every eligible layer (all MoE layers but the first) the top experts [b, E) may be
// offloaded, b being the residency boundary shared by all eligible layers:
//   - Offload(n, fence) moves b down by n groups, waits until nothing in flight can read the
//     affected pages, unmaps them and hands them out;
//   - Restore(pages) maps handed-back pages (any pages: contents are rewritten) at the top of the
//     resident part, copies the weights back from the pinned host copies, and moves b up.
// Experts below b are read from their region; experts at or above b from the staging buffer, which
// the staging engine fills from OffloadedHostRange(layer) before the layer's MoE runs.
//
// Lifecycle: Create (pages mapped, contents undefined) -> WriteExpert/WriteExpertBytes for every
// expert -> FinalizeLoad (pinned host copies of every offloadable expert, weights frozen) ->
// Offload/Restore any number of times.
//
// Layers are decoder-layer indices; experts are rank-local indices 0..E-1; bytes are raw bytes of
// whatever dtype the weights have. Thread-safe; Offload and Restore must not run concurrently with
// a step that reads the pointer table they change (the caller applies them at step boundaries).
#ifndef VAMP_ENGINE_EXPERTS_EXPERT_STORE_H_
#define VAMP_ENGINE_EXPERTS_EXPERT_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/memory/fence.h"
#include "engine/memory/geometry.h"
#include "engine/memory/memory_backend.h"
#include "engine/memory/page_pool.h"

namespace vamp {

// Where one expert's weights are for the next step.
struct ExpertLocation {
  enum class Where : uint8_t { kResident, kStaging };
  Where where = Where::kResident;
  // kResident: device addresses of w13 and w2 in the layer's region.
  // kStaging: byte offsets of w13 and w2 from the start of the staging buffer holding the layer's
  // offloaded range [b, E) (expert e at (e - b) * expert_bytes).
  uint64_t w13 = 0;
  uint64_t w2 = 0;
};

// Time spent in each part of a remap, microseconds.
struct RemapTimings {
  double fence_us = 0;
  double unmap_us = 0;
  double map_us = 0;   // map and set access
  double copy_us = 0;  // restoring weights from the pinned copies
};

class ExpertStore {
 public:
  // Reserves and maps one region per MoE layer with pages from `pool` (geometry.total_pages() of
  // them must be free). The pool and its backend must outlive the store.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Create(PagePool* pool,
                                                             const ExpertGeometry& geometry);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const ExpertGeometry& geometry() const { return geometry_; }
  MemoryBackend* backend() const { return pool_->backend(); }

  // ---- Loading ----
  // Writes one expert's shard from host memory: `w13` (w13_bytes) and `w2` (w2_bytes).
  absl::Status WriteExpert(int layer, int64_t expert, absl::Span<const uint8_t> w13,
                           absl::Span<const uint8_t> w2);
  // Writes `bytes` at `offset` within an expert's shard (e.g. gate and up halves separately).
  absl::Status WriteExpertBytes(int layer, int64_t expert, uint64_t offset,
                                absl::Span<const uint8_t> bytes);
  // Copies every offloadable expert (the top max_offload_experts of each eligible layer) into
  // pinned host memory, once. Afterwards writes are refused and Offload/Restore are allowed.
  absl::Status FinalizeLoad();
  bool load_finalized() const;

  // ---- Addresses (fixed for the store's life) ----
  bool IsMoeLayer(int layer) const;
  bool IsEligible(int layer) const;
  DeviceAddress RegionBase(int layer) const;
  DeviceAddress W13Address(int layer, int64_t expert) const;
  DeviceAddress W2Address(int layer, int64_t expert) const;

  // ---- Residency ----
  // b: experts [0, b) of eligible layers are resident, [b, E) offloaded. E when nothing is.
  int64_t boundary() const;
  int64_t offloaded_groups() const;
  int64_t remaining_groups() const { return geometry_.max_groups - offloaded_groups(); }
  // Bumped by every boundary change, so readers can cache device-side pointer tables.
  uint64_t table_version() const;
  // Expert bytes currently offloaded, over all layers.
  uint64_t offloaded_bytes() const;

  // For each expert of `layer`, where its weights are now. The first MoE layer is always resident.
  std::vector<ExpertLocation> PointerTable(int layer) const;

  // The offloaded experts [b, E) of `layer` in its pinned host copy, in region order: what the
  // staging engine copies into the staging buffer. Empty (bytes == 0) when nothing is offloaded or
  // the layer is not eligible.
  struct HostRange {
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    int64_t first_expert = 0;
    int64_t num_experts = 0;
  };
  HostRange OffloadedHostRange(int layer) const;

  // Copies an expert's current weights ([w13 | w2], expert_bytes) to `out`: from its region when
  // resident, from the pinned copy when offloaded.
  absl::Status ReadExpert(int layer, int64_t expert, absl::Span<uint8_t> out) const;

  // ---- Remapping (MemoryRepartitioner drives these at step boundaries) ----
  // Moves b down by `n_groups` groups, waits on `fence`, unmaps the freed pages of every eligible
  // layer and returns them (held; n_groups * geometry().pages_per_group(), layer by layer). Errors:
  // FailedPrecondition before FinalizeLoad, OutOfRange past the cap (max_groups). On failure
  // nothing changes.
  absl::StatusOr<std::vector<PageId>> Offload(int64_t n_groups, InFlightFence& fence,
                                              RemapTimings* timings = nullptr);
  // Takes `pages` (held; a whole number of group steps) back: maps them at the top of the resident
  // part, copies those experts' weights back from the pinned copies and moves b up. OutOfRange when
  // that is more than is offloaded. On failure the pages are still the caller's and nothing
  // changes.
  absl::Status Restore(absl::Span<const PageId> pages, RemapTimings* timings = nullptr);

  // The regions, for page audits.
  std::vector<const VirtualRegion*> regions() const;

 private:
  ExpertStore(PagePool* pool, ExpertGeometry geometry,
              std::vector<std::unique_ptr<VirtualRegion>> regions);
  // Index into moe_layers for `layer`, or -1.
  int MoeIndex(int layer) const;
  // The first page slot of expert `b` (page-aligned for every b = E - k*g).
  int64_t SlotOfBoundary(int64_t b) const;
  absl::Status CheckExpert(int layer, int64_t expert) const;
  // First expert with a pinned copy.
  int64_t FirstOffloadable() const { return geometry_.num_experts - geometry_.max_offload_experts; }

  PagePool* const pool_;
  const ExpertGeometry geometry_;
  // One region per MoE layer, in moe_layers order (immutable after construction).
  const std::vector<std::unique_ptr<VirtualRegion>> regions_;
  std::vector<int> moe_index_;  // by decoder layer; immutable after construction

  // Serialises Offload/Restore with each other; the boundary itself is under mu_ so readers
  // never wait for a remap's page work.
  absl::Mutex remap_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool finalized_ ABSL_GUARDED_BY(mu_) = false;
  int64_t boundary_ ABSL_GUARDED_BY(mu_);
  uint64_t table_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Per eligible layer (eligible_layers order): pinned copy of experts
  // [FirstOffloadable(), E). Written once in FinalizeLoad, then read-only.
  std::vector<PinnedHostBuffer> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_ENGINE_EXPERTS_EXPERT_STORE_H_
