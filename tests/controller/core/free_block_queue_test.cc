#include "controller/core/free_block_queue.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;

TEST(FreeBlockQueueTest, UncachedSegmentPrecedesCachedLruSegment) {
  FreeBlockQueue q(8);
  q.PushUncachedBack(0);
  q.PushUncachedBack(1);
  q.PushCached(5);
  q.PushCached(6);
  q.PushUncachedFront(2);  // a freed partial block: reused first
  q.PushUncachedBack(3);   // fresh block: after the other uncached ones, before cached ones
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 0, 1, 3, 5, 6));
  EXPECT_EQ(q.num_uncached(), 4);
  EXPECT_EQ(q.num_cached(), 2);
  EXPECT_EQ(q.OldestCached(), 5);
  EXPECT_EQ(q.NextCached(5), 6);
  EXPECT_EQ(q.NextCached(6), kNoBlock);
  EXPECT_EQ(q.PopUncached(), 2);
  EXPECT_EQ(q.PopUncached(), 0);
  EXPECT_EQ(q.size(), 4);
}

TEST(FreeBlockQueueTest, RemoveFromAnyPositionKeepsTheBoundary) {
  FreeBlockQueue q(8);
  for (BlockId id : {0, 1}) q.PushUncachedBack(id);
  for (BlockId id : {4, 5, 6}) q.PushCached(id);
  q.Remove(4);  // the oldest cached block: the boundary moves to 5
  EXPECT_EQ(q.OldestCached(), 5);
  q.Remove(6);  // the tail
  q.Remove(0);  // the head
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 5));
  EXPECT_FALSE(q.Contains(4));
  EXPECT_TRUE(q.ContainsCached(5));
  EXPECT_FALSE(q.ContainsCached(1));
  q.Remove(5);
  EXPECT_EQ(q.OldestCached(), kNoBlock);
  EXPECT_EQ(q.num_cached(), 0);
  q.PushCached(4);  // an empty cached segment restarts at the back
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 4));
  EXPECT_EQ(q.OldestCached(), 4);
}

TEST(FreeBlockQueueTest, DemoteOldestCachedMovesTheBoundaryOnly) {
  FreeBlockQueue q(4);
  q.PushCached(2);
  q.PushCached(3);
  EXPECT_EQ(q.DemoteOldestCached(), 2);
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 3));
  EXPECT_EQ(q.num_uncached(), 1);
  EXPECT_EQ(q.num_cached(), 1);
  EXPECT_EQ(q.OldestCached(), 3);
  EXPECT_EQ(q.PopUncached(), 2);
  EXPECT_EQ(q.DemoteOldestCached(), 3);
  EXPECT_EQ(q.OldestCached(), kNoBlock);
  EXPECT_EQ(q.PopUncached(), 3);
  EXPECT_EQ(q.size(), 0);
}

TEST(FreeBlockQueueTest, ResizeGrowsAndShrinksTheIdRange) {
  FreeBlockQueue q(2);
  q.PushUncachedBack(0);
  q.Resize(6);
  q.PushCached(5);
  EXPECT_EQ(q.capacity(), 6);
  q.Remove(5);
  q.Resize(3);
  EXPECT_EQ(q.capacity(), 3);
  EXPECT_THAT(q.ToVector(), ElementsAre(0));
}

TEST(FreeBlockQueueDeathTest, MisuseAborts) {
  FreeBlockQueue q(2);
  EXPECT_DEATH(q.PopUncached(), "no uncached free block");
  q.PushCached(1);
  EXPECT_DEATH(q.PushUncachedFront(1), "already queued");
  EXPECT_DEATH(q.Remove(0), "not queued");
}

}  // namespace
}  // namespace vamp
