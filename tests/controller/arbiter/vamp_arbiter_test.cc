// VampArbiter's decisions on hand-built states: the canonical cases of the cost model, the
// learned inputs (hit-rate window, t_queue, self-calibration), restore with hysteresis, and the
// configuration surface.
#include "controller/arbiter/vamp_arbiter.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/arbiter/arbiter_test_util.h"

namespace vamp {
namespace {

using testing::ArbiterFixture;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int32_t kBlocksPerGroup = 100;

class VampArbiterTest : public ::testing::Test, public ArbiterFixture {
 protected:
  ArbiterPlan Decide(int32_t gap, const Request* requester, bool running, OffloadState e,
                     int64_t step = 10) {
    return arbiter_.Decide(Context(step, e), Gap(gap, requester, running));
  }
  VampArbiter arbiter_{testing::PaperArbiterConfig()};
};

TEST(VampArbiterReconfigureTest, ValidatesAndReplacesTheConfiguration) {
  VampArbiter arbiter{testing::PaperArbiterConfig()};
  VampArbiterConfig bad;
  bad.costs.alpha = -1;
  absl::Status s = arbiter.Reconfigure(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("alpha"));
  EXPECT_DOUBLE_EQ(arbiter.config().costs.alpha, 0.5);  // unchanged
  VampArbiterConfig good = testing::PaperArbiterConfig();
  good.costs.c_eff_micros = 2.5;
  good.offload_step_groups = 2;
  ASSERT_TRUE(arbiter.Reconfigure(good).ok());
  EXPECT_DOUBLE_EQ(arbiter.config().costs.c_eff_micros, 2.5);
  EXPECT_EQ(arbiter.config().offload_step_groups, 2);
}

TEST_F(VampArbiterTest, HighReuseOffloads) {
  AddCachedFree(500, /*used_at=*/10);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  const ArbiterPlan plan = Decide(200, r, true, OffloadStateOf(40, kBlocksPerGroup));
  // C_c = 200 blocks · 0.45 · 250 µs = 22.5 ms; C_e = 4 groups (one step) · 2 · 12.3 · 64 = 6.3 ms.
  EXPECT_EQ(plan.choice, "offload");
  EXPECT_EQ(plan.offload_groups, 4);
  EXPECT_EQ(plan.evict_blocks, 0);
  EXPECT_THAT(plan.preempt, IsEmpty());
  EXPECT_NEAR(plan.costs.evict_micros, 22500, 1e-6);
  EXPECT_NEAR(plan.costs.offload_micros, 6297.6, 1e-6);
  EXPECT_EQ(plan.costs.combined_micros, -1);  // 200 < one step of 4 groups: nothing to combine
  EXPECT_EQ(plan.costs.preempt_micros, -1);   // nobody else runs
  EXPECT_DOUBLE_EQ(plan.inputs.hit_rate, 0.9);
  EXPECT_EQ(plan.inputs.horizon_steps, 64);
  EXPECT_EQ(plan.inputs.free_cached_blocks, 500);
  EXPECT_EQ(plan.inputs.remaining_groups, 40);
}

TEST_F(VampArbiterTest, NoReuseEvicts) {
  AddCachedFree(500, 10);
  SetHitRate(0.0);
  Request* r = AddRunning(1, 4, 3, 200);
  const ArbiterPlan plan = Decide(200, r, true, OffloadStateOf(40, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_EQ(plan.evict_blocks, 200);
  EXPECT_EQ(plan.offload_groups, 0);
  EXPECT_DOUBLE_EQ(plan.costs.evict_micros, 0);
}

TEST_F(VampArbiterTest, OldBlocksAreCheapToEvictEvenWithReuse) {
  AddCachedFree(500, /*used_at=*/0);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  // Age 200,000 steps: p_eff = 0.45 / 101, so 200 blocks cost ≈ 111 µs < C_e.
  const ArbiterPlan plan = Decide(200, r, true, OffloadStateOf(40, kBlocksPerGroup), 200000);
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_NEAR(plan.costs.evict_micros, 200 * 0.45 / 101 * 250, 1e-6);
}

TEST_F(VampArbiterTest, OffloadLimitReachedEvicts) {
  AddCachedFree(500, 10);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  AddRunning(2, 4, 3, 200);  // one victim with one partial block: cannot cover 200 blocks
  const ArbiterPlan plan = Decide(200, r, true, OffloadStateOf(0, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_EQ(plan.evict_blocks, 200);
  EXPECT_EQ(plan.costs.offload_micros, -1);
  EXPECT_EQ(plan.costs.combined_micros, -1);
  EXPECT_EQ(plan.costs.preempt_micros, -1);
}

TEST_F(VampArbiterTest, OffloadLimitReachedAndNothingCachedPreempts) {
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  Request* victim = AddRunning(2, 4, 5, 200);
  const ArbiterPlan plan = Decide(1, r, true, OffloadStateOf(0, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "preempt");
  EXPECT_THAT(plan.preempt, ElementsAre(victim->id()));
  EXPECT_DOUBLE_EQ(plan.costs.preempt_micros, 500 + 1000 + 5 * 15);
  EXPECT_EQ(plan.inputs.victims, 1);
}

TEST_F(VampArbiterTest, LimitBindingOffloadsTheRestAndEvicts) {
  AddCachedFree(500, 10);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  // One group (100 blocks) left, gap 150: C_b = C_e(1 group) + C_c(50) = 1574.4 + 5625.
  const ArbiterPlan plan = Decide(150, r, true, OffloadStateOf(1, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "offload+evict");
  EXPECT_EQ(plan.offload_groups, 1);
  EXPECT_EQ(plan.evict_blocks, 50);
  EXPECT_NEAR(plan.costs.combined_micros, 2 * 12.3 * 64 + 50 * 112.5, 1e-6);
  EXPECT_NEAR(plan.costs.evict_micros, 150 * 112.5, 1e-6);
  EXPECT_EQ(plan.costs.offload_micros, -1);  // one group cannot cover 150 blocks
}

TEST_F(VampArbiterTest, LargeGapCombinesWholeStepsWithEviction) {
  AddCachedFree(500, 10);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  // Gap 450: offload covers it with 2 steps (8 groups, 16 shards): 12,595.2 µs; combined takes one
  // step (400 blocks) and evicts 50: 6,297.6 + 5,625 = 11,922.6 µs.
  const ArbiterPlan plan = Decide(450, r, true, OffloadStateOf(40, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "offload+evict");
  EXPECT_EQ(plan.offload_groups, 4);
  EXPECT_EQ(plan.evict_blocks, 50);
  EXPECT_NEAR(plan.costs.offload_micros, 16 * 12.3 * 64, 1e-6);
  EXPECT_NEAR(plan.costs.combined_micros, 6297.6 + 5625, 1e-6);
}

TEST_F(VampArbiterTest, TinyGapPreemptsOnlyWhenCheapest) {
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  Request* victim = AddRunning(2, 4, 5, 200);
  // Gap of one block, no cached block: C_p = 1,575 µs < C_e = 6,297.6 µs.
  ArbiterPlan plan = Decide(1, r, true, OffloadStateOf(40, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "preempt");
  EXPECT_THAT(plan.preempt, ElementsAre(victim->id()));
  // One young cached block: C_c = 112.5 µs beats preemption.
  AddCachedFree(1, 10);
  plan = Decide(1, r, true, OffloadStateOf(40, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_NEAR(plan.costs.evict_micros, 112.5, 1e-9);
  EXPECT_NEAR(plan.costs.preempt_micros, 1575, 1e-9);
}

TEST_F(VampArbiterTest, CheapOffloadBeatsPreemption) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.costs.c_eff_micros = 1;  // C_e = 8 · 1 · 64 = 512 µs < C_p = 1,575 µs
  VampArbiter arbiter(config);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  AddRunning(2, 4, 5, 200);
  const ArbiterPlan plan =
      arbiter.Decide(Context(10, OffloadStateOf(40, kBlocksPerGroup)), Gap(1, r, true));
  EXPECT_EQ(plan.choice, "offload");
  EXPECT_NEAR(plan.costs.offload_micros, 512, 1e-9);
}

TEST_F(VampArbiterTest, ObservedQueueDelayMakesPreemptionExpensive) {
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  AddRunning(2, 4, 5, 200);
  // Two resumes after 2 s each on average: t_queue becomes 2 s.
  counters().num_resumed = 2;
  counters().total_resume_delay_micros = 4'000'000;
  const ArbiterPlan plan = Decide(1, r, true, OffloadStateOf(40, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "offload");
  EXPECT_DOUBLE_EQ(plan.inputs.t_queue_micros, 2e6);
  EXPECT_DOUBLE_EQ(plan.costs.preempt_micros, 500 + 2e6 + 75);
  // A later, faster resume moves the estimate halfway (weight 0.5).
  counters().num_resumed = 3;
  counters().total_resume_delay_micros = 4'000'000 + 1'000'000;
  EXPECT_DOUBLE_EQ(Decide(1, r, true, OffloadStateOf(40, kBlocksPerGroup)).inputs.t_queue_micros,
                   1.5e6);
}

TEST_F(VampArbiterTest, WaitingRequesterNeverPreempts) {
  SetHitRate(0.9);
  AddRunning(1, 4, 5, 200);
  AddRunning(2, 4, 5, 200);
  const ArbiterPlan plan = Decide(1, nullptr, false, OffloadStateOf(0, kBlocksPerGroup));
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.choice, "wait");
  EXPECT_EQ(plan.costs.preempt_micros, -1);
}

TEST_F(VampArbiterTest, NothingFeasibleFallsBackToStatic) {
  SetHitRate(0.9);
  AddRunning(1, 4, 0, 200);                    // block-aligned: frees nothing uncached
  Request* newest = AddRunning(2, 4, 0, 200);  // the requester, newest
  const ArbiterPlan plan = Decide(3, newest, true, OffloadStateOf(0, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "fallback:preempt");
  EXPECT_THAT(plan.preempt, ElementsAre(newest->id()));
}

TEST_F(VampArbiterTest, NothingFeasibleOffloadsWhatIsLeft) {
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 0, 200);
  AddCachedFree(20, 10);
  // 2 groups (200 blocks) + 20 cached < gap 300.
  const ArbiterPlan plan = Decide(300, r, true, OffloadStateOf(2, kBlocksPerGroup));
  EXPECT_EQ(plan.choice, "fallback:offload");
  EXPECT_EQ(plan.offload_groups, 2);
  EXPECT_EQ(plan.evict_blocks, 20);
}

TEST_F(VampArbiterTest, HitRateFollowsTheRecentWindow) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.hit_rate_window_requests = 10;
  VampArbiter arbiter(config);
  Request* r = AddRunning(1, 4, 3, 200);
  AddCachedFree(10, 10);
  // 10 admissions with no hits, then 10 with 90 % hits: the window sees only the latter.
  counters().prefix_cache = {10, 10000, 0};
  arbiter.OnStepBoundary(Context(5));
  EXPECT_DOUBLE_EQ(arbiter.live().hit_rate, 0.0);
  counters().prefix_cache = {20, 20000, 9000};
  const ArbiterPlan plan = arbiter.Decide(Context(10), Gap(1, r, true));
  EXPECT_DOUBLE_EQ(plan.inputs.hit_rate, 0.9);
  // Cumulative (window 0) would say 45 %.
  config.hit_rate_window_requests = 0;
  VampArbiter cumulative(config);
  counters().prefix_cache = {10, 10000, 0};
  cumulative.OnStepBoundary(Context(5));
  counters().prefix_cache = {20, 20000, 9000};
  EXPECT_DOUBLE_EQ(cumulative.Decide(Context(10), Gap(1, r, true)).inputs.hit_rate, 0.45);
}

TEST_F(VampArbiterTest, SelfCalibrationLearnsFromStepTimes) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.self_calibration.enabled = true;
  config.self_calibration.min_samples = 4;
  config.self_calibration.ewma_weight = 0.5;
  VampArbiter arbiter(config);
  for (int i = 0; i < 3; ++i) {
    // Prefill step: 4,096 tokens in 122,880 µs, 2,048 of them waiting on staging → 30 µs/token.
    arbiter.ObserveStep({122880 + 2048, 2048, 4000, 96, 8});
    // Decode step: 8 offloaded shards, 4,000 µs exposed → 500 µs per shard and step.
    arbiter.ObserveStep({10000, 4000, 0, 32, 8});
  }
  // Fewer samples than min_samples: the configured values still apply.
  EXPECT_DOUBLE_EQ(arbiter.live().t_prefill_micros, 15);
  EXPECT_DOUBLE_EQ(arbiter.live().c_eff_micros, 12.3);
  arbiter.ObserveStep({122880 + 2048, 2048, 4000, 96, 8});
  arbiter.ObserveStep({10000, 4000, 0, 32, 8});
  EXPECT_DOUBLE_EQ(arbiter.live().t_prefill_micros, 30);
  EXPECT_DOUBLE_EQ(arbiter.live().c_eff_micros, 500);
  // A fully resident decode step says nothing about c_eff.
  arbiter.ObserveStep({9000, 0, 0, 32, 0});
  EXPECT_EQ(arbiter.live().c_eff_samples, 4);
  // The learned values price the plans.
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  const ArbiterPlan plan =
      arbiter.Decide(Context(10, OffloadStateOf(40, kBlocksPerGroup)), Gap(1, r, true));
  EXPECT_NEAR(plan.costs.offload_micros, 8 * 500 * 64, 1e-6);
  EXPECT_DOUBLE_EQ(plan.inputs.t_prefill_micros, 30);
  // Disabled: observations are ignored.
  VampArbiter off{testing::PaperArbiterConfig()};
  off.ObserveStep({10000, 4000, 0, 32, 8});
  EXPECT_EQ(off.live().c_eff_samples, 0);
}

TEST_F(VampArbiterTest, RestoreWaitsForQuietAndIdleCapacity) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.restore.enabled = true;
  config.restore.quiet_steps = 100;
  config.restore.cold_age_steps = 50;
  config.restore.headroom = 1.0;
  config.restore.check_interval_steps = 10;
  VampArbiter arbiter(config);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  // A gap at step 10 (covered by an offload); 8 groups are in the pool by then.
  OffloadState e = OffloadStateOf(32, kBlocksPerGroup, 2, 512, /*offloaded=*/8);
  arbiter.Decide(Context(10, e), Gap(1, r, true));
  // 4,096-block pool: 4,096 - 5 (request) uncached free ≥ 2 × 400 → restore once quiet.
  EXPECT_EQ(arbiter.OnStepBoundary(Context(50, e)), 0);  // not quiet yet
  EXPECT_EQ(arbiter.OnStepBoundary(Context(110, e)), 4);
  // Not again right away, nor while the restore is pending.
  EXPECT_EQ(arbiter.OnStepBoundary(Context(111, e)), 0);
  OffloadState pending = e;
  pending.restore_pending = true;
  EXPECT_EQ(arbiter.OnStepBoundary(Context(300, pending)), 0);
  EXPECT_EQ(arbiter.OnStepBoundary(Context(300, e)), 4);
  // Nothing offloaded: nothing to restore.
  EXPECT_EQ(arbiter.OnStepBoundary(Context(1000, OffloadStateOf(40, kBlocksPerGroup))), 0);
}

TEST_F(VampArbiterTest, RestoreNeedsColdBlocksWhenThePoolIsFull) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.restore.enabled = true;
  config.restore.quiet_steps = 100;
  config.restore.cold_age_steps = 1000;
  config.restore.check_interval_steps = 10;
  ArbiterFixture small(1000);
  VampArbiter arbiter(config);
  small.SetHitRate(0.9);
  small.AddCachedFree(500, /*used_at=*/0);
  small.AddCachedFree(500, /*used_at=*/900);
  const OffloadState e = OffloadStateOf(30, 50, 2, 512, /*offloaded=*/4);  // a restore takes 200
  // At step 1000 only the first 500 are cold (age 1000) — more than 2 × 200: restore.
  EXPECT_EQ(arbiter.OnStepBoundary(small.Context(1000, e)), 4);
  VampArbiter young(config);
  // At step 995 nothing is cold: no restore, and the next check waits check_interval_steps even
  // though the oldest blocks turn cold at step 1000.
  EXPECT_EQ(young.OnStepBoundary(small.Context(995, e)), 0);
  EXPECT_EQ(young.OnStepBoundary(small.Context(1001, e)), 0);
  EXPECT_EQ(young.OnStepBoundary(small.Context(1005, e)), 4);
}

TEST_F(VampArbiterTest, RestoreIsPricedAgainstTheWarmTail) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.restore.enabled = true;
  config.restore.quiet_steps = 10;
  config.restore.check_interval_steps = 1;
  config.restore.cold_age_steps = 1000;
  config.restore.headroom = 0;
  config.restore.step_groups = 1;
  config.restore.benefit_horizon_steps = 100;
  ArbiterFixture small(1000);
  small.SetHitRate(0.9);
  // Blocks 0..199: cold cached (idle capacity). Blocks 200..999: a running request, whose last 100
  // blocks are the tail a one-group restore (100 blocks) takes.
  small.AddCachedFree(200, /*used_at=*/0);
  small.AddRunning(1, /*full_blocks=*/799, /*partial_tokens=*/1, 200);
  const OffloadState e = OffloadStateOf(0, 100, 2, 512, /*offloaded=*/1);
  // Cost: the request loses its blocks from the first tail block on, 100 blocks at age 0:
  // 100 · 0.45 · 250 µs = 11.25 ms. Saving: 1 group · 2 shards · 12.3 µs · 100 steps = 2.46 ms.
  VampArbiter cheap_staging(config);
  EXPECT_EQ(cheap_staging.OnStepBoundary(small.Context(5000, e)), 0);
  // With staging priced at 100 µs per shard and step the saving is 20 ms: restore.
  config.costs.c_eff_micros = 100;
  VampArbiter dear_staging(config);
  EXPECT_EQ(dear_staging.OnStepBoundary(small.Context(5000, e)), 1);
}

TEST_F(VampArbiterTest, WithRestoreColdBlocksAreEvictedBeforeOffloading) {
  AddCachedFree(500, /*used_at=*/0);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  // Age 3,000 steps: p_eff = 0.18, 200 blocks cost 9 ms > C_e 6.3 ms — the paper's rule offloads.
  EXPECT_EQ(Decide(200, r, true, OffloadStateOf(40, kBlocksPerGroup), 3000).choice, "offload");
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.restore.enabled = true;
  config.restore.cold_age_steps = 2000;
  VampArbiter arbiter(config);
  const ArbiterPlan plan =
      arbiter.Decide(Context(3000, OffloadStateOf(40, kBlocksPerGroup)), Gap(200, r, true));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_GT(plan.costs.evict_micros, plan.costs.offload_micros);  // logged as they were
}

TEST_F(VampArbiterTest, PressureCancelsAPendingRestoreButColdGapsDoNot) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.restore.enabled = true;
  config.restore.cold_age_steps = 1000;
  VampArbiter arbiter(config);
  AddCachedFree(100, /*used_at=*/0);
  AddCachedFree(100, /*used_at=*/1900);
  SetHitRate(0.9);
  Request* r = AddRunning(1, 4, 3, 200);
  OffloadState pending = OffloadStateOf(0, kBlocksPerGroup, 2, 512, /*offloaded=*/8);
  pending.available = false;
  pending.restore_pending = true;
  // 50 blocks: the 100 oldest are cold (age 2000) and cover it.
  ArbiterPlan plan = arbiter.Decide(Context(2000, pending), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_FALSE(plan.cancel_restore);
  // 150 blocks reach into warm ones: pressure, so the restore is cancelled first.
  plan = arbiter.Decide(Context(2000, pending), Gap(150, r, true));
  EXPECT_EQ(plan.choice, "cancel-restore");
  EXPECT_TRUE(plan.cancel_restore);
  EXPECT_FALSE(plan.empty());
}

TEST(VampArbiterConfigTest, FieldsRoundTripAndErrorsNameTheField) {
  ConfigSchema schema;
  AddVampArbiterConfigFields(schema);
  const char* argv[] = {"x",
                        "--vamp_alpha=0.7",
                        "--vamp_c_eff_us=20",
                        "--vamp_restore",
                        "--vamp_offload_step_groups=2",
                        "--vamp_self_calibration"};
  absl::StatusOr<CommandLine> cl = ParseCommandLine(schema, 6, argv);
  ASSERT_TRUE(cl.ok()) << cl.status();
  absl::StatusOr<VampArbiterConfig> c = VampArbiterConfigFromConfig(cl->config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->costs.alpha, 0.7);
  EXPECT_DOUBLE_EQ(c->costs.c_eff_micros, 20);
  EXPECT_DOUBLE_EQ(c->costs.tau_steps, 2000);
  EXPECT_DOUBLE_EQ(c->costs.t_prefill_micros, 15);
  EXPECT_DOUBLE_EQ(c->costs.t_sched_micros, 500);
  EXPECT_DOUBLE_EQ(c->costs.t_queue_micros, 1000);
  EXPECT_EQ(c->offload_step_groups, 2);
  EXPECT_TRUE(c->restore.enabled);
  EXPECT_TRUE(c->self_calibration.enabled);

  const char* bad[] = {"x", "--vamp_horizon_min_steps=10", "--vamp_horizon_max_steps=5"};
  cl = ParseCommandLine(schema, 3, bad);
  ASSERT_TRUE(cl.ok());
  EXPECT_THAT(VampArbiterConfigFromConfig(cl->config).status().message(),
              HasSubstr("vamp_horizon_max_steps"));
  const char* range[] = {"x", "--vamp_t_queue_ewma_weight=0"};
  EXPECT_THAT(ParseCommandLine(schema, 2, range).status().message(),
              HasSubstr("vamp_t_queue_ewma_weight"));
}

TEST(VampArbiterConfigTest, CreateArbiterByName) {
  EXPECT_EQ((*CreateArbiter("static", {}))->name(), "static");
  EXPECT_EQ((*CreateArbiter("vamp", {}))->name(), "vamp");
  EXPECT_THAT(CreateArbiter("lru", {}).status().message(), HasSubstr("unknown arbiter 'lru'"));
  VampArbiterConfig bad;
  bad.offload_step_groups = 0;
  EXPECT_THAT(CreateArbiter("vamp", bad).status().message(), HasSubstr("vamp_offload_step_groups"));
}

}  // namespace
}  // namespace vamp
