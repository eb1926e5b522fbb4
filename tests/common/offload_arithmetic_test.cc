// The offload arithmetic the engine and the simulator share, against shared/DESIGN.md's numbers.
#include "common/offload_arithmetic.h"

#include "gtest/gtest.h"

namespace vamp {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(OffloadArithmeticTest, GroupsAreTheSmallestRunOfWholePages) {
  EXPECT_EQ(ExpertsPerGroup(2 * kMiB, 3 * kMiB), 2);      // Qwen3-Next TP2: 2 x 3 MiB = 6 MiB
  EXPECT_EQ(ExpertsPerGroup(2 * kMiB, 3 * kMiB / 2), 4);  // TP4: 4 x 1.5 MiB
  EXPECT_EQ(ExpertsPerGroup(2 * kMiB, 9 * kMiB), 2);      // Qwen3-30B-A3B TP1: 2 x 9 MiB
  EXPECT_EQ(ExpertsPerGroup(2 * kMiB, 4 * kMiB), 1);      // a shard of whole pages
}

TEST(OffloadArithmeticTest, CapIsTheRatioOrTheStagingBufferInWholeGroups) {
  // floor(0.15 x 512) = 76 experts despite 0.15's rounding, 38 groups of 2.
  EXPECT_EQ(MaxOffloadGroups(512, 2, 0.15, 0, 47), 38);
  // A staging buffer of 20 experts caps it at 10 groups.
  EXPECT_EQ(MaxOffloadGroups(512, 2, 0.15, 20, 47), 10);
  // Partial groups do not count: 5 experts in groups of 2 are 2 groups.
  EXPECT_EQ(MaxOffloadGroups(128, 2, 0.25, 5, 47), 2);
  // A group larger than the cap, no eligible layer, or no ratio: nothing can be offloaded.
  EXPECT_EQ(MaxOffloadGroups(8, 16, 0.5, 0, 47), 0);
  EXPECT_EQ(MaxOffloadGroups(128, 2, 0.25, 0, 0), 0);
  EXPECT_EQ(MaxOffloadGroups(128, 2, 0.0, 0, 47), 0);
}

}  // namespace
}  // namespace vamp
