// The offload arithmetic the engine and the simulator share, against shared/DESIGN.md's numbers,
// and the cap VAMP-r whose range is checked in one place.
#include "common/offload_arithmetic.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
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
  EXPECT_EQ(MaxOffloadGroups(512, 2, OffloadCap::Constant(0.15), 0, 47), 38);
  // A staging buffer of 20 experts caps it at 10 groups.
  EXPECT_EQ(MaxOffloadGroups(512, 2, OffloadCap::Constant(0.15), 20, 47), 10);
  // Partial groups do not count: 5 experts in groups of 2 are 2 groups.
  EXPECT_EQ(MaxOffloadGroups(128, 2, OffloadCap::Constant(0.25), 5, 47), 2);
  // A group larger than the cap, no eligible layer, or no ratio: nothing can be offloaded.
  EXPECT_EQ(MaxOffloadGroups(8, 16, OffloadCap::Constant(0.5), 0, 47), 0);
  EXPECT_EQ(MaxOffloadGroups(128, 2, OffloadCap::Constant(0.25), 0, 0), 0);
  EXPECT_EQ(MaxOffloadGroups(128, 2, OffloadCap::Constant(0.0), 0, 47), 0);
}

TEST(OffloadCapTest, AcceptsZeroToOneAndNamesTheFieldOtherwise) {
  for (double r : {0.0, 0.15, 0.95, 1.0}) {
    absl::StatusOr<OffloadCap> cap = OffloadCap::FromRatio(r, "max_offload_ratio");
    ASSERT_TRUE(cap.ok()) << r << ": " << cap.status();
    EXPECT_EQ(cap->ratio(), r);
  }
  for (double r : {-0.01, 1.01, std::nan("")}) {
    absl::StatusOr<OffloadCap> cap = OffloadCap::FromRatio(r, "memory.max_offload_ratio");
    ASSERT_FALSE(cap.ok()) << r;
    EXPECT_TRUE(absl::IsInvalidArgument(cap.status()));
    EXPECT_THAT(std::string(cap.status().message()),
                ::testing::HasSubstr("memory.max_offload_ratio (VAMP-r, the offload cap) must be "
                                     "in [0, 1]"));
  }
  EXPECT_EQ(OffloadCap().ratio(), 0) << "the default offloads nothing";
  EXPECT_EQ(OffloadCap::Constant(0.25), *OffloadCap::FromRatio(0.25, "r"));
}

TEST(OffloadCapTest, MaxExpertsIsTheFloorDespiteBinaryRounding) {
  EXPECT_EQ(OffloadCap::Constant(0.15).MaxExperts(512), 76);  // 76.8
  EXPECT_EQ(OffloadCap::Constant(0.1).MaxExperts(30), 3);     // 0.1 x 30 = 2.9999999999999996
  EXPECT_EQ(OffloadCap::Constant(1.0).MaxExperts(128), 128);
  EXPECT_EQ(OffloadCap().MaxExperts(128), 0);
}

}  // namespace
}  // namespace vamp
