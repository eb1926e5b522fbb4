// The tax model (cost model "tax"): the offload tax from step timings, and the decision rule on
// hand-computed cases: value against tax at a gap, preemption against the tax over the hold, and
// restore when the tax outweighs what the offloaded share serves.
#include <cmath>
#include <memory>

#include "controller/arbiter/offload_tax.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/arbiter/arbiter_test_util.h"

namespace vamp {
namespace {

using testing::ArbiterFixture;

// A tax at 1 GB/s (1 MB = 1,000 µs; routed copies at `routed_h2d_bytes_per_s`), half of each
// step's compute hiding copies, a fixed bandwidth, a window of 1,000 µs in 10 slots, and groups
// of 1 MB up to 4.
OffloadTax FixedTax(double routed_h2d_bytes_per_s = 1e9) {
  OffloadTaxOptions o;
  o.h2d_bytes_per_s = 1e9;
  o.routed_h2d_bytes_per_s = routed_h2d_bytes_per_s;
  o.overlap_fraction = 0.5;
  o.learn_bandwidth = false;
  o.window_micros = 1000;
  o.window_slots = 10;
  OffloadTax tax(o);
  tax.SetGeometry(/*staged_bytes_per_group=*/1'000'000, /*max_groups=*/4);
  return tax;
}

TEST(OffloadTaxTest, ExposedCopyTimePerGroupCount) {
  OffloadTax tax = FixedTax();
  for (int64_t s = 1; s <= 100; ++s) tax.ObserveStep({s, 1000, 0, 0});
  // Each step: max(0, 1000·g − 0.5·1000).
  EXPECT_DOUBLE_EQ(tax.StepMicros(1, 1000), 500);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(100, 0), 0);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(100, 1), 100 * 500);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(100, 3), 100 * 2500);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(100, 9), 100 * 3500);  // clamped to the cap
  EXPECT_EQ(tax.StepsInWindow(100), 100);
  EXPECT_EQ(tax.StepsInWindow(5000), 0);
}

// The window's compute is each step's time less its exposed staging (the steps as they would
// have run with nothing offloaded), the denominator of the TPOT overhead.
TEST(OffloadTaxTest, ComputeIsStepTimeLessExposedStaging) {
  OffloadTax tax = FixedTax();
  tax.ObserveStep({1, 1000, 0, 0});
  tax.ObserveStep({2, 1500, 600, 1'000'000});
  EXPECT_DOUBLE_EQ(tax.ComputeMicros(2), 1000 + 900);
  EXPECT_DOUBLE_EQ(tax.MeanStepMicros(2), 1250);
}

TEST(OffloadTaxTest, StepsThatCopyPartOfEachGroupPayThatShare) {
  OffloadTax tax = FixedTax();
  // An engine that copies only routed experts: these steps copy a quarter of each group.
  for (int64_t s = 1; s <= 10; ++s) tax.ObserveStep({s, 1000, 0, 0, 0.25});
  EXPECT_DOUBLE_EQ(tax.StepMicros(4, 1000, 0.25), 500);  // max(0, 0.25·4·1000 − 500)
  EXPECT_DOUBLE_EQ(tax.WindowMicros(10, 1), 0);          // 250 µs hides behind 500
  EXPECT_DOUBLE_EQ(tax.WindowMicros(10, 4), 10 * 500);
  // Out-of-range shares are clamped; NaN counts as the whole region.
  EXPECT_DOUBLE_EQ(tax.StepMicros(1, 0, 2.0), 1000);
  EXPECT_DOUBLE_EQ(tax.StepMicros(1, 0, std::nan("")), 1000);
}

