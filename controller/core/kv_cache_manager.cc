#include "controller/core/kv_cache_manager.h"

#include <algorithm>

#include "common/logging.h"

namespace vamp {

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                               BlockHasher hasher)
    : block_size_(block_size), hasher_(hasher), pool_(num_blocks, enable_prefix_caching) {
  VAMP_CHECK(block_size > 0) << block_size;
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

void KvCacheManager::Free(Request& request) {
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
