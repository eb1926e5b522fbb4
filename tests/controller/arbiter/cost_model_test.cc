// The cost formulas against hand-computed values (paper coefficients, t_overhead = 10 µs).
#include "controller/arbiter/cost_model.h"

#include "gtest/gtest.h"
#include "tests/controller/arbiter/arbiter_test_util.h"

namespace vamp {
namespace {

using testing::ArbiterFixture;

TEST(CostModelTest, EffectiveReuseDecaysWithAge) {
  const CostCoefficients c;  // α 0.5, τ 2000
  EXPECT_DOUBLE_EQ(EffectiveReuse(c, 0.8, 0), 0.4);
  EXPECT_DOUBLE_EQ(EffectiveReuse(c, 0.8, 2000), 0.2);  // 0.4 / (1 + 1)
  EXPECT_DOUBLE_EQ(EffectiveReuse(c, 0.8, 6000), 0.1);  // 0.4 / (1 + 3)
  EXPECT_DOUBLE_EQ(EffectiveReuse(c, 0.8, -5), 0.4);    // clock skew counts as fresh
  EXPECT_DOUBLE_EQ(EffectiveReuse(c, 0.0, 0), 0.0);
}

TEST(CostModelTest, BlockEvictionCostIsReuseTimesRecompute) {
  const CostCoefficients c;
  // 0.4 · (16 tokens · 15 µs + 10 µs) = 0.4 · 250 = 100 µs.
  EXPECT_DOUBLE_EQ(BlockEvictionCost(c, 0.8, 0, 16), 100.0);
  CostCoefficients d = c;
  d.t_overhead_micros = 0;
  d.t_prefill_micros = 30;
  EXPECT_DOUBLE_EQ(BlockEvictionCost(d, 1.0, 2000, 16), 0.25 * 480);
}

TEST(CostModelTest, EvictionCostSumsTheLeastRecentlyUsedBlocks) {
  ArbiterFixture f;
  f.AddCachedFree(1, /*used_at=*/0);     // age 6000 at step 6000: p_eff 0.1
  f.AddCachedFree(1, /*used_at=*/4000);  // age 2000: 0.2
  f.AddCachedFree(1, /*used_at=*/6000);  // age 0: 0.4
  const CostCoefficients c;
  f.pool().SetStep(6000);
  EXPECT_DOUBLE_EQ(EvictionCost(c, f.pool(), 6000, 16, 0.8, 0), 0.0);
  EXPECT_DOUBLE_EQ(EvictionCost(c, f.pool(), 6000, 16, 0.8, 1), 25.0);   // 0.1 · 250
  EXPECT_DOUBLE_EQ(EvictionCost(c, f.pool(), 6000, 16, 0.8, 2), 75.0);   // + 0.2 · 250
  EXPECT_DOUBLE_EQ(EvictionCost(c, f.pool(), 6000, 16, 0.8, 3), 175.0);  // + 0.4 · 250
  EXPECT_EQ(EvictionCost(c, f.pool(), 6000, 16, 0.8, 4), -1);            // only 3 exist
  EXPECT_TRUE(OldestCachedAreCold(f.pool(), 6000, 2, 2000));
  EXPECT_FALSE(OldestCachedAreCold(f.pool(), 6000, 3, 2000));
  EXPECT_FALSE(OldestCachedAreCold(f.pool(), 6000, 4, 0));
}

// A cached block anchoring a recurrent-state snapshot frees the snapshot's blocks too: pricing a
// gap walks fewer blocks (each still priced as one block's recompute).
TEST(CostModelTest, EvictionCountsTheSnapshotsBlocksFreeWithTheirAnchor) {
  ArbiterFixture f;
  KvBlockPool& pool = f.pool();
  pool.SetStep(0);
  std::vector<BlockId> anchor;
  pool.AllocateUncached(1, &anchor);
  ASSERT_TRUE(pool.Cache(anchor[0], BlockHash{1000, 7}));
  ASSERT_TRUE(pool.AttachSnapshot(pool.AllocateSnapshot(3), anchor[0], 16));
  pool.Release(anchor[0]);                // age 6000: p_eff 0.1, frees 4 blocks
  f.AddCachedFree(1, /*used_at=*/4000);  // age 2000: 0.2
  const CostCoefficients c;
  pool.SetStep(6000);
  EXPECT_EQ(pool.num_free_cached(), 5);
  EXPECT_DOUBLE_EQ(EvictionCost(c, pool, 6000, 16, 0.8, 1), 25.0);
  EXPECT_DOUBLE_EQ(EvictionCost(c, pool, 6000, 16, 0.8, 4), 25.0);  // the anchor covers 4
  EXPECT_DOUBLE_EQ(EvictionCost(c, pool, 6000, 16, 0.8, 5), 75.0);
  EXPECT_EQ(EvictionCost(c, pool, 6000, 16, 0.8, 6), -1);
  EXPECT_TRUE(OldestCachedAreCold(pool, 6000, 4, 6000));
  EXPECT_FALSE(OldestCachedAreCold(pool, 6000, 5, 6000));
}

TEST(CostModelTest, OffloadCostCountsShardEquivalentsCappedAtE) {
  const CostCoefficients c;  // c_eff 12.3 µs
  // 4 groups × 2 shards × 12.3 µs × 64 steps = 6,297.6 µs.
  EXPECT_NEAR(OffloadCost(c, 4, 2, 512, 64), 6297.6, 1e-9);
  EXPECT_NEAR(OffloadCost(c, 4, 2, 6, 64), 6 * 12.3 * 64, 1e-9);  // min(8, E = 6)
  EXPECT_NEAR(OffloadCost(c, 4, 2, 0, 1), 8 * 12.3, 1e-9);        // E unknown: no cap
}

TEST(CostModelTest, PreemptionCostPerVictim) {
  CostCoefficients c;  // t_sched 500, t_queue 1000, t_prefill 15
  EXPECT_DOUBLE_EQ(PreemptionCost(c, 5), 500 + 1000 + 5 * 15);
  c.t_queue_micros = 2e6;
  EXPECT_DOUBLE_EQ(PreemptionCost(c, 0), 500 + 2e6);
}

TEST(CostModelTest, DecodeHorizonIsTheSmallestBudgetClamped) {
  const CostCoefficients c;
  ArbiterFixture f;
  EXPECT_EQ(DecodeHorizon(c, f.Context(1)), 64);  // nobody runs
  f.AddRunning(1, 1, 0, /*budget=*/100);
  EXPECT_EQ(DecodeHorizon(c, f.Context(1)), 64);
  f.AddRunning(2, 1, 0, /*budget=*/30);
  EXPECT_EQ(DecodeHorizon(c, f.Context(1)), 30);
  f.AddRunning(3, 1, 0, /*budget=*/0);
  EXPECT_EQ(DecodeHorizon(c, f.Context(1)), 1);
}

TEST(CostModelTest, PreemptionYieldIsThePartialBlock) {
  ArbiterFixture f;
  const Request* r = f.AddRunning(1, /*full_blocks=*/3, /*partial_tokens=*/5, 10);
  PreemptionYield y = PreemptionYieldOf(*r, f.pool(), 16);
  EXPECT_EQ(y.uncached_blocks, 1);
  EXPECT_EQ(y.partial_tokens, 5);
  const Request* aligned = f.AddRunning(2, /*full_blocks=*/2, /*partial_tokens=*/0, 10);
  y = PreemptionYieldOf(*aligned, f.pool(), 16);
  EXPECT_EQ(y.uncached_blocks, 0);
  EXPECT_EQ(y.partial_tokens, 0);
}

}  // namespace
}  // namespace vamp
