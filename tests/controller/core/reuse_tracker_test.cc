// The tax model's measurements of reuse: the ghost list (bounded memory, stack distances), the
// sliding window, and the reuse tracker's per-block needs (hand-computed cases).
#include "controller/core/reuse_tracker.h"

#include <vector>

#include "controller/core/ghost_list.h"
#include "controller/core/sliding_histogram.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

BlockHash H(uint64_t v) { return BlockHash{v, ~v}; }

TEST(GhostListTest, DepthIsTheStackDistance) {
  GhostList g(10);
  g.Add(H(1));
  g.Add(H(2));
  g.Add(H(3));
  EXPECT_EQ(g.Depth(H(3)), 1);  // the latest eviction: one more block would have kept it
  EXPECT_EQ(g.Depth(H(1)), 3);
  EXPECT_EQ(g.Depth(H(9)), 0);  // never evicted
  g.Add(H(1));                  // evicted again: its older entry is replaced
  EXPECT_EQ(g.Depth(H(1)), 1);
  EXPECT_EQ(g.Depth(H(2)), 3);
  EXPECT_EQ(g.size(), 3);
}

TEST(GhostListTest, MemoryIsBounded) {
  GhostList g(100);
  for (uint64_t i = 0; i < 100000; ++i) g.Add(H(i % 150));  // re-evictions and new hashes
  EXPECT_LE(g.size(), 100);
  EXPECT_EQ(g.Depth(H(99999 % 150)), 1);
  g.set_capacity(0);
  EXPECT_EQ(g.size(), 0);
  g.Add(H(5));
  EXPECT_EQ(g.Depth(H(5)), 0);  // remembers nothing
  EXPECT_EQ(g.num_evictions(), 100001);
}

TEST(SlidingHistogramTest, SumsOnlyTheWindow) {
  SlidingHistogram h(/*window_micros=*/100, /*num_slots=*/10, /*num_buckets=*/3);
  h.Add(5, 0, 1);
  h.Add(55, 1, 2);
  h.Add(95, 2, 4);
  EXPECT_DOUBLE_EQ(h.Sum(95, 0, 2), 7);
  EXPECT_DOUBLE_EQ(h.Sum(95, 1, 1), 2);
  EXPECT_DOUBLE_EQ(h.Sum(95, 2, 0), 0);  // empty range
  // At step 105 the slot of step 5 has left the window.
  EXPECT_DOUBLE_EQ(h.Sum(105, 0, 2), 6);
  h.Add(105, 0, 10);  // reuses that slot
  EXPECT_DOUBLE_EQ(h.Sum(105, 0, 0), 10);
  EXPECT_DOUBLE_EQ(h.Sum(195, 0, 2), 10);  // only the slot of step 105 is left
  EXPECT_DOUBLE_EQ(h.Sum(200, 0, 2), 0);   // and at step 200 it has left too
  h.Resize(5);
  h.Add(205, 9, 1);  // clamped to the last bucket
  EXPECT_DOUBLE_EQ(h.Sum(205, 4, 4), 1);
}

class ReuseTrackerTest : public ::testing::Test {
 protected:
  static constexpr int32_t kBlockSize = 4;
  static constexpr int32_t kBlocksPerGroup = 2;

  ReuseTrackerTest() : tracker_(ReuseTrackerOptions{1000, 10}), pool_(16, true) {
    tracker_.SetGeometry(kBlocksPerGroup, /*offloaded_groups=*/0, /*max_groups=*/4);
  }

  // A request whose prompt is `blocks` full blocks plus one token.
  Request MakeRequest(RequestId id, int32_t blocks, int32_t first_token = 0) {
    RequestSpec spec;
    spec.id = id;
    for (int32_t i = 0; i < blocks * kBlockSize + 1; ++i) {
      spec.prompt_token_ids.push_back(first_token + i);
    }
    return Request(std::move(spec), 0, 0);
  }

  ReuseTracker tracker_;
  KvBlockPool pool_;
  BlockHasher hasher_;
};

