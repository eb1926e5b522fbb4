#include "engine/experts/expert_store.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Create(PagePool* pool,
                                                                 const ExpertGeometry& geometry) {
  if (geometry.page_bytes != pool->page_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertStore: geometry is for ", geometry.page_bytes,
                     "-byte pages but the pool has ", pool->page_bytes(), "-byte pages"));
  }
  if (geometry.total_pages() + geometry.reserved_staging_pages() > pool->num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ExpertStore: the expert regions need ", geometry.total_pages(), " pages (",
        geometry.moe_layers.size(), " layers x ", geometry.region_pages, ") and the reserved ",
        "staging buffers ", geometry.reserved_staging_pages(), ", the pool has ", pool->num_free(),
        " free"));
  }
  std::vector<std::unique_ptr<VirtualRegion>> regions;
  for (int layer : geometry.moe_layers) {
    VAMP_ASSIGN_OR_RETURN(
        std::unique_ptr<VirtualRegion> region,
        VirtualRegion::Reserve(pool, RegionKind::kExpert, absl::StrCat("experts.layer", layer),
                               geometry.region_pages));
    VAMP_ASSIGN_OR_RETURN(std::vector<PageId> pages, pool->Allocate(geometry.region_pages));
    if (absl::Status s = region->MapPages(0, pages); !s.ok()) {
      pool->Free(pages).IgnoreError();
      return s;
    }
    regions.push_back(std::move(region));
  }
  std::vector<std::unique_ptr<VirtualRegion>> staging;
  for (int i = 0; i < geometry.num_staging_buffers; ++i) {
    VAMP_ASSIGN_OR_RETURN(std::unique_ptr<VirtualRegion> region,
                          VirtualRegion::Reserve(pool, RegionKind::kStaging,
                                                 absl::StrCat("staging.", i),
                                                 geometry.staging_buffer_pages()));
    if (!geometry.staging_carved) {
      VAMP_ASSIGN_OR_RETURN(std::vector<PageId> pages,
                            pool->Allocate(geometry.staging_buffer_pages()));
      if (absl::Status s = region->MapPages(0, pages); !s.ok()) {
        pool->Free(pages).IgnoreError();
        return s;
      }
    }
    staging.push_back(std::move(region));
  }
  return std::unique_ptr<ExpertStore>(
      new ExpertStore(pool, geometry, std::move(regions), std::move(staging)));
}

ExpertStore::ExpertStore(PagePool* pool, ExpertGeometry geometry,
                         std::vector<std::unique_ptr<VirtualRegion>> regions,
                         std::vector<std::unique_ptr<VirtualRegion>> staging)
    : pool_(pool),
      geometry_(std::move(geometry)),
      regions_(std::move(regions)),
      staging_(std::move(staging)) {
  int max_layer = 0;
  for (int layer : geometry_.moe_layers) max_layer = std::max(max_layer, layer);
  moe_index_.assign(static_cast<size_t>(max_layer) + 1, -1);
  for (size_t i = 0; i < geometry_.moe_layers.size(); ++i) {
    moe_index_[static_cast<size_t>(geometry_.moe_layers[i])] = static_cast<int>(i);
  }
  absl::MutexLock lock(&mu_);
  boundary_ = geometry_.num_experts;
}

// Regions unmap their pages and hand them back to the pool as they are destroyed.
ExpertStore::~ExpertStore() = default;

int ExpertStore::MoeIndex(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(moe_index_.size())) return -1;
  return moe_index_[static_cast<size_t>(layer)];
}

bool ExpertStore::IsMoeLayer(int layer) const { return MoeIndex(layer) >= 0; }

bool ExpertStore::IsEligible(int layer) const { return MoeIndex(layer) >= 1; }

int64_t ExpertStore::SlotOfBoundary(int64_t b) const {
  return static_cast<int64_t>(geometry_.ExpertOffset(b) / geometry_.page_bytes);
}

absl::Status ExpertStore::CheckExpert(int layer, int64_t expert) const {
  if (!IsMoeLayer(layer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertStore: layer ", layer, " has no routed experts"));
  }
  if (expert < 0 || expert >= geometry_.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertStore: expert ", expert,
                                                   " is outside [0, ", geometry_.num_experts, ")"));
  }
  return absl::OkStatus();
}

DeviceAddress ExpertStore::RegionBase(int layer) const {
  const int i = MoeIndex(layer);
  VAMP_CHECK(i >= 0) << "layer " << layer << " has no routed experts";
  return regions_[static_cast<size_t>(i)]->base();
}