TEST(OffloadTaxTest, RoutedStepsPayTheirWholeCopyAtTheRoutedBandwidth) {
  OffloadTax tax = FixedTax(/*routed_h2d_bytes_per_s=*/0.5e9);  // 1 MB = 2,000 µs
  // A routed step copies a quarter of each group after the router: nothing hides behind its
  // 1,000 µs of compute, 0.25·g·2000 µs.
  for (int64_t s = 1; s <= 10; ++s) tax.ObserveStep({s, 1000, 0, 0, 0.25, /*routed=*/true});
  EXPECT_DOUBLE_EQ(tax.StepMicros(1, 1000, 0.25, true), 500);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(10, 1), 10 * 500);
  EXPECT_DOUBLE_EQ(tax.WindowMicros(10, 4), 10 * 2000);
  // The same share copied the whole region's way would hide behind compute.
  EXPECT_DOUBLE_EQ(tax.StepMicros(1, 1000, 0.25, false), 0);
}

TEST(OffloadTaxTest, LearnsTheRoutedBandwidthFromRoutedStepsAlone) {
  OffloadTaxOptions o;
  o.h2d_bytes_per_s = 1e9;
  o.routed_h2d_bytes_per_s = 2e9;
  o.overlap_fraction = 0.5;
  o.min_samples = 2;
  OffloadTax tax(o);
  tax.SetGeometry(1'000'000, 4);
  // 1 MB copied in 4,000 µs of exposed time: 0.25 GB/s, whatever the step's compute.
  tax.ObserveStep({1, 5000, 4000, 1'000'000, 0.5, true});
  tax.ObserveStep({2, 9000, 4000, 1'000'000, 0.5, true});
  EXPECT_NEAR(tax.routed_h2d_bytes_per_s(), 0.25e9, 1);
  EXPECT_EQ(tax.routed_bandwidth_samples(), 2);
  EXPECT_EQ(tax.bandwidth_samples(), 0);
  EXPECT_DOUBLE_EQ(tax.h2d_bytes_per_s(), 1e9) << "whole-region copies keep their own estimate";
}

TEST(OffloadTaxTest, LearnsTheBandwidthFromCopyBoundSteps) {
  OffloadTaxOptions o;
  o.h2d_bytes_per_s = 1e9;
  o.overlap_fraction = 0.5;
  o.min_samples = 4;
  OffloadTax tax(o);
  tax.SetGeometry(1'000'000, 4);
  // 2 MB staged; compute 1000 µs (500 hidden) + 1500 µs exposed: 2 MB / 2000 µs = 1 GB/s... at
  // 3,500 µs exposed it is 2 MB / 4000 µs = 0.5 GB/s.
  for (int64_t s = 1; s <= 3; ++s) tax.ObserveStep({s, 4500, 3500, 2'000'000});
  EXPECT_DOUBLE_EQ(tax.h2d_bytes_per_s(), 1e9);  // not enough samples yet
  tax.ObserveStep({4, 4500, 3500, 2'000'000});
  EXPECT_NEAR(tax.h2d_bytes_per_s(), 0.5e9, 1);
  tax.ObserveStep({5, 1000, 0, 2'000'000});  // not copy-bound: no sample
  EXPECT_EQ(tax.bandwidth_samples(), 4);
}

// Tax-model arbiter on a hand-built state: groups of 100 blocks, 1 MB staged per group per step
// at 1 GB/s, 100 observed steps of 1,000 µs compute (half of it hides copies): the tax of g groups
// over the window is 100·(1000·g − 500) µs. t_prefill 15 µs/token (not learned here).
class TaxModelTest : public ::testing::Test, public ArbiterFixture {
 protected:
  static constexpr int32_t kBlocksPerGroup = 100;

  static VampArbiterConfig Config() {
    VampArbiterConfig c;
    c.cost_model = VampCostModel::kTax;
    c.tax.window_micros = 1000;  // the fixture's clock: one step per µs
    c.tax.window_slots = 10;
    c.tax.h2d_bytes_per_s = 1e9;
    c.tax.overlap_fraction = 0.5;
    c.tax.margin = 0.25;
    c.tax.ttft_weight = 1;
    c.tax.min_evidence_steps = 10;
    c.offload_step_groups = 1;
    c.self_calibration.enabled = false;
    c.restore.enabled = true;
    c.restore.min_hold_steps = 100;
    c.restore.check_interval_steps = 1;
    return c;
  }