TEST_F(ReuseTrackerTest, GhostHitsCountAtTheGroupsThatWouldHaveKeptThem) {
  Request r = MakeRequest(1, 4);
  r.EnsureBlockHashes(4, kBlockSize, hasher_);
  // Evicted oldest first: block 0 at depth 5, block 3 at depth 1 (two unrelated in between).
  tracker_.OnEvicted(r.block_hashes()[0]);
  tracker_.OnEvicted(H(100));
  tracker_.OnEvicted(r.block_hashes()[1]);
  tracker_.OnEvicted(r.block_hashes()[2]);
  tracker_.OnEvicted(r.block_hashes()[3]);
  // Depths 5, 3, 2, 1 blocks → groups ceil(d/2) = 3, 2, 1, 1; a prefix needs the running max: 3.
  Request admitted = MakeRequest(1, 4);
  tracker_.RecordAdmission(10, {}, admitted, kBlockSize, hasher_);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 2), 0);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 3), 4 * kBlockSize);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 2, 4), 4 * kBlockSize);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 4, 2), -4 * kBlockSize);
  EXPECT_DOUBLE_EQ(tracker_.GhostTokens(10), 4 * kBlockSize);
}

TEST_F(ReuseTrackerTest, WithRecurrentStateGhostHitsEndAtTheLastSnapshotAnchor) {
  // The same evictions as above, blocks 0-3 at depths 5, 3, 2, 1; only block 1 anchored a
  // snapshot of recurrent state. A hit on such a model ends at an anchor: blocks 0-1 (needs 3, 3
  // with the running max) could have been served, blocks 2-3 could not.
  Request r = MakeRequest(1, 4);
  r.EnsureBlockHashes(4, kBlockSize, hasher_);
  tracker_.set_hits_need_snapshots(true);
  tracker_.OnEvicted(r.block_hashes()[0]);
  tracker_.OnEvicted(H(100), /*anchored=*/true);
  tracker_.OnEvicted(r.block_hashes()[1], /*anchored=*/true);
  tracker_.OnEvicted(r.block_hashes()[2]);
  tracker_.OnEvicted(r.block_hashes()[3]);
  Request admitted = MakeRequest(1, 4);
  tracker_.RecordAdmission(10, {}, admitted, kBlockSize, hasher_);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 2), 0);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 4), 2 * kBlockSize);
  EXPECT_DOUBLE_EQ(tracker_.GhostTokens(10), 2 * kBlockSize);

  // No anchor along the chain: nothing a larger pool would have served.
  Request other = MakeRequest(2, 3, /*first_token=*/500);
  other.EnsureBlockHashes(3, kBlockSize, hasher_);
  for (int i = 0; i < 3; ++i) tracker_.OnEvicted(other.block_hashes()[i]);
  Request admitted_other = MakeRequest(2, 3, /*first_token=*/500);
  tracker_.RecordAdmission(20, {}, admitted_other, kBlockSize, hasher_);
  EXPECT_DOUBLE_EQ(tracker_.GhostTokens(20), 2 * kBlockSize);  // only the first admission's
}

TEST_F(ReuseTrackerTest, TheWalkStopsAtTheFirstBlockNoReachablePoolHeld) {
  Request r = MakeRequest(1, 3);
  r.EnsureBlockHashes(3, kBlockSize, hasher_);
  tracker_.OnEvicted(r.block_hashes()[0]);
  for (int i = 0; i < 20; ++i) tracker_.OnEvicted(H(1000 + i));  // block 0 now at depth 21
  tracker_.OnEvicted(r.block_hashes()[1]);
  Request admitted = MakeRequest(1, 3);
  tracker_.RecordAdmission(10, {}, admitted, kBlockSize, hasher_);
  // Block 0 needs 11 groups > the cap of 4: no prefix of this request is reachable.
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 4), 0);
  EXPECT_DOUBLE_EQ(tracker_.GhostTokens(10), 0);
}

