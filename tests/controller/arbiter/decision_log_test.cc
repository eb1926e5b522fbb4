#include "controller/arbiter/decision_log.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

ArbiterRecord Record(int64_t step, const std::string& choice) {
  ArbiterRecord r;
  r.step = step;
  r.gap_blocks = 7;
  r.plan.choice = choice;
  if (choice == "offload") {
    r.plan.offload_groups = 4;
    r.blocks_added = 400;
  } else {
    r.plan.evict_blocks = 7;
    r.blocks_evicted = 7;
  }
  r.plan.costs.evict_micros = 22500;
  r.plan.costs.offload_micros = 6297.6;
  return r;
}

TEST(DecisionLogTest, KeepsTheNewestEntriesAndCountsAll) {
  DecisionLog log(3);
  for (int64_t step = 1; step <= 5; ++step) {
    log.Append(step * 1000, Record(step, step % 2 ? "offload" : "evict"));
  }
  const std::vector<DecisionLogEntry> recent = log.Recent(10);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].record.step, 3);
  EXPECT_EQ(recent[1].record.step, 4);
  EXPECT_EQ(recent[2].record.step, 5);
  EXPECT_EQ(recent[2].time_micros, 5000);
  ASSERT_EQ(log.Recent(2).size(), 2u);
  EXPECT_EQ(log.Recent(2)[0].record.step, 4);
  const DecisionCounts counts = log.Counts();
  EXPECT_EQ(counts.decisions, 5);
  EXPECT_EQ(counts.by_choice.at("offload"), 3);
  EXPECT_EQ(counts.by_choice.at("evict"), 2);
  EXPECT_EQ(counts.offload_groups, 12);
  EXPECT_EQ(counts.blocks_added, 1200);
  EXPECT_EQ(counts.blocks_evicted, 14);
}

TEST(DecisionLogTest, FormatShowsInputsCostsAndChoice) {
  DecisionLogEntry e{2'500'000, Record(42, "offload")};
  e.record.plan.inputs.hit_rate = 0.9;
  e.record.plan.inputs.horizon_steps = 64;
  const std::string line = DecisionLog::Format(e);
  EXPECT_THAT(line, HasSubstr("step=42"));
  EXPECT_THAT(line, HasSubstr("gap=7"));
  EXPECT_THAT(line, HasSubstr("r_hit=0.900 w=64"));
  EXPECT_THAT(line, HasSubstr("C_c=22.500ms C_e=6.298ms C_p=-ms C_b=-ms choice=offload"));
  EXPECT_THAT(line, HasSubstr("added=400"));
}

TEST(DecisionLogTest, FormatShowsBothSidesOfRestoresAndTheirPreemptions) {
  ArbiterRecord restore;
  restore.step = 7;
  restore.restore_groups = 8;
  restore.plan.choice = "restore";
  restore.plan.tax.evaluated = true;
  restore.plan.tax.groups = -8;
  restore.plan.tax.tax_micros = 21834;
  restore.plan.tax.working_set_blocks = 98519;
  restore.plan.tax.reuse_age_steps = 64;
  const std::string line = DecisionLog::Format({1'000'000, restore});
  EXPECT_THAT(line, HasSubstr("step=7 restore groups=8 tax[-8 groups]=21.834ms"));
  EXPECT_THAT(line, HasSubstr("working_set=98519 blocks reuse_age=64 steps"));
  // The TTFT weight the value carried, with the evidence it was chosen on.
  restore.plan.tax.ttft_weight = 16;
  restore.plan.tax.mean_queue_micros = 1'260'000;
  restore.plan.tax.compute_bound_share = 0.125;
  restore.plan.tax.routed_h2d_bytes_per_s = 48.5e9;
  restore.plan.tax.tpot_overhead = 0.375;
  EXPECT_THAT(DecisionLog::Format({1'000'000, restore}),
              HasSubstr("routed_h2d=48.5GB/s weight=16 tpot_overhead=0.375 queue=1.26s "
                        "compute_share=0.12"));

  ArbiterRecord preempt;
  preempt.step = 8;
  preempt.for_restore = true;
  preempt.requester = 11;
  preempt.requests_preempted = 2;
  preempt.plan.choice = "restore-preempt";
  preempt.plan.tax.evaluated = true;
  preempt.plan.tax.groups = -8;
  preempt.plan.tax.tax_micros = 7023;
  preempt.plan.tax.value_micros = 795;
  const std::string p = DecisionLog::Format({1'000'000, preempt});
  EXPECT_THAT(p, HasSubstr("step=8 restore-preempt preempted=2 first=11 tax[-8 groups]=7.023ms "
                           "value=0.795ms"));
  EXPECT_THAT(p, ::testing::Not(HasSubstr("gap=")));
}

TEST(DecisionLogTest, ConcurrentReadersSeeConsistentCounts) {
  DecisionLog log(64);
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) log.Append(i, Record(i, "evict"));
  });
  for (int i = 0; i < 200; ++i) {
    const DecisionCounts c = log.Counts();
    EXPECT_EQ(c.blocks_evicted, 7 * c.decisions);
    EXPECT_LE(log.Recent(64).size(), 64u);
  }
  writer.join();
  EXPECT_EQ(log.Counts().decisions, 2000);
}

}  // namespace
}  // namespace vamp