  OffloadState Geometry(int32_t offloaded) const {
    OffloadState e = OffloadStateOf(4 - offloaded, kBlocksPerGroup, 2, 128, offloaded);
    e.staged_bytes_per_group = 1'000'000;
    return e;
  }

  // 100 steps observed with `offloaded` groups out; the tracker sees the same geometry.
  void Warm(int32_t offloaded) {
    arbiter_.OnStepBoundary(Context(1, Geometry(offloaded)));
    arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, offloaded, 4);
    for (int64_t s = 1; s <= 100; ++s) {
      StepTiming t;
      t.end_micros = s;
      t.step_micros = 1000;
      arbiter_.ObserveStep(t);
    }
  }

  VampArbiter arbiter_{Config()};
};

TEST_F(TaxModelTest, NoMeasuredReuseEvictsInsteadOfOffloading) {
  Warm(0);
  AddCachedFree(500, 10);
  SetHitRate(0.9);  // a high hit rate alone is no reason to offload
  Request* r = AddRunning(1, 4, 3, 200);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_EQ(plan.evict_blocks, 50);
  ASSERT_TRUE(plan.tax.evaluated);
  EXPECT_EQ(plan.tax.groups, 1);
  EXPECT_DOUBLE_EQ(plan.tax.tax_micros, 100 * 500);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 0);
  EXPECT_EQ(plan.tax.observed_steps, 100);
}

TEST_F(TaxModelTest, MeasuredReuseWorthMoreThanTheTaxOffloads) {
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  // 5,000 tokens a pool one group larger would have served: 75,000 µs > 1.25 × 50,000 µs. Two
  // groups would serve no more and cost 150,000 µs: one group is the best move.
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/5000);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "offload");
  EXPECT_EQ(plan.offload_groups, 1);
  EXPECT_EQ(plan.evict_blocks, 0);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 75000);
  EXPECT_DOUBLE_EQ(plan.tax.tax_micros, 50000);
}

// The comparison says which weight its value carried and on what evidence: 16 once admissions
// queued longer than the threshold (1 s) on average with no step queued for compute, else 1
// (the step, ttft_weight_ramp 0; the default ramp has its own test below).
TEST_F(TaxModelTest, ComparisonReportsTheTtftWeightAndItsEvidence) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  c.tax.ttft_weight_ramp = 0;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/100);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/500'000);
  ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  ASSERT_TRUE(plan.tax.evaluated);
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 1);
  EXPECT_DOUBLE_EQ(plan.tax.mean_queue_micros, 500'000);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 100 * 15);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/70, /*queue_micros=*/3'500'000);
  plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 16);
  EXPECT_DOUBLE_EQ(plan.tax.mean_queue_micros, 2'000'000);
  EXPECT_DOUBLE_EQ(plan.tax.compute_bound_share, 0);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 100 * 15 * 16);
}

