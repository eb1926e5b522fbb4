#include "controller/core/kv_cache_manager.h"

#include <algorithm>

#include "common/logging.h"

namespace vamp {

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                               BlockHasher hasher, int32_t snapshot_blocks, bool snapshot_outputs)
    : block_size_(block_size),
      hasher_(hasher),
      pool_(num_blocks, enable_prefix_caching),
      snapshot_blocks_(snapshot_blocks),
      snapshot_outputs_(snapshot_outputs) {
  VAMP_CHECK(block_size > 0) << block_size;
  VAMP_CHECK(snapshot_blocks >= 0) << snapshot_blocks;
}

PrefixHit KvCacheManager::FindCachedPrefix(Request& request) const {
  PrefixHit hit;
  if (!pool_.caching_enabled() || request.num_tokens() == 0 || request.skip_prefix_cache_reads()) {
    return hit;
  }
  const int32_t max_blocks = (request.num_tokens() - 1) / block_size_;
  // Hashes computed already (handed over at arrival, or from an earlier admission) are looked up
  // a few blocks ahead of the walk: a long prefix's lookups miss the CPU caches in a table of
  // tens of thousands of blocks, and the prefetches overlap those misses.
  constexpr size_t kPrefetchDistance = 8;
  const std::vector<BlockHash>& hashes = request.block_hashes();
  hit.blocks.reserve(std::min<size_t>(hashes.size(), max_blocks));
  for (int32_t i = 0; i < max_blocks; ++i) {
    const size_t ahead = static_cast<size_t>(i) + kPrefetchDistance;
    if (ahead < hashes.size() && ahead < static_cast<size_t>(max_blocks)) {
      pool_.PrefetchLookup(hashes[ahead]);
    }
    // Hash lazily: a miss ends the prefix, so blocks past it are not hashed here.
    request.EnsureBlockHashes(i + 1, block_size_, hasher_);
    const BlockId id = pool_.Lookup(request.block_hashes()[i]);
    if (id == kNoBlock) break;
    hit.blocks.push_back(id);
  }
  if (snapshot_blocks_ > 0) {
    // The state at the hit's end must be restored: only a block anchoring a snapshot can end it.
    while (!hit.blocks.empty() && pool_.block(hit.blocks.back()).snapshot == kNoSnapshot) {
      hit.blocks.pop_back();
    }
    if (!hit.blocks.empty()) hit.snapshot = pool_.block(hit.blocks.back()).snapshot;
  }
  hit.num_tokens = static_cast<int32_t>(hit.blocks.size()) * block_size_;
  return hit;
}

void KvCacheManager::AcquirePrefix(Request& request, const PrefixHit& hit) {
  VAMP_CHECK(request.block_ids().empty()) << "request " << request.id() << " already has blocks";
  for (BlockId id : hit.blocks) pool_.Acquire(id);
  request.mutable_block_ids() = hit.blocks;
  request.set_num_cached_blocks(static_cast<int32_t>(hit.blocks.size()));
}

int32_t KvCacheManager::NumNewBlocksNeeded(const Request& request, int32_t num_total_tokens) const {
  const int32_t blocks = (num_total_tokens + block_size_ - 1) / block_size_;
  return std::max(0, blocks - static_cast<int32_t>(request.block_ids().size()));
}

int32_t KvCacheManager::Gap(const Request& request, int32_t num_total_tokens) const {
  return std::max(0, NumNewBlocksNeeded(request, num_total_tokens) - pool_.num_free_uncached());
}

absl::Span<const BlockId> KvCacheManager::AllocateSlots(Request& request,
                                                        int32_t num_total_tokens) {
  const int32_t n = NumNewBlocksNeeded(request, num_total_tokens);
  std::vector<BlockId>& table = request.mutable_block_ids();
  const size_t old_size = table.size();
  pool_.AllocateUncached(n, &table);
  return absl::MakeConstSpan(table).subspan(old_size);
}

void KvCacheManager::CacheComputedBlocks(Request& request) {
  if (!pool_.caching_enabled()) return;
  const int32_t full = std::min(request.num_computed_tokens(), request.num_tokens()) / block_size_;
  const int32_t first = request.num_cached_blocks();
  if (full <= first) return;
  VAMP_CHECK(full <= static_cast<int32_t>(request.block_ids().size()))
      << "request " << request.id() << ": " << full << " computed blocks, table of "
      << request.block_ids().size();
  request.EnsureBlockHashes(full, block_size_, hasher_);
  for (int32_t i = first; i < full; ++i) {
    pool_.Cache(request.block_ids()[i], request.block_hashes()[i]);
  }
  request.set_num_cached_blocks(full);
}

