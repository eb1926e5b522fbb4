// What the agent reports of a step's staging (agent/step_staging.h).
#include "agent/step_staging.h"

#include "gtest/gtest.h"

namespace vamp {
namespace {

StagingStats Routed(int64_t passes, uint64_t bytes, uint64_t region) {
  StagingStats s;
  s.passes = passes;
  s.routed_passes = passes;
  s.bytes = bytes;
  s.routed_bytes = bytes;
  s.routed_region_bytes = region;
  return s;
}

TEST(StepStagingTest, WholeRegionStepsCopyEverything) {
  const StagingStats none;
  // Routed staging off, or a step above its threshold.
  for (int64_t max_tokens : {0, 8}) {
    const StepStaging s = DescribeStepStaging(none, none, 64, max_tokens, 8, 128);
    EXPECT_FALSE(s.routed) << max_tokens;
    EXPECT_EQ(s.share, 1) << max_tokens;
  }
}

TEST(StepStagingTest, ARoutedStepReportsTheShareItCopied) {
  const StagingStats before = Routed(3, 1000, 8000);
  const StagingStats after = Routed(4, 1000 + 600, 8000 + 4800);  // 600 of 4,800 bytes
  const StepStaging s = DescribeStepStaging(before, after, 2, 16, 8, 128);
  EXPECT_TRUE(s.routed);
  EXPECT_DOUBLE_EQ(s.share, 0.125);
}

TEST(StepStagingTest, NothingOffloadedReportsTheUniformExpectation) {
  const StagingStats none;
  const StepStaging s = DescribeStepStaging(none, none, 1, 16, 8, 128);
  EXPECT_TRUE(s.routed) << "it would copy routed experts once any are offloaded";
  EXPECT_DOUBLE_EQ(s.share, 8.0 / 128);
}

TEST(StepStagingTest, AStepThatCopiedTheWholeRegionIsNotRouted) {
  // A small step that staged bytes without a routed pass (its device could not route).
  StagingStats before, after;
  after.passes = 1;
  after.bytes = 4096;
  const StepStaging s = DescribeStepStaging(before, after, 1, 16, 8, 128);
  EXPECT_FALSE(s.routed);
  EXPECT_EQ(s.share, 1);
}

}  // namespace
}  // namespace vamp