// With ttft_weight_ramp r (default 4) the weight phases in over mean waits from threshold / r to
// threshold x r, linearly in the log of the wait: with a 1 s threshold, 1 up to 0.25 s, 16 from
// 4 s, and 1 + 15 x log(q / 0.25 s) / log(16) between (8.5 at 1 s, where the step jumps from 1 to
// 16).
TEST_F(TaxModelTest, TheTtftWeightRampsWithTheQueueInsteadOfSwitching) {
  VampArbiterConfig c = Config();
  EXPECT_DOUBLE_EQ(c.tax.ttft_weight_ramp, 4);
  c.tax.ttft_weight = 16;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(200'000), 0);
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(250'000), 0);
  EXPECT_NEAR(arbiter_.QueueShare(500'000), 0.25, 1e-12);
  EXPECT_NEAR(arbiter_.QueueShare(1'000'000), 0.5, 1e-12);
  EXPECT_NEAR(arbiter_.QueueShare(2'000'000), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(4'000'000), 1);
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(9'000'000), 1);
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/100);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/1'000'000);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  ASSERT_TRUE(plan.tax.evaluated);
  EXPECT_NEAR(plan.tax.ttft_weight, 8.5, 1e-9);
  EXPECT_NEAR(plan.tax.value_micros, 100 * 15 * 8.5, 1e-6);
  // Off (0 or 1): the step at the threshold, as before.
  c.tax.ttft_weight_ramp = 1;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(1'000'000), 0);
  EXPECT_DOUBLE_EQ(arbiter_.QueueShare(1'000'001), 1);
  // Between 0 and 1 the ramp means nothing: refused with the flag's name.
  c.tax.ttft_weight_ramp = 0.5;
  const absl::Status bad = arbiter_.Reconfigure(c);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("vamp_ttft_weight_ramp"), std::string::npos) << bad;
}

// Above ttft_max_queue (default 180 s, the window) the queue is not draining: the TTFT weight
// stops, and extra KV is valued at GPU time. The same 100 recomputed tokens as above are worth
// 1,500 µs of prefill, x16 while the mean wait is 4 s, x1 once it is 200 s.
TEST_F(TaxModelTest, TheTtftWeightStopsWhenTheQueueIsNotDraining) {
  VampArbiterConfig c = Config();
  EXPECT_DOUBLE_EQ(c.tax.ttft_max_queue_micros, 180e6);
  c.tax.ttft_weight = 16;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/100);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/4'000'000);
  ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  ASSERT_TRUE(plan.tax.evaluated);
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 16);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 100 * 15 * 16);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/70, /*queue_micros=*/396'000'000);
  plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_DOUBLE_EQ(plan.tax.mean_queue_micros, 200'000'000);
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 1);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 100 * 15);
  // 0: no bound.
  c.tax.ttft_max_queue_micros = 0;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 16);
  c.tax.ttft_max_queue_micros = -1;
  const absl::Status bad = arbiter_.Reconfigure(c);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("vamp_ttft_max_queue_s"), std::string::npos) << bad;
}

// The TTFT weight buys at most ttft_tpot_budget of TPOT. One group stalls each 1,000-µs step by
// 500 µs (overhead 0.5), two by 1,500 µs (1.5). 3,000 recomputed tokens are worth 45,000 µs of
// prefill, 720,000 µs at weight 16, against one group's 1.25 x 50,000 µs.
TEST_F(TaxModelTest, TheTtftWeightAppliesOnlyWithinTheTpotBudget) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  c.tax.ttft_weight_ramp = 0;  // the whole weight above the threshold
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/3000);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/3'000'000);
  // Within the budget for one group, not for two: one group, bought by the weight.
  c.tax.ttft_tpot_budget = 0.6;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "offload");
  EXPECT_EQ(plan.offload_groups, 1);
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 16);
  EXPECT_DOUBLE_EQ(plan.tax.tpot_overhead, 0.5);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 3000 * 15 * 16);
  // Below one group's overhead: GPU time alone, which does not pay; the cached blocks go.
  c.tax.ttft_tpot_budget = 0.4;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 1);
  EXPECT_DOUBLE_EQ(plan.tax.tpot_overhead, 0.5);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 3000 * 15);
}