DeviceAddress ExpertStore::W13Address(int layer, int64_t expert) const {
  return RegionBase(layer) + geometry_.ExpertOffset(expert);
}

DeviceAddress ExpertStore::W2Address(int layer, int64_t expert) const {
  return W13Address(layer, expert) + geometry_.w13_bytes;
}

absl::Status ExpertStore::WriteExpert(int layer, int64_t expert, absl::Span<const uint8_t> w13,
                                      absl::Span<const uint8_t> w2) {
  if (w13.size() != geometry_.w13_bytes || w2.size() != geometry_.w2_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertStore::WriteExpert(layer ", layer, ", expert ", expert, "): got ",
                     w13.size(), " + ", w2.size(), " bytes, the rank-local shard is ",
                     geometry_.w13_bytes, " (w13) + ", geometry_.w2_bytes, " (w2)"));
  }
  VAMP_RETURN_IF_ERROR(WriteExpertBytes(layer, expert, 0, w13));
  return WriteExpertBytes(layer, expert, geometry_.w13_bytes, w2);
}

absl::Status ExpertStore::WriteExpertBytes(int layer, int64_t expert, uint64_t offset,
                                           absl::Span<const uint8_t> bytes) {
  VAMP_RETURN_IF_ERROR(CheckExpert(layer, expert));
  if (offset > geometry_.expert_bytes || bytes.size() > geometry_.expert_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExpertStore::WriteExpertBytes(layer ", layer, ", expert ", expert, "): [", offset, ", ",
        offset + bytes.size(), ") is outside the ", geometry_.expert_bytes, "-byte shard"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (finalized_) {
      return absl::FailedPreconditionError(
          "ExpertStore: weights are frozen after FinalizeLoad (the pinned host copies would "
          "diverge)");
    }
  }
  return backend()->CopyHostToDevice(W13Address(layer, expert) + offset, bytes.data(),
                                     bytes.size());
}

absl::Status ExpertStore::FinalizeLoad() {
  absl::MutexLock remap_lock(&remap_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (finalized_) return absl::FailedPreconditionError("ExpertStore: FinalizeLoad called twice");
  }
  std::vector<PinnedHostBuffer> pinned;
  if (geometry_.max_offload_experts > 0) {
    const uint64_t bytes =
        static_cast<uint64_t>(geometry_.max_offload_experts) * geometry_.expert_bytes;
    for (int layer : geometry_.eligible_layers) {
      VAMP_ASSIGN_OR_RETURN(PinnedHostBuffer buffer, PinnedHostBuffer::Allocate(backend(), bytes));
      VAMP_RETURN_IF_ERROR(
          backend()->CopyDeviceToHost(buffer.data(), W13Address(layer, FirstOffloadable()), bytes));
      pinned.push_back(std::move(buffer));
    }
  }
  absl::MutexLock lock(&mu_);
  pinned_ = std::move(pinned);
  finalized_ = true;
  return absl::OkStatus();
}

bool ExpertStore::load_finalized() const {
  absl::MutexLock lock(&mu_);
  return finalized_;
}

DeviceAddress ExpertStore::StagingBufferAddress(int buffer) const {
  VAMP_CHECK(buffer >= 0 && buffer < static_cast<int>(staging_.size()))
      << "staging buffer " << buffer << " of " << staging_.size();
  return staging_[static_cast<size_t>(buffer)]->base();
}

uint64_t ExpertStore::staging_mapped_bytes() const {
  uint64_t bytes = 0;
  for (const auto& region : staging_) {
    bytes += static_cast<uint64_t>(region->mapped_pages()) * geometry_.page_bytes;
  }
  return bytes;
}

int64_t ExpertStore::boundary() const {
  absl::MutexLock lock(&mu_);
  return boundary_;
}

int64_t ExpertStore::offloaded_groups() const {
  absl::MutexLock lock(&mu_);
  return (geometry_.num_experts - boundary_) / geometry_.group_experts;
}

uint64_t ExpertStore::table_version() const {
  absl::MutexLock lock(&mu_);
  return table_version_;
}

uint64_t ExpertStore::offloaded_bytes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint64_t>(geometry_.num_experts - boundary_) * geometry_.expert_bytes *
         geometry_.eligible_layers.size();
}

