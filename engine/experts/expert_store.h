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
// Experts below b are read from their region; experts at or above b from a staging buffer, which
// the staging engine fills from OffloadedHostRange(layer) before the layer's MoE runs.
//
// The store also owns the staging buffers: geometry().num_staging_buffers regions of
// staging_buffer_pages() each, at fixed addresses. Where geometry().staging_carved, a buffer's
// pages are the first pages each offload frees (buffer i takes those of the i-th eligible layer)
// and it is exactly as long as the offloaded range [b, E) of one layer; otherwise it is mapped
// whole at creation.
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
  // Reserves and maps one region per MoE layer with pages from `pool`, and reserves the staging
  // buffers (geometry.total_pages() + geometry.reserved_staging_pages() pages must be free). The
  // pool and its backend must outlive the store.
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

  // ---- Staging buffers (addresses fixed for the store's life) ----
  int num_staging_buffers() const { return geometry_.num_staging_buffers; }
  // Start of staging buffer `buffer` (0 <= buffer < num_staging_buffers()). Bytes past
  // staging_mapped_bytes() / num_staging_buffers() of it are not mapped.
  DeviceAddress StagingBufferAddress(int buffer) const;
  // Bytes of all staging buffers that are mapped now.
  uint64_t staging_mapped_bytes() const;

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

  // ---- Remapping (PageRemapper drives these at step boundaries) ----
  // Moves b down by `n_groups` groups, waits on `fence`, unmaps the freed pages of every eligible
  // layer, maps what carved staging buffers take (geometry().staging_pages_per_group() a group) at
  // their ends and returns the rest for the KV cache (held; n_groups *
  // geometry().kv_pages_per_group()). Errors: FailedPrecondition before FinalizeLoad, OutOfRange
  // past the cap (max_groups). On failure nothing changes.
  absl::StatusOr<std::vector<PageId>> Offload(int64_t n_groups, InFlightFence& fence,
                                              RemapTimings* timings = nullptr);
  // Takes `pages` (held; n * geometry().kv_pages_per_group() for n group steps) back, with the
  // last n groups' pages of carved staging buffers: maps them at the top of the resident part,
  // copies those experts' weights back from the pinned copies and moves b up. OutOfRange when that
  // is more than is offloaded. On failure the pages are still the caller's and nothing changes.
  // Nothing in flight may read the staging buffers (the caller has waited on its fence).
  absl::Status Restore(absl::Span<const PageId> pages, RemapTimings* timings = nullptr);

  // The expert regions, and the staging buffers' regions, for page audits.
  std::vector<const VirtualRegion*> regions() const;
  std::vector<const VirtualRegion*> staging_regions() const;

 private:
  ExpertStore(PagePool* pool, ExpertGeometry geometry,
              std::vector<std::unique_ptr<VirtualRegion>> regions,
              std::vector<std::unique_ptr<VirtualRegion>> staging);
  // Maps the first staging_pages_per_group() * n_groups of `pages` (the freed pages of eligible
  // layers 0, 1, ...) at the ends of the carved staging buffers, which hold `offloaded_groups`
  // groups before. On failure nothing stays mapped there.
  absl::Status GrowStaging(absl::Span<const PageId> pages, int64_t offloaded_groups,
                           int64_t n_groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(remap_mu_);
  // Unmaps the last `n_groups` groups' pages of the carved staging buffers, which hold
  // `offloaded_groups` groups, and returns them (held), buffer after buffer.
  absl::StatusOr<std::vector<PageId>> ShrinkStaging(int64_t offloaded_groups, int64_t n_groups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(remap_mu_);
  // Maps `pages` (layer-major, `per_layer` each) back into the eligible layers' regions at
  // `first_slot`; logs what fails (rollback paths only).
  void RemapIntoRegions(absl::Span<const PageId> pages, int64_t first_slot, size_t per_layer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(remap_mu_);
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
  // One region per staging buffer (the regions are immutable; their mappings change under
  // remap_mu_).
  const std::vector<std::unique_ptr<VirtualRegion>> staging_;
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
