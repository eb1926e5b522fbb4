// Per-request KV bookkeeping on top of the block pool: longest cached prefix lookup, slot
// allocation for the tokens of a step, caching of blocks as they fill, and freeing.
//
// One KV cache group (every attention layer shares a block table). Not thread-safe; owned by the
// scheduler.
#ifndef VAMP_CONTROLLER_CORE_KV_CACHE_MANAGER_H_
#define VAMP_CONTROLLER_CORE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "controller/core/block_hash.h"
#include "controller/core/kv_block_pool.h"
#include "controller/core/request.h"

namespace vamp {

// The cached prefix of a request: leading blocks whose chained hashes are in the prefix cache.
struct PrefixHit {
  std::vector<BlockId> blocks;
  int32_t num_tokens = 0;  // blocks.size() * block_size
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                 BlockHasher hasher);

  int32_t block_size() const { return block_size_; }
  const BlockHasher& hasher() const { return hasher_; }
  KvBlockPool& pool() { return pool_; }
  const KvBlockPool& pool() const { return pool_; }

  // Longest run of leading full blocks of `request` that are cached. At most num_tokens - 1 tokens
  // are reported as hit, so even a fully cached prompt leaves its last token to compute (its logits
  // give the first output token). Computes the request's block hashes as far as needed. Takes no
  // reference: call AcquirePrefix before anything else can evict the blocks.
  PrefixHit FindCachedPrefix(Request& request) const;
  // Makes `hit` the start of the request's (empty) block table, adding a user to each block.
  void AcquirePrefix(Request& request, const PrefixHit& hit);

  // New blocks the request needs so that its table covers `num_total_tokens` tokens.
  int32_t NumNewBlocksNeeded(const Request& request, int32_t num_total_tokens) const;
  // Uncached free blocks missing for that: the gap handed to the memory arbiter (0 if none).
  int32_t Gap(const Request& request, int32_t num_total_tokens) const;
  // Extends the table to cover `num_total_tokens` tokens. Requires Gap(...) == 0. Returns the new
  // block ids (a view of the table's tail, valid until the table changes).
  absl::Span<const BlockId> AllocateSlots(Request& request, int32_t num_total_tokens);

  // Registers the request's full, computed blocks in the prefix cache (those not offered yet).
  void CacheComputedBlocks(Request& request);

  // Releases all of the request's blocks, last block first, so that within one request the deeper
  // blocks are evicted before the shallower ones other requests are likelier to share.
  void Free(Request& request);
  // Releases the blocks past the first `keep` of the request's table, last first: the blocks a
  // plan the agents never ran appended. None of them may be offered to the prefix cache yet
  // (keep >= num_cached_blocks()).
  void FreeTail(Request& request, size_t keep);

 private:
  int32_t block_size_;
  BlockHasher hasher_;
  KvBlockPool pool_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_KV_CACHE_MANAGER_H_
