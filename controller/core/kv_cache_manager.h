// Per-request KV bookkeeping on top of the block pool: longest cached prefix lookup, slot
// allocation for the tokens of a step, caching of blocks as they fill, and freeing.
//
// Models with recurrent state (Qwen3-Next's linear attention: snapshot_blocks > 0) also need the
// state at a hit's end, so the manager keeps snapshots of it (KvBlockPool) at two points of each
// request, as vLLM keeps Mamba state at block-aligned boundaries of cached prefixes but fewer of
// them (a snapshot of Qwen3-Next's state fills ~200 blocks of 16 tokens): at the prompt's last
// block boundary before its last token, where a request repeating or extending the prompt hits;
// and, with snapshot_outputs, at the last block boundary its output reaches, where the next turn
// of a conversation continues (also what a preempted request resumes from). A request holds one
// snapshot at a time, which its steps capture into: the prompt's is attached to its anchor
// block as soon as its step's output arrives, the latest one when the request ends or is
// preempted. So a request leaves at most two behind (plus one per preemption), each evicted with
// its block. A hit is granted only up to a block that anchors a snapshot, which exists only
// once the agents have run the step that captured it: the controller never asks for a hit the
// agents cannot serve.
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
  // With recurrent state: the snapshot the last block anchors, which the agents restore.
  SnapshotId snapshot = kNoSnapshot;
};

class KvCacheManager {
 public:
  // `snapshot_blocks`: 0 for a model without recurrent state, otherwise the blocks one snapshot
  // of a request's state fills (SchedulerConfig::recurrent_state_blocks).
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                 BlockHasher hasher, int32_t snapshot_blocks = 0, bool snapshot_outputs = true);

  int32_t block_size() const { return block_size_; }
  const BlockHasher& hasher() const { return hasher_; }
  KvBlockPool& pool() { return pool_; }
  const KvBlockPool& pool() const { return pool_; }

  // Longest run of leading full blocks of `request` that are cached. At most num_tokens - 1 tokens
  // are reported as hit, so even a fully cached prompt leaves its last token to compute (its logits
  // give the first output token). With recurrent state, the run ends at its deepest block that
  // anchors a snapshot (none: no hit). Computes the request's block hashes as far as needed.
  // Takes no reference: call AcquirePrefix before anything else can evict the blocks.
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

  // ---- Snapshots of recurrent state (only while takes_snapshots()) ----
  bool takes_snapshots() const { return snapshot_blocks_ > 0 && pool_.caching_enabled(); }
  // Where a step computing tokens [begin, end) of `request` captures its state: the prompt's point
  // when the range reaches it, else (snapshot_outputs) the range's last block boundary past it;
  // 0 for nowhere (or when snapshots are not taken).
  int32_t SnapshotPoint(const Request& request, int32_t begin, int32_t end) const;
  // Gives `request` a snapshot to capture into if it holds none (or holds one with blocks in a
  // shrinking tail, which it gives back): uncached free blocks, or cached ones evicted in LRU
  // order when they cover the shortfall (a snapshot is cache content: it never makes the arbiter
  // preempt or offload). Returns false (no capture this step) when neither suffices; `*evicted`
  // gets the blocks evictions freed, `*taken` whether the snapshot was taken now.
  bool EnsureSnapshot(Request& request, int32_t* evicted, bool* taken);
  // The step being planned captures the request's state after `tokens` tokens into its snapshot.
  void BeginCapture(Request& request, int32_t tokens);
  // That step's output arrived: the snapshot holds that state. At the prompt's point it is
  // attached to its block at once (or freed when that block anchors one already).
  void EndCapture(Request& request);
  // That step was refused (Scheduler::RevertStep): nothing was captured; a snapshot taken for it
  // (`taken`) is freed.
  void AbandonCapture(Request& request, bool taken);

  // Releases all of the request's blocks, last block first, so that within one request the deeper
  // blocks are evicted before the shallower ones other requests are likelier to share. Its
  // snapshot is attached to the cached block its state follows, or freed when it holds nothing
  // certain (no capture done, or one in flight) or that block cannot take it.
  void Free(Request& request);
  // Releases the blocks past the first `keep` of the request's table, last first: the blocks a
  // plan the agents never ran appended. None of them may be offered to the prefix cache yet
  // (keep >= num_cached_blocks()).
  void FreeTail(Request& request, size_t keep);

 private:
  // The prompt's snapshot point: its last block boundary before its last token.
  int32_t PromptSnapshotPoint(const Request& request) const;
  // Attaches or frees the request's snapshot (see Free).
  void ReleaseSnapshot(Request& request);

  int32_t block_size_;
  BlockHasher hasher_;
  KvBlockPool pool_;
  const int32_t snapshot_blocks_;
  const bool snapshot_outputs_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_KV_CACHE_MANAGER_H_