// A restore is priced at the weight of the level it leaves (the same rule as growing to it, so
// the two cannot flap): groups held past the budget go back unless they pay in GPU time. 4,000
// tokens needed the second group: 60,000 µs of prefill, 960,000 µs at weight 16; giving back one
// group saves 100,000 µs of stall, both 150,000 µs.
TEST_F(TaxModelTest, RestoresGroupsHeldPastTheTpotBudgetThatPayOnlyByTheWeight) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  c.tax.ttft_tpot_budget = 2;  // two groups' overhead (1.5) within it
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(2);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 4000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/3'000'000);
  AddCachedFree(4096, 195);  // every block recently used: the working-set rule keeps all
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 0);
  // Past a budget of 1 the weight is gone: both groups go back (150,000 - 1.25 x 60,000 beats
  // one group's 100,000 - 1.25 x 60,000).
  c.tax.ttft_tpot_budget = 1;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(201, Geometry(2))), 2);
  EXPECT_DOUBLE_EQ(arbiter_.LastRestoreComparison().ttft_weight, 1);
  EXPECT_DOUBLE_EQ(arbiter_.LastRestoreComparison().tpot_overhead, 1.5);
}

// Queued for compute, growing is priced at GPU time: the weight is 1 however long admissions wait.
TEST_F(TaxModelTest, GrowingWhileComputeBoundIsPricedAtGpuTime) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, /*gap_blocks=*/50, /*recompute_tokens=*/100);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/3'000'000);
  for (int64_t t = 1; t <= 100; ++t) arbiter_.reuse_tracker()->RecordQueueState(t, true);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  ASSERT_TRUE(plan.tax.evaluated);
  EXPECT_DOUBLE_EQ(plan.tax.compute_bound_share, 1);
  EXPECT_DOUBLE_EQ(plan.tax.ttft_weight, 1);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 100 * 15);
}

// While admissions queue for their first tokens, a restore weighs the prefill it loses as
// first-token time even when the GPU is compute-bound: the admission hold already keeps new
// requests within the static pool then, and what the groups still serve (cached prefixes, running
// requests' growth) is on the queue's first-token path. 4,000 tokens needed the second group:
// 60,000 µs of prefill, 960,000 µs weighted, against 100,000 / 150,000 µs of stall for one / both
// groups.
TEST_F(TaxModelTest, RestoresWeighTheQueuesFirstTokensWhileComputeBound) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(2);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 4000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/60, /*queue_micros=*/3'000'000);
  for (int64_t t = 1; t <= 100; ++t) arbiter_.reuse_tracker()->RecordQueueState(t, true);
  AddCachedFree(4096, 195);  // every block recently used: the working-set rule keeps all
  ASSERT_FALSE(arbiter_.ConcurrencyPays(200));
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 0);
}

TEST_F(TaxModelTest, ReuseWorthLessThanTheTaxWithMarginEvicts) {
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  // 3,000 tokens: 45,000 µs < 1.25 × 50,000 µs.
  arbiter_.reuse_tracker()->RecordPreemption(50, 50, 3000);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "evict");
}

TEST_F(TaxModelTest, NoOffloadBeforeTheWindowHoldsEvidence) {
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.OnStepBoundary(Context(1, Geometry(0)));
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(1, 50, 1'000'000);
  const ArbiterPlan plan = arbiter_.Decide(Context(2, Geometry(0)), Gap(50, r, true));
  EXPECT_EQ(plan.choice, "evict");  // no step observed: nothing is known about the tax
}

TEST_F(TaxModelTest, PreemptsWhenTheTaxOverTheHoldCostsMore) {
  Warm(0);
  Request* r = AddRunning(1, 4, 3, 200);
  Request* victim = AddRunning(2, 4, 5, 200);
  // Preempting frees the victim's partial block: t_sched 500 + 5 tokens × 15 = 575 µs. Growing
  // by one group costs 1.25 × 500 µs per step over a 100-step hold: 62,500 µs.
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(1, r, true));
  EXPECT_EQ(plan.choice, "preempt");
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], victim->id());
  EXPECT_DOUBLE_EQ(plan.costs.preempt_micros, 575);
}

