#include "common/uniform_routing.h"

#include <cmath>

#include "gtest/gtest.h"

namespace vamp {
namespace {

TEST(UniformRoutedShareTest, OneTokenRoutesToTopKOfTheExperts) {
  EXPECT_DOUBLE_EQ(UniformRoutedShare(1, 8, 128), 8.0 / 128.0);  // Qwen3-30B-A3B at batch 1
}

TEST(UniformRoutedShareTest, GrowsWithTokensTowardsEveryExpert) {
  // E (1 - (1 - k/E)^T) distinct experts: 64 tokens of top-8 over 128 miss an expert with
  // probability (15/16)^64, about 1.6 %.
  EXPECT_NEAR(UniformRoutedShare(64, 8, 128), 1.0 - std::pow(15.0 / 16.0, 64), 1e-12);
  EXPECT_GT(UniformRoutedShare(64, 8, 128), 0.98);
  double previous = 0;
  for (int64_t tokens : {1, 2, 8, 16, 32, 64, 512}) {
    const double share = UniformRoutedShare(tokens, 8, 128);
    EXPECT_GT(share, previous) << tokens;
    EXPECT_LE(share, 1.0) << tokens;
    previous = share;
  }
}

TEST(UniformRoutedShareTest, DegenerateShapes) {
  EXPECT_EQ(UniformRoutedShare(0, 8, 128), 0);
  EXPECT_EQ(UniformRoutedShare(-3, 8, 128), 0);
  EXPECT_EQ(UniformRoutedShare(5, 0, 128), 0);
  EXPECT_EQ(UniformRoutedShare(5, 8, 0), 0);
  EXPECT_EQ(UniformRoutedShare(1, 128, 128), 1);
  EXPECT_EQ(UniformRoutedShare(1, 200, 128), 1);
}

}  // namespace
}  // namespace vamp
