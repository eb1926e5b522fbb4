#include "controller/core/kv_block_pool.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;

BlockHash H(uint64_t v) { return BlockHash{v, ~v}; }

std::vector<BlockId> Alloc(KvBlockPool& pool, int32_t n) {
  std::vector<BlockId> out;
  pool.AllocateUncached(n, &out);
  return out;
}

TEST(KvBlockPoolTest, FreshPoolHandsOutLowIdsFirst) {
  KvBlockPool pool(6, true);
  EXPECT_THAT(Alloc(pool, 3), ElementsAre(0, 1, 2));
  EXPECT_EQ(pool.num_used(), 3);
  EXPECT_EQ(pool.num_free_uncached(), 3);
  EXPECT_DOUBLE_EQ(pool.Usage(), 0.5);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, UncachedReleaseGoesFrontCachedReleaseGoesBack) {
  KvBlockPool pool(4, true);
  auto ids = Alloc(pool, 4);
  ASSERT_TRUE(pool.Cache(ids[0], H(10)));
  ASSERT_TRUE(pool.Cache(ids[1], H(11)));
  pool.Release(ids[0]);  // cached → back
  pool.Release(ids[2]);  // uncached → front
  pool.Release(ids[1]);  // cached → back, behind ids[0]
  EXPECT_THAT(pool.free_queue().ToVector(), ElementsAre(2, 0, 1));
  EXPECT_EQ(pool.num_free_uncached(), 1);
  EXPECT_EQ(pool.num_free_cached(), 2);
  EXPECT_EQ(pool.num_cached(), 2);
  // Allocation takes only the uncached block; cached ones are not silently evicted.
  EXPECT_THAT(Alloc(pool, 1), ElementsAre(2));
  EXPECT_EQ(pool.num_free_uncached(), 0);
  EXPECT_EQ(pool.Lookup(H(10)), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, EvictionIsLeastRecentlyUsedFirstAndDropsTheEntry) {
  KvBlockPool pool(3, true);
  auto ids = Alloc(pool, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Cache(ids[i], H(100 + i)));
  pool.SetStep(1);
  pool.Release(ids[2]);
  pool.SetStep(2);
  pool.Release(ids[0]);
  pool.Release(ids[1]);
  std::vector<BlockId> order;
  pool.ForEachCachedFree([&](const KvBlock& b) {
    order.push_back(b.id);
    return true;
  });
  EXPECT_THAT(order, ElementsAre(2, 0, 1));
  EXPECT_EQ(pool.block(2).last_used_step, 1);
  EXPECT_EQ(pool.EvictCached(2), 2);
  EXPECT_EQ(pool.Lookup(H(102)), kNoBlock);
  EXPECT_EQ(pool.Lookup(H(100)), kNoBlock);
  EXPECT_EQ(pool.Lookup(H(101)), 1);
  EXPECT_FALSE(pool.block(2).cached);
  EXPECT_EQ(pool.num_free_uncached(), 2);
  EXPECT_EQ(pool.num_evicted(), 2);
  EXPECT_EQ(pool.EvictCached(5), 1);  // only one left
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, AcquireTakesACachedFreeBlockOutOfTheQueue) {
  KvBlockPool pool(2, true);
  auto ids = Alloc(pool, 1);
  ASSERT_TRUE(pool.Cache(ids[0], H(1)));
  pool.Release(ids[0]);
  EXPECT_EQ(pool.num_free_cached(), 1);
  pool.SetStep(9);
  pool.Acquire(pool.Lookup(H(1)));
  EXPECT_EQ(pool.block(0).ref_count, 1);
  EXPECT_EQ(pool.block(0).last_used_step, 9);
  EXPECT_EQ(pool.num_free_cached(), 0);
  pool.Acquire(0);  // a second user
  pool.Release(0);
  EXPECT_FALSE(pool.free_queue().Contains(0));
  pool.Release(0);
  EXPECT_TRUE(pool.free_queue().ContainsCached(0));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, DuplicateHashStaysUncached) {
  KvBlockPool pool(2, true);
  auto ids = Alloc(pool, 2);
  EXPECT_TRUE(pool.Cache(ids[0], H(5)));
  EXPECT_FALSE(pool.Cache(ids[1], H(5)));
  EXPECT_FALSE(pool.Cache(ids[0], H(6)));  // already cached under another hash
  EXPECT_EQ(pool.Lookup(H(5)), ids[0]);
  pool.Release(ids[1]);
  EXPECT_EQ(pool.num_free_uncached(), 1);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, CachingDisabledCachesNothing) {
  KvBlockPool pool(2, false);
  auto ids = Alloc(pool, 1);
  EXPECT_FALSE(pool.Cache(ids[0], H(5)));
  pool.Release(ids[0]);
  EXPECT_EQ(pool.num_free_cached(), 0);
  EXPECT_EQ(pool.Lookup(H(5)), kNoBlock);
}

TEST(KvBlockPoolTest, GrowAppendsUncachedBlocksAfterExistingOnes) {
  KvBlockPool pool(2, true);
  auto ids = Alloc(pool, 1);
  ASSERT_TRUE(pool.Grow(3).ok());
  EXPECT_EQ(pool.num_blocks(), 5);
  EXPECT_THAT(Alloc(pool, 4), ElementsAre(1, 2, 3, 4));
  EXPECT_FALSE(pool.Grow(0).ok());
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, ShrinkWithdrawsFreeTailAtOnceAndUsedTailOnRelease) {
  KvBlockPool pool(6, true);
  auto ids = Alloc(pool, 6);
  for (BlockId id : ids) ASSERT_TRUE(pool.Cache(id, H(id)));
  pool.Release(5);                        // cached free tail block
  pool.Release(1);                        // cached free, stays
  ASSERT_TRUE(pool.BeginShrink(3).ok());  // tail = 3, 4, 5
  EXPECT_TRUE(pool.shrink_pending());
  EXPECT_EQ(pool.num_withdrawn(), 1);
  EXPECT_EQ(pool.shrink_outstanding(), 2);
  EXPECT_EQ(pool.Lookup(H(5)), kNoBlock);  // withdrawn: dropped from the cache
  EXPECT_EQ(pool.Lookup(H(4)), kNoBlock);  // in use: no longer shareable
  EXPECT_EQ(pool.Lookup(H(1)), 1);
  EXPECT_EQ(pool.num_free_cached(), 1);
  EXPECT_FALSE(pool.CommitShrink().ok());
  EXPECT_FALSE(pool.Grow(1).ok());
  EXPECT_FALSE(pool.BeginShrink(1).ok());
  pool.Release(3);
  pool.Release(4);
  EXPECT_EQ(pool.shrink_outstanding(), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  ASSERT_TRUE(pool.CommitShrink().ok());
  EXPECT_EQ(pool.num_blocks(), 3);
  EXPECT_FALSE(pool.shrink_pending());
  EXPECT_EQ(pool.num_used() + pool.num_free(), 3);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, NoTailBlockIsHandedOutOrCachedWhileShrinking) {
  KvBlockPool pool(4, true);
  ASSERT_TRUE(pool.BeginShrink(2).ok());  // all free: withdrawn at once
  EXPECT_EQ(pool.num_free_uncached(), 2);
  EXPECT_THAT(Alloc(pool, 2), ElementsAre(0, 1));
  EXPECT_EQ(pool.num_free_uncached(), 0);
  ASSERT_TRUE(pool.CancelShrink().ok());
  EXPECT_EQ(pool.num_free_uncached(), 2);
  EXPECT_THAT(Alloc(pool, 2), ElementsAre(2, 3));
  ASSERT_TRUE(pool.BeginShrink(1).ok());  // block 3 in use
  EXPECT_FALSE(pool.Cache(3, H(3)));      // tail blocks are not cached
  EXPECT_TRUE(pool.Cache(2, H(2)));
  EXPECT_TRUE(pool.CheckInvariants().ok());
  ASSERT_TRUE(pool.CancelShrink().ok());
  EXPECT_TRUE(pool.Cache(3, H(3)));  // no longer in a shrinking tail
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, BeginShrinkRejectsBadSizes) {
  KvBlockPool pool(4, true);
  EXPECT_EQ(pool.BeginShrink(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.BeginShrink(4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.CommitShrink().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.CancelShrink().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KvBlockPoolDeathTest, AllocatingMoreThanUncachedFreeAborts) {
  KvBlockPool pool(2, true);
  auto ids = Alloc(pool, 1);
  ASSERT_TRUE(pool.Cache(ids[0], H(1)));
  pool.Release(ids[0]);
  std::vector<BlockId> out;
  EXPECT_DEATH(pool.AllocateUncached(2, &out), "uncached free");
  EXPECT_DEATH(pool.Release(1), "no user");
}

TEST(KvBlockPoolTest, EvictionListenerSeesEveryDroppedEntryInOrder) {
  KvBlockPool pool(8, true);
  std::vector<BlockHash> evicted;
  pool.set_eviction_listener([&](const BlockHash& h, bool) { evicted.push_back(h); });
  const std::vector<BlockId> ids = Alloc(pool, 8);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(pool.Cache(ids[i], H(i + 1)));
  for (int i = 0; i < 4; ++i) pool.Release(ids[i]);  // LRU order: 1, 2, 3, 4
  EXPECT_EQ(pool.EvictCached(2), 2);
  EXPECT_THAT(evicted, ElementsAre(H(1), H(2)));
  // A shrink drops the tail's entries: free ones at once, in-use ones too (no longer shareable).
  evicted.clear();
  ASSERT_TRUE(pool.BeginShrink(2).ok());  // ids 6 and 7, both in use
  EXPECT_THAT(evicted, ElementsAre(H(7), H(8)));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(KvBlockPoolTest, CachedFreeDepthCountsBlocksEvictedFirst) {
  KvBlockPool pool(8, true);
  const std::vector<BlockId> ids = Alloc(pool, 6);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool.Cache(ids[i], H(i + 1)));
  for (int i = 0; i < 6; ++i) pool.Release(ids[i]);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(pool.CachedFreeDepth(ids[i]), i) << i;
  pool.Acquire(ids[0]);  // leaves from the LRU end: depths stay exact
  EXPECT_EQ(pool.CachedFreeDepth(ids[0]), 0);  // not free any more
  EXPECT_EQ(pool.CachedFreeDepth(ids[1]), 0);
  EXPECT_EQ(pool.CachedFreeDepth(ids[5]), 4);
  pool.Acquire(ids[3]);  // from the middle: an interpolation, still ordered and in range
  EXPECT_LT(pool.CachedFreeDepth(ids[2]), pool.CachedFreeDepth(ids[4]));
  EXPECT_EQ(pool.CachedFreeDepth(ids[5]), 3);
}

// A snapshot of recurrent state lives in blocks of its own, attached to the cached block whose
// last token it follows, and goes with it: evicting the anchor frees both, and every count the
// arbiters read (free cached blocks, the LRU step index, depths) includes its blocks.
TEST(KvBlockPoolTest, SnapshotsAreEvictedWithTheirAnchor) {
  KvBlockPool pool(10, true);
  std::vector<BlockHash> evicted;
  pool.set_eviction_listener([&](const BlockHash& h, bool) { evicted.push_back(h); });
  const std::vector<BlockId> table = Alloc(pool, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Cache(table[i], H(i + 1)));
  const SnapshotId snapshot = pool.AllocateSnapshot(4);
  EXPECT_THAT(pool.snapshot(snapshot).blocks, ElementsAre(3, 4, 5, 6));
  EXPECT_EQ(pool.num_snapshot_blocks(), 4);
  EXPECT_EQ(pool.num_free_uncached(), 3);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  ASSERT_TRUE(pool.AttachSnapshot(snapshot, table[1], 32));
  EXPECT_EQ(pool.block(table[1]).snapshot, snapshot);
  EXPECT_EQ(pool.block(table[1]).EvictionBlocks(), 5);
  EXPECT_EQ(pool.snapshot(snapshot).num_tokens, 32);
  // Released deepest first, as KvCacheManager::Free does: LRU order 2, 1, 0.
  pool.SetStep(7);
  for (int i = 2; i >= 0; --i) pool.Release(table[i]);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  EXPECT_EQ(pool.num_free_cached(), 3 + 4);
  EXPECT_EQ(pool.CountCachedFreeUsedBefore(8), 7);
  EXPECT_EQ(pool.CachedFreeDepth(table[2]), 0);
  EXPECT_EQ(pool.CachedFreeDepth(table[1]), 1);
  EXPECT_EQ(pool.CachedFreeDepth(table[0]), 6);  // behind the anchor and its snapshot
  std::vector<int32_t> weights;
  pool.ForEachCachedFree([&](const KvBlock& b) {
    weights.push_back(b.EvictionBlocks());
    return true;
  });
  EXPECT_THAT(weights, ElementsAre(1, 5, 1));
  // Two blocks asked for: the oldest frees one, the anchor five.
  EXPECT_EQ(pool.EvictCached(2), 6);
  EXPECT_THAT(evicted, ElementsAre(H(3), H(2)));
  EXPECT_EQ(pool.num_snapshots(), 0);
  EXPECT_EQ(pool.num_snapshot_blocks(), 0);
  EXPECT_EQ(pool.num_free_uncached(), 9);
  EXPECT_EQ(pool.num_free_cached(), 1);
  EXPECT_EQ(pool.num_evicted(), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  // A prefix hit takes a free anchor out with its weight.
  const std::vector<BlockId> again = Alloc(pool, 1);
  ASSERT_TRUE(pool.Cache(again[0], H(9)));
  const SnapshotId second = pool.AllocateSnapshot(2);
  ASSERT_TRUE(pool.AttachSnapshot(second, again[0], 16));
  pool.Release(again[0]);
  EXPECT_EQ(pool.num_free_cached(), 1 + 3);
  pool.Acquire(again[0]);
  EXPECT_EQ(pool.num_free_cached(), 1);
  EXPECT_EQ(pool.num_snapshots(), 1);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

TEST(KvBlockPoolTest, OnlyACachedBlockInUseWithoutOneTakesASnapshot) {
  KvBlockPool pool(10, true);
  const std::vector<BlockId> table = Alloc(pool, 2);
  ASSERT_TRUE(pool.Cache(table[0], H(1)));
  const SnapshotId a = pool.AllocateSnapshot(2);
  EXPECT_FALSE(pool.AttachSnapshot(a, table[1], 32));  // not cached
  ASSERT_TRUE(pool.AttachSnapshot(a, table[0], 16));
  const SnapshotId b = pool.AllocateSnapshot(2);
  EXPECT_FALSE(pool.AttachSnapshot(b, table[0], 16));  // has one
  pool.Release(table[0]);
  ASSERT_TRUE(pool.Cache(table[1], H(2)));
  pool.Release(table[1]);
  EXPECT_FALSE(pool.AttachSnapshot(b, table[1], 32));  // free
  pool.FreeSnapshot(b);
  EXPECT_EQ(pool.num_snapshots(), 1);
  EXPECT_EQ(pool.num_snapshot_blocks(), 2);
  EXPECT_EQ(pool.num_free_uncached(), 6);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

// A restore's shrink takes the tail with the snapshots in it: an attached one with a block in the
// tail is dropped (its free anchor evicted with it), one whose anchor is in use just loses it, and
// a snapshot a request holds is withdrawn when freed, which the commit waits for.
TEST(KvBlockPoolTest, ShrinkTakesTheSnapshotsInTheTail) {
  KvBlockPool pool(12, true);
  const std::vector<BlockId> table = Alloc(pool, 3);  // 0, 1, 2
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Cache(table[i], H(i + 1)));
  const SnapshotId low = pool.AllocateSnapshot(3);    // 3, 4, 5
  const SnapshotId mixed = pool.AllocateSnapshot(3);  // 6, 7, 8
  const SnapshotId held = pool.AllocateSnapshot(2);   // 9, 10
  ASSERT_TRUE(pool.AttachSnapshot(low, table[0], 16));
  ASSERT_TRUE(pool.AttachSnapshot(mixed, table[1], 32));
  pool.Release(table[1]);                 // the anchor of `mixed` is free
  ASSERT_TRUE(pool.BeginShrink(5).ok());  // blocks 7..11
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  EXPECT_EQ(pool.block(table[0]).snapshot, low);  // untouched
  EXPECT_FALSE(pool.block(table[1]).cached);      // evicted with `mixed`
  EXPECT_EQ(pool.Lookup(H(2)), kNoBlock);
  EXPECT_EQ(pool.num_snapshots(), 2);       // low, held
  EXPECT_EQ(pool.shrink_outstanding(), 2);  // 9 and 10, held
  EXPECT_FALSE(pool.CommitShrink().ok());
  const SnapshotId more = pool.AllocateSnapshot(2);
  for (BlockId b : pool.snapshot(more).blocks) EXPECT_LT(b, 7);
  EXPECT_FALSE(pool.AttachSnapshot(held, table[2], 48));  // its blocks are in the tail
  pool.FreeSnapshot(held);
  EXPECT_EQ(pool.shrink_outstanding(), 0);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  ASSERT_TRUE(pool.CommitShrink().ok());
  EXPECT_EQ(pool.num_blocks(), 7);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

}  // namespace
}  // namespace vamp