int32_t KvCacheManager::PromptSnapshotPoint(const Request& request) const {
  return (request.num_prompt_tokens() - 1) / block_size_ * block_size_;
}

int32_t KvCacheManager::SnapshotPoint(const Request& request, int32_t begin, int32_t end) const {
  if (!takes_snapshots()) return 0;
  const int32_t prompt_point = PromptSnapshotPoint(request);
  if (prompt_point > begin && prompt_point <= end) return prompt_point;
  if (!snapshot_outputs_) return 0;
  const int32_t last = end / block_size_ * block_size_;
  return last > begin && last > prompt_point ? last : 0;
}

bool KvCacheManager::EnsureSnapshot(Request& request, int32_t* evicted, bool* taken) {
  *evicted = 0;
  *taken = false;
  if (const SnapshotId held = request.snapshot(); held != kNoSnapshot) {
    const std::vector<BlockId>& blocks = pool_.snapshot(held).blocks;
    if (!pool_.shrink_pending() ||
        std::none_of(blocks.begin(), blocks.end(),
                     [&](BlockId b) { return b >= pool_.shrink_begin(); })) {
      return true;
    }
    // A pending shrink waits for these blocks: the capture goes elsewhere and they go now (the
    // state they hold is superseded by this capture anyway).
    pool_.FreeSnapshot(held);
    request.set_snapshot(kNoSnapshot, 0);
  }
  const int32_t shortfall = snapshot_blocks_ - pool_.num_free_uncached();
  if (shortfall > 0) {
    if (shortfall > pool_.num_free_cached()) return false;
    *evicted = pool_.EvictCached(shortfall);
  }
  request.set_snapshot(pool_.AllocateSnapshot(snapshot_blocks_), 0);
  *taken = true;
  return true;
}

void KvCacheManager::BeginCapture(Request& request, int32_t tokens) {
  VAMP_CHECK(request.snapshot() != kNoSnapshot) << "request " << request.id() << " holds none";
  request.set_capture_in_flight(tokens);
}

void KvCacheManager::EndCapture(Request& request) {
  const int32_t tokens = request.capture_in_flight();
  request.set_capture_in_flight(0);
  request.set_snapshot(request.snapshot(), tokens);
  if (tokens == PromptSnapshotPoint(request)) ReleaseSnapshot(request);
}

void KvCacheManager::AbandonCapture(Request& request, bool taken) {
  request.set_capture_in_flight(0);
  if (taken) {
    pool_.FreeSnapshot(request.snapshot());
    request.set_snapshot(kNoSnapshot, 0);
  }
}

void KvCacheManager::ReleaseSnapshot(Request& request) {
  const SnapshotId id = request.snapshot();
  if (id == kNoSnapshot) return;
  const int32_t tokens = request.snapshot_tokens();
  bool attached = false;
  if (tokens > 0 && request.capture_in_flight() == 0 &&
      tokens / block_size_ <= request.num_cached_blocks()) {
    // The block cached under the hash of the state's last block: the request's own, or the one
    // that was cached first when the request's is a duplicate.
    const BlockId anchor = pool_.Lookup(request.block_hashes()[tokens / block_size_ - 1]);
    attached = anchor != kNoBlock && pool_.AttachSnapshot(id, anchor, tokens);
  }
  if (!attached) pool_.FreeSnapshot(id);
  request.set_snapshot(kNoSnapshot, 0);
  request.set_capture_in_flight(0);
}

void KvCacheManager::Free(Request& request) {
  ReleaseSnapshot(request);
  std::vector<BlockId>& table = request.mutable_block_ids();
  for (auto it = table.rbegin(); it != table.rend(); ++it) pool_.Release(*it);
  table.clear();
  request.set_num_cached_blocks(0);
}

void KvCacheManager::FreeTail(Request& request, size_t keep) {
  std::vector<BlockId>& table = request.mutable_block_ids();
  VAMP_CHECK(keep >= static_cast<size_t>(request.num_cached_blocks()))
      << "FreeTail would release blocks offered to the prefix cache";
  while (table.size() > keep) {
    pool_.Release(table.back());
    table.pop_back();
  }
}

}  // namespace vamp