std::vector<ExpertLocation> ExpertStore::PointerTable(int layer) const {
  const int i = MoeIndex(layer);
  VAMP_CHECK(i >= 0) << "layer " << layer << " has no routed experts";
  const int64_t b = i == 0 ? geometry_.num_experts : boundary();
  const DeviceAddress base = regions_[static_cast<size_t>(i)]->base();
  std::vector<ExpertLocation> table(static_cast<size_t>(geometry_.num_experts));
  for (int64_t e = 0; e < geometry_.num_experts; ++e) {
    ExpertLocation& loc = table[static_cast<size_t>(e)];
    if (e < b) {
      loc.where = ExpertLocation::Where::kResident;
      loc.w13 = base + geometry_.ExpertOffset(e);
    } else {
      loc.where = ExpertLocation::Where::kStaging;
      loc.w13 = static_cast<uint64_t>(e - b) * geometry_.expert_bytes;
    }
    loc.w2 = loc.w13 + geometry_.w13_bytes;
  }
  return table;
}

ExpertStore::HostRange ExpertStore::OffloadedHostRange(int layer) const {
  const int i = MoeIndex(layer);
  VAMP_CHECK(i >= 0) << "layer " << layer << " has no routed experts";
  absl::MutexLock lock(&mu_);
  HostRange range;
  range.first_expert = boundary_;
  if (i == 0 || boundary_ == geometry_.num_experts) return range;
  range.num_experts = geometry_.num_experts - boundary_;
  range.bytes = static_cast<uint64_t>(range.num_experts) * geometry_.expert_bytes;
  range.data = pinned_[static_cast<size_t>(i - 1)].data() +
               static_cast<uint64_t>(boundary_ - FirstOffloadable()) * geometry_.expert_bytes;
  return range;
}

absl::Status ExpertStore::ReadExpert(int layer, int64_t expert, absl::Span<uint8_t> out) const {
  VAMP_RETURN_IF_ERROR(CheckExpert(layer, expert));
  if (out.size() != geometry_.expert_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertStore::ReadExpert: output has ",
                                                   out.size(), " bytes, the shard ",
                                                   geometry_.expert_bytes));
  }
  const int i = MoeIndex(layer);
  {
    absl::MutexLock lock(&mu_);
    if (i > 0 && expert >= boundary_) {
      const uint8_t* src =
          pinned_[static_cast<size_t>(i - 1)].data() +
          static_cast<uint64_t>(expert - FirstOffloadable()) * geometry_.expert_bytes;
      std::memcpy(out.data(), src, out.size());
      return absl::OkStatus();
    }
  }
  return backend()->CopyDeviceToHost(out.data(), W13Address(layer, expert), out.size());
}

absl::StatusOr<std::vector<PageId>> ExpertStore::Offload(int64_t n_groups, InFlightFence& fence,
                                                         RemapTimings* timings) {
  absl::MutexLock remap_lock(&remap_mu_);
  int64_t old_b;
  {
    absl::MutexLock lock(&mu_);
    if (!finalized_) {
      return absl::FailedPreconditionError(
          "ExpertStore::Offload before FinalizeLoad: there are no pinned host copies yet");
    }
    const int64_t offloaded = (geometry_.num_experts - boundary_) / geometry_.group_experts;
    if (n_groups < 1 || offloaded + n_groups > geometry_.max_groups) {
      return absl::OutOfRangeError(absl::StrCat(
          "ExpertStore::Offload(", n_groups, "): ", offloaded, " of at most ", geometry_.max_groups,
          " groups are offloaded, so 1..", geometry_.max_groups - offloaded, " more can be (cap: ",
          geometry_.max_offload_experts, " of ", geometry_.num_experts, " experts per layer)"));
    }
    old_b = boundary_;
    // New steps read [new_b, E) from the staging buffer from now on.
    boundary_ = old_b - n_groups * geometry_.group_experts;
    ++table_version_;
  }
  const int64_t new_b = old_b - n_groups * geometry_.group_experts;
  auto undo_boundary = [&] {
    absl::MutexLock lock(&mu_);
    boundary_ = old_b;
    ++table_version_;
  };

  auto start = std::chrono::steady_clock::now();
  if (absl::Status s = fence.WaitUntilIdle(); !s.ok()) {
    undo_boundary();
    return absl::Status(
        s.code(), absl::StrCat("ExpertStore::Offload: waiting for in-flight work: ", s.message()));
  }
  if (timings != nullptr) timings->fence_us += MicrosSince(start);

  start = std::chrono::steady_clock::now();
  const int64_t first_slot = SlotOfBoundary(new_b);
  const int64_t count = SlotOfBoundary(old_b) - first_slot;
  std::vector<PageId> pages;
  pages.reserve(static_cast<size_t>(count) * geometry_.eligible_layers.size());
  for (size_t j = 0; j < geometry_.eligible_layers.size(); ++j) {
    VirtualRegion& region = *regions_[j + 1];
    absl::StatusOr<std::vector<PageId>> freed = region.UnmapPages(first_slot, count);
    if (!freed.ok()) {
      // Put back what was already taken: the pages still hold the weights.
      RemapIntoRegions(pages, first_slot, static_cast<size_t>(count));
      undo_boundary();
      return freed.status();
    }
    pages.insert(pages.end(), freed->begin(), freed->end());
  }
  if (timings != nullptr) timings->unmap_us += MicrosSince(start);

  if (geometry_.staging_carved) {
    start = std::chrono::steady_clock::now();
    const int64_t before = (geometry_.num_experts - old_b) / geometry_.group_experts;
    if (absl::Status s = GrowStaging(pages, before, n_groups); !s.ok()) {
      RemapIntoRegions(pages, first_slot, static_cast<size_t>(count));
      undo_boundary();
      return s;
    }
    pages.erase(pages.begin(), pages.begin() + geometry_.staging_pages_per_group() * n_groups);
    if (timings != nullptr) timings->map_us += MicrosSince(start);
  }
  return pages;
}