TEST_F(TaxModelTest, GrowsWhenAPreemptionWouldWasteMoreThanTheHoldCosts) {
  Warm(0);
  Request* r = AddRunning(1, 4, 3, 200);
  // A victim with a long computed tail: 15 tokens × 15 µs is small, but its partial block plus
  // 20,000 tokens of value that one more group would have served (recorded preemptions) make
  // growing the cheaper side: (1.25 × 500 − 300,000 / 100) × 100 < 0.
  AddRunning(2, 4, 15, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, 1, 20000);
  const ArbiterPlan plan = arbiter_.Decide(Context(100, Geometry(0)), Gap(1, r, true));
  EXPECT_EQ(plan.offload_groups, 1);
  EXPECT_EQ(plan.choice, "offload");  // the value alone already pays for it
}

TEST_F(TaxModelTest, RestoresEverythingThatServesNothing) {
  Warm(2);
  // Restoring both groups saves tax(2) = 150,000 µs (one alone: 100,000) and loses nothing
  // measured: all go back at once.
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 2);
  const TaxComparison c = arbiter_.LastRestoreComparison();
  EXPECT_EQ(c.groups, -2);
  EXPECT_DOUBLE_EQ(c.tax_micros, 150000);
  EXPECT_DOUBLE_EQ(c.value_micros, 0);
}

TEST_F(TaxModelTest, RestoresOnlyTheGroupsThatServeLessThanTheirTax) {
  Warm(2);
  // 4,000 tokens needed one group (60,000 µs of value): giving back the second group saves
  // 100,000 µs and loses nothing; giving back both saves 150,000 µs but loses 1.25 × 60,000.
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 50, 4000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  AddCachedFree(4096, 195);  // every block recently used: the working set rule keeps all
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 1);
  EXPECT_EQ(arbiter_.LastRestoreComparison().groups, -1);
}

TEST_F(TaxModelTest, KeepsTheGroupsWhileTheyServeEnough) {
  Warm(2);
  // 10,000 tokens needed the second group (recorded while none was offloaded: a gap of 150
  // blocks needs two groups): 150,000 µs of value against 100,000 µs of tax.
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 10000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  AddCachedFree(4096, 195);  // every block recently used
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 0);
}

// The working-set rule: with no hits measured the reuse age is working_set_min_age_steps (64).
// Blocks last used at step 10 are idle at step 200; blocks used at step 195 are not.
TEST_F(TaxModelTest, GivesBackMemoryNobodyUsedWhateverTheWindowValuedIt) {
  Warm(2);
  // The same evidence that keeps both groups by value (KeepsTheGroupsWhileTheyServeEnough)...
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 10000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  // ...but the pool holds only idle blocks: the working set is empty.
  AddCachedFree(1000, 10);
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 2);
  const TaxComparison c = arbiter_.LastRestoreComparison();
  EXPECT_EQ(c.working_set_blocks, 0);
  EXPECT_EQ(c.reuse_age_steps, 64);
  // The demand that needed the groups is forgotten, so it cannot grow the pool again.
  EXPECT_DOUBLE_EQ(arbiter_.reuse_tracker()->TokensBetween(200, 0, 4), 0);
}

TEST_F(TaxModelTest, GivesBackOnlyWhatTheWorkingSetLeavesWithHeadroom) {
  Warm(2);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 10000);  // keeps both groups by value
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  // 946 idle blocks, then a working set of 3,150: 1.25 × 3,150 = 3,937.5 fits 4,096 − 100 blocks
  // but not 4,096 − 200, so one group goes back.
  AddCachedFree(946, 10);
  AddCachedFree(3150, 195);
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(200, Geometry(2))), 1);
  EXPECT_EQ(arbiter_.LastRestoreComparison().working_set_blocks, 3150);
  // Evidence for the pool with one group offloaded stays; only what needed two is forgotten.
  EXPECT_DOUBLE_EQ(arbiter_.reuse_tracker()->TokensBetween(200, 1, 2), 0);
}