TEST_F(ReuseTrackerTest, HitsOnFreeBlocksNeedTheOffloadedGroupsTheirDepthRequires) {
  // Two requests' blocks cached and freed: LRU depth 0 (oldest) .. 3.
  tracker_.SetGeometry(kBlocksPerGroup, /*offloaded_groups=*/3, /*max_groups=*/4);
  std::vector<BlockId> ids;
  pool_.AllocateUncached(16, &ids);  // the pool is full: no uncached free blocks
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool_.Cache(ids[i], H(i + 1)));
  for (int i = 0; i < 4; ++i) pool_.Release(ids[i]);
  PrefixHit hit;
  hit.blocks = {ids[3], ids[1]};  // depths 3 and 1
  hit.num_tokens = 2 * kBlockSize;
  const ReuseTracker::HitNeeds needs = tracker_.MeasureHit(pool_, hit, /*step=*/0);
  // Depth 3 survives a shrink of 1 group (2 blocks) but not 2: needs 3 − floor(3/2) = 2 groups;
  // depth 1 needs 3 − 0 = 3, and the running maximum keeps it there.
  ASSERT_EQ(needs.runs.size(), 2u);
  EXPECT_EQ(needs.runs[0], std::make_pair(2, 1));
  EXPECT_EQ(needs.runs[1], std::make_pair(3, 1));
  EXPECT_EQ(needs.max_need, 3);
}

TEST_F(ReuseTrackerTest, ReuseAgesOfHitBlocksGiveTheWorkingSetsAgeQuantile) {
  EXPECT_EQ(tracker_.ReuseAgeSteps(10, 0.99), 0);  // no hits yet
  tracker_.SetGeometry(kBlocksPerGroup, /*offloaded_groups=*/1, /*max_groups=*/4);
  std::vector<BlockId> ids;
  pool_.AllocateUncached(4, &ids);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool_.Cache(ids[i], H(i + 1)));
  pool_.SetStep(100);
  for (int i = 0; i < 3; ++i) pool_.Release(ids[i]);  // freed at step 100
  pool_.SetStep(190);
  pool_.Release(ids[3]);  // freed at step 190
  PrefixHit hit;
  hit.blocks = {ids[0], ids[1], ids[2], ids[3]};
  hit.num_tokens = 4 * kBlockSize;
  // At step 200: three blocks 100 steps old (log2 bucket 7: 64..127), one 10 steps (bucket 4).
  const ReuseTracker::HitNeeds needs = tracker_.MeasureHit(pool_, hit, /*step=*/200);
  ASSERT_EQ(needs.ages.size(), 2u);
  EXPECT_EQ(needs.ages[0], std::make_pair(7, 3));
  EXPECT_EQ(needs.ages[1], std::make_pair(4, 1));
  Request r = MakeRequest(1, 5);
  tracker_.RecordAdmission(10, needs, r, kBlockSize, hasher_);
  EXPECT_EQ(tracker_.ReuseAgeSteps(10, 0.25), 15);   // the young block's bucket
  EXPECT_EQ(tracker_.ReuseAgeSteps(10, 0.99), 127);  // the old ones'
}

TEST_F(ReuseTrackerTest, ForgetAboveDropsTheDemandForLargerPools) {
  tracker_.RecordPreemption(10, /*gap_blocks=*/2, /*recompute_tokens=*/100);  // needs 1 group
  tracker_.RecordPreemption(10, /*gap_blocks=*/6, /*recompute_tokens=*/300);  // needs 3 groups
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 4), 400);
  tracker_.ForgetAbove(1);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 4), 100);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 1, 4), 0);
}

TEST_F(ReuseTrackerTest, PreemptionsCountAtTheGroupsThatCoverTheGap) {
  tracker_.RecordPreemption(10, /*gap_blocks=*/3, /*recompute_tokens=*/500);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 0, 1), 0);
  EXPECT_DOUBLE_EQ(tracker_.TokensBetween(10, 1, 2), 500);  // ceil(3 / 2) = 2 groups
  EXPECT_DOUBLE_EQ(tracker_.PreemptionTokens(10), 500);
  EXPECT_DOUBLE_EQ(tracker_.PreemptionTokens(2000), 0);  // out of the window
}

TEST_F(ReuseTrackerTest, NothingIsRecordedWithoutOffloading) {
  tracker_.SetGeometry(0, 0, 0);
  tracker_.RecordPreemption(10, 3, 500);
  EXPECT_DOUBLE_EQ(tracker_.PreemptionTokens(10), 0);
}

}  // namespace
}  // namespace vamp