void ExpertStore::RemapIntoRegions(absl::Span<const PageId> pages, int64_t first_slot,
                                   size_t per_layer) {
  for (size_t k = 0; k + 1 < regions_.size() && (k + 1) * per_layer <= pages.size(); ++k) {
    if (absl::Status s = regions_[k + 1]->MapPages(first_slot, pages.subspan(k * per_layer,
                                                                             per_layer));
        !s.ok()) {
      VAMP_LOG(ERROR) << "ExpertStore: putting pages back into " << regions_[k + 1]->label()
                      << ": " << s;
    }
  }
}

absl::Status ExpertStore::GrowStaging(absl::Span<const PageId> pages, int64_t offloaded_groups,
                                      int64_t n_groups) {
  const size_t run = static_cast<size_t>(n_groups * geometry_.group_pages);
  const int64_t slot = offloaded_groups * geometry_.group_pages;
  for (size_t i = 0; i < staging_.size(); ++i) {
    if (absl::Status s = staging_[i]->MapPages(slot, pages.subspan(i * run, run)); !s.ok()) {
      for (size_t k = 0; k < i; ++k) {
        if (absl::Status u = staging_[k]->UnmapPages(slot, static_cast<int64_t>(run)).status();
            !u.ok()) {
          VAMP_LOG(ERROR) << "ExpertStore: unmapping " << staging_[k]->label() << ": " << u;
        }
      }
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PageId>> ExpertStore::ShrinkStaging(int64_t offloaded_groups,
                                                               int64_t n_groups) {
  const int64_t run = n_groups * geometry_.group_pages;
  const int64_t slot = (offloaded_groups - n_groups) * geometry_.group_pages;
  std::vector<PageId> pages;
  for (size_t i = 0; i < staging_.size(); ++i) {
    absl::StatusOr<std::vector<PageId>> freed = staging_[i]->UnmapPages(slot, run);
    if (!freed.ok()) {
      for (size_t k = 0; k < i; ++k) {
        absl::Span<const PageId> back(pages.data() + k * static_cast<size_t>(run),
                                      static_cast<size_t>(run));
        if (absl::Status s = staging_[k]->MapPages(slot, back); !s.ok()) {
          VAMP_LOG(ERROR) << "ExpertStore: putting pages back into " << staging_[k]->label()
                          << ": " << s;
        }
      }
      return freed.status();
    }
    pages.insert(pages.end(), freed->begin(), freed->end());
  }
  return pages;
}

absl::Status ExpertStore::Restore(absl::Span<const PageId> kv_pages, RemapTimings* timings) {
  absl::MutexLock remap_lock(&remap_mu_);
  const int64_t per_group = geometry_.kv_pages_per_group();
  int64_t old_b;
  {
    absl::MutexLock lock(&mu_);
    if (!finalized_) {
      return absl::FailedPreconditionError("ExpertStore::Restore before FinalizeLoad");
    }
    const int64_t offloaded = (geometry_.num_experts - boundary_) / geometry_.group_experts;
    if (per_group == 0 || kv_pages.empty() ||
        static_cast<int64_t>(kv_pages.size()) % per_group != 0 ||
        static_cast<int64_t>(kv_pages.size()) / per_group > offloaded) {
      return absl::OutOfRangeError(absl::StrCat(
          "ExpertStore::Restore: got ", kv_pages.size(), " pages; restoring takes whole groups of ",
          per_group, " pages and at most the ", offloaded, " offloaded group(s)"));
    }
    old_b = boundary_;
  }
  const int64_t n_groups = static_cast<int64_t>(kv_pages.size()) / per_group;
  const int64_t new_b = old_b + n_groups * geometry_.group_experts;
  const int64_t first_slot = SlotOfBoundary(old_b);
  const size_t count = static_cast<size_t>(SlotOfBoundary(new_b) - first_slot);

  auto start = std::chrono::steady_clock::now();
  // The carved staging buffers' share first, then the caller's pages.
  std::vector<PageId> pages;
  const int64_t offloaded = (geometry_.num_experts - old_b) / geometry_.group_experts;
  if (geometry_.staging_carved) {
    VAMP_ASSIGN_OR_RETURN(pages, ShrinkStaging(offloaded, n_groups));
  }
  const size_t staging_pages = pages.size();
  pages.insert(pages.end(), kv_pages.begin(), kv_pages.end());
  // Undoes the staging shrink (the caller keeps its pages).
  auto undo_staging = [&] {
    if (staging_pages == 0) return;
    if (absl::Status s = GrowStaging(absl::MakeConstSpan(pages.data(), staging_pages),
                                     offloaded - n_groups, n_groups);
        !s.ok()) {
      VAMP_LOG(ERROR) << "ExpertStore::Restore rollback: " << s;
    }
  };
  for (size_t j = 0; j < geometry_.eligible_layers.size(); ++j) {
    absl::Status s =
        regions_[j + 1]->MapPages(first_slot, absl::MakeConstSpan(pages).subspan(j * count, count));
    if (!s.ok()) {
      for (size_t k = 0; k < j; ++k) {
        if (absl::Status u =
                regions_[k + 1]->UnmapPages(first_slot, static_cast<int64_t>(count)).status();
            !u.ok()) {
          VAMP_LOG(ERROR) << "ExpertStore::Restore rollback: " << u;
        }
      }
      undo_staging();
      return s;
    }
  }
  if (timings != nullptr) timings->map_us += MicrosSince(start);

  // The pages may have held KV blocks: every byte of the restored experts is rewritten.
  start = std::chrono::steady_clock::now();
  const uint64_t bytes = static_cast<uint64_t>(new_b - old_b) * geometry_.expert_bytes;
  for (size_t j = 0; j < geometry_.eligible_layers.size(); ++j) {
    const uint8_t* src;
    {
      absl::MutexLock lock(&mu_);
      src = pinned_[j].data() +
            static_cast<uint64_t>(old_b - FirstOffloadable()) * geometry_.expert_bytes;
    }
    absl::Status s = backend()->CopyHostToDevice(
        regions_[j + 1]->base() + geometry_.ExpertOffset(old_b), src, bytes);
    if (!s.ok()) {
      for (size_t k = 0; k < geometry_.eligible_layers.size(); ++k) {
        if (absl::Status u =
                regions_[k + 1]->UnmapPages(first_slot, static_cast<int64_t>(count)).status();
            !u.ok()) {
          VAMP_LOG(ERROR) << "ExpertStore::Restore rollback: " << u;
        }
      }
      undo_staging();
      return s;
    }
  }
  if (timings != nullptr) timings->copy_us += MicrosSince(start);

  absl::MutexLock lock(&mu_);
  boundary_ = new_b;
  ++table_version_;
  return absl::OkStatus();
}

std::vector<const VirtualRegion*> ExpertStore::regions() const {
  std::vector<const VirtualRegion*> out;
  out.reserve(regions_.size());
  for (const auto& region : regions_) out.push_back(region.get());
  return out;
}

std::vector<const VirtualRegion*> ExpertStore::staging_regions() const {
  std::vector<const VirtualRegion*> out;
  out.reserve(staging_.size());
  for (const auto& region : staging_) out.push_back(region.get());
  return out;
}

}  // namespace vamp