TEST_F(TaxModelTest, NoRestoreRightAfterAnOffload) {
  Warm(0);
  AddCachedFree(500, 10);
  Request* r = AddRunning(1, 4, 3, 200);
  arbiter_.reuse_tracker()->RecordPreemption(50, 50, 5000);
  ASSERT_EQ(arbiter_.Decide(Context(100, Geometry(0)), Gap(50, r, true)).offload_groups, 1);
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(150, Geometry(1))), 0);  // within min_hold_steps
}

// A restore of both groups is pending and waits for blocks of the withdrawn tail. The tax those
// groups cost is 150,000 µs over the window's 100 steps: 1,500 µs a step.
class RestoreHolderTest : public TaxModelTest {
 protected:
  // A decoding request of 40 full blocks (prompt 641 tokens, all computed) that may still produce
  // `budget` tokens, and a restore whose tail starts at its 21st block.
  Request* DecodingHolder(int32_t budget) {
    Request* r = AddRunning(1, 40, 0, budget);
    r->set_num_computed_tokens(r->num_prompt_tokens());
    EXPECT_TRUE(pool().BeginShrink(pool().num_blocks() - r->block_ids()[20]).ok());
    return r;
  }
  OffloadState Pending() const {
    OffloadState e = Geometry(2);
    e.available = false;
    e.restore_pending = true;
    e.restore_pending_groups = 2;
    return e;
  }
};

TEST_F(RestoreHolderTest, PreemptsAHolderWhoseRecomputeCostsLessThanTheWait) {
  Warm(2);
  Request* r = DecodingHolder(/*budget=*/100);
  const ArbiterPlan plan = arbiter_.PreemptForRestore(Context(200, Pending()));
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], r->id());
  EXPECT_EQ(plan.choice, "restore-preempt");
  // Saving 1,500 µs × 100 steps; recompute from the first withdrawn block: 641 − 20 × 16 = 321
  // tokens × 15 µs.
  EXPECT_DOUBLE_EQ(plan.tax.tax_micros, 150000);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 321 * 15);
}

// The holder check finds the first withdrawn block however deep in a long table it lies (it skips
// whole runs of blocks below the tail), and only in tables that hold one.
TEST_F(RestoreHolderTest, FindsTheFirstWithdrawnBlockDeepInALongTable) {
  Warm(2);
  Request* other = AddRunning(2, 150, 0, 100);  // ids below the tail only
  other->set_num_computed_tokens(other->num_prompt_tokens());
  Request* r = AddRunning(1, 200, 0, 100);  // prompt 3,201 tokens
  r->set_num_computed_tokens(r->num_prompt_tokens());
  ASSERT_TRUE(pool().BeginShrink(pool().num_blocks() - r->block_ids()[130]).ok());
  const ArbiterPlan plan = arbiter_.PreemptForRestore(Context(200, Pending()));
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], r->id());
  // Recompute from its 131st block: 3,201 − 130 × 16 = 1,121 tokens × 15 µs.
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 1121 * 15);
}

TEST_F(RestoreHolderTest, WaitsForAHolderAboutToFinish) {
  Warm(2);
  DecodingHolder(/*budget=*/3);  // 4,500 µs of tax left < 1.25 × 4,815 µs of recompute
  EXPECT_TRUE(arbiter_.PreemptForRestore(Context(200, Pending())).preempt.empty());
}

// The recompute weighs like a first-token prefill only while someone waits behind it. With the
// TTFT weight (16) in force — admissions queued 2 s on average, no step compute-bound — a holder
// with 20 steps left keeps 1,500 µs × 20 = 30,000 µs of tax; its recompute is 321 tokens × 15 µs
// = 4,815 µs.
TEST_F(RestoreHolderTest, RecomputeWeighsLikeAFirstTokenOnlyWhileRequestsWait) {
  VampArbiterConfig c = Config();
  c.tax.ttft_weight = 16;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(2);
  arbiter_.reuse_tracker()->RecordQueueTime(/*now_micros=*/150, /*queue_micros=*/2'000'000);
  Request* r = DecodingHolder(/*budget=*/20);
  // One request waiting: 1.25 × 16 × 4,815 = 96,300 µs > 30,000 µs, so the restore waits.
  set_num_waiting(1);
  EXPECT_TRUE(arbiter_.PreemptForRestore(Context(200, Pending())).preempt.empty());
  // Nobody waiting: GPU time against GPU time, 1.25 × 4,815 = 6,018.75 µs < 30,000 µs.
  set_num_waiting(0);
  const ArbiterPlan plan = arbiter_.PreemptForRestore(Context(221, Pending()));
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], r->id());
  EXPECT_DOUBLE_EQ(plan.tax.tax_micros, 30000);
  EXPECT_DOUBLE_EQ(plan.tax.value_micros, 321 * 15);
}

TEST_F(RestoreHolderTest, NeverPreemptsARequestStillInPrefill) {
  Warm(2);
  Request* r = DecodingHolder(/*budget=*/100);
  r->set_num_computed_tokens(r->num_prompt_tokens() - 1);  // its first token is still ahead
  EXPECT_TRUE(arbiter_.PreemptForRestore(Context(200, Pending())).preempt.empty());
}

TEST_F(RestoreHolderTest, OffWhenConfiguredOff) {
  VampArbiterConfig c = Config();
  c.restore.preempt_holders = false;
  ASSERT_TRUE(arbiter_.Reconfigure(c).ok());
  Warm(2);
  DecodingHolder(/*budget=*/100);
  EXPECT_TRUE(arbiter_.PreemptForRestore(Context(200, Pending())).preempt.empty());
}

TEST_F(RestoreHolderTest, ACancelledRestoreHoldsLikeAnOffload) {
  Warm(2);
  Request* r = AddRunning(1, 4, 3, 200);
  AddCachedFree(1000, 10);  // idle: the working-set rule would give both groups back
  // 20,000 tokens needed both groups: 300,000 µs of value against 1.25 × 150,000 of tax.
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 0, 4);
  arbiter_.reuse_tracker()->RecordPreemption(150, 150, 20000);
  arbiter_.reuse_tracker()->SetGeometry(kBlocksPerGroup, 2, 4);
  const ArbiterPlan plan = arbiter_.Decide(Context(200, Pending()), Gap(50, r, true));
  EXPECT_TRUE(plan.cancel_restore);
  EXPECT_EQ(plan.choice, "cancel-restore");
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(250, Geometry(2))), 0);  // within min_hold_steps
  EXPECT_EQ(arbiter_.OnStepBoundary(Context(301, Geometry(2))), 2);  // then the rule applies
}

TEST(TaxModelConfigTest, DefaultsAreTheTaxModelWithRestoreAndCalibration) {
  const VampArbiterConfig c;
  EXPECT_EQ(c.cost_model, VampCostModel::kTax);
  EXPECT_TRUE(c.restore.enabled);
  EXPECT_TRUE(c.self_calibration.enabled);
  EXPECT_TRUE(c.Validate().ok());
  VampArbiterConfig bad;
  bad.tax.overlap_fraction = 2;
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("vamp_staging_overlap"));
  EXPECT_EQ(c.tax.ttft_tpot_budget, 0);  // no bound (see TaxModelConfig)
  VampArbiterConfig negative;
  negative.tax.ttft_tpot_budget = -0.1;
  EXPECT_THAT(std::string(negative.Validate().message()),
              ::testing::HasSubstr("vamp_ttft_tpot_budget"));
  VampArbiter paper(testing::PaperArbiterConfig());
  EXPECT_EQ(paper.reuse_tracker(), nullptr);  // the paper model measures no reuse
}

}  // namespace
}  // namespace vamp
