#include "controller/core/lru_step_index.h"

#include <cstdint>
#include <list>
#include <random>
#include <utility>
#include <vector>

#include "controller/core/kv_block_pool.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

TEST(LruStepIndexTest, CountsFromTheOldestUpToTheFirstRecentBlock) {
  LruStepIndex index;
  index.Push(1, 10);
  index.Push(2, 10);
  index.Push(3, 12);
  index.Push(4, 15);
  index.Push(5, 15);
  EXPECT_EQ(index.num_runs(), 3);
  EXPECT_EQ(index.size(), 5);
  EXPECT_EQ(index.CountFromOldestBefore(10), 0);
  EXPECT_EQ(index.CountFromOldestBefore(11), 2);
  EXPECT_EQ(index.CountFromOldestBefore(13), 3);
  EXPECT_EQ(index.CountFromOldestBefore(16), 5);
  // A block from the middle leaves; then the whole oldest run: the front empty run is dropped.
  index.Remove(3);
  EXPECT_EQ(index.CountFromOldestBefore(16), 4);
  EXPECT_EQ(index.CountFromOldestBefore(13), 2);
  index.Remove(1);
  index.Remove(2);
  EXPECT_EQ(index.CountFromOldestBefore(16), 2);
  EXPECT_EQ(index.num_runs(), 1);  // runs 10 and (empty) 12 are gone
  // A block freed in the newest run's step joins it.
  index.Push(6, 15);
  EXPECT_EQ(index.num_runs(), 1);
  EXPECT_EQ(index.CountFromOldestBefore(16), 3);
}

// The index against a list of (seq, step) in LRU order, under random pushes and removals from
// anywhere, many of them making runs empty in the middle (so that compaction runs).
TEST(LruStepIndexTest, MatchesAWalkOverTheBlocks) {
  std::mt19937 rng(3);
  LruStepIndex index;
  std::list<std::pair<int64_t, int64_t>> blocks;  // oldest first
  int64_t seq = 0, step = 0;
  for (int op = 0; op < 20000; ++op) {
    if (rng() % 3 != 0 || blocks.empty()) {
      step += rng() % 3;  // several blocks per step, or none
      blocks.emplace_back(++seq, step);
      index.Push(seq, step);
    } else {
      auto it = blocks.begin();
      std::advance(it, rng() % blocks.size());
      index.Remove(it->first);
      blocks.erase(it);
    }
    if (op % 97 == 0) {
      for (int64_t before = step - 40; before <= step + 1; before += 7) {
        int64_t walked = 0;
        for (const auto& [s, t] : blocks) {
          if (t >= before) break;
          ++walked;
        }
        ASSERT_EQ(index.CountFromOldestBefore(before), walked) << "op " << op;
      }
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(blocks.size()));
    // Empty runs are compacted away: the index stays within twice the runs it needs.
    ASSERT_LE(index.num_runs(), 2 * static_cast<int64_t>(blocks.size()) + 65) << "op " << op;
  }
}

// The pool keeps the index in step with its cached free blocks through every way they come and
// go (release, prefix hit, eviction, shrink and its cancellation), and the count equals the walk
// the restore rule used to do.
TEST(LruStepIndexTest, PoolCountEqualsTheCachedFreeWalk) {
  std::mt19937 rng(11);
  KvBlockPool pool(256, /*enable_caching=*/true);
  std::vector<BlockId> held;
  uint64_t next_hash = 1;
  std::vector<BlockHash> cached_hashes;
  int64_t step = 0;
  for (int op = 0; op < 6000; ++op) {
    step += rng() % 2;
    pool.SetStep(step);
    switch (rng() % 6) {
      case 0:
      case 1: {  // allocate and cache some
        const int32_t n = std::min<int32_t>(pool.num_free_uncached(), 1 + rng() % 6);
        std::vector<BlockId> ids;
        pool.AllocateUncached(n, &ids);
        for (BlockId id : ids) {
          const BlockHash h{next_hash++, 5};
          if (rng() % 4 != 0 && pool.Cache(id, h)) cached_hashes.push_back(h);
          held.push_back(id);
        }
        break;
      }
      case 2:
      case 3:  // release some
        for (int k = 0; k < 4 && !held.empty(); ++k) {
          const size_t i = rng() % held.size();
          pool.Release(held[i]);
          held[i] = held.back();
          held.pop_back();
        }
        break;
      case 4:  // a prefix hit takes cached blocks, often free ones from the middle of the queue
        for (int k = 0; k < 3 && !cached_hashes.empty(); ++k) {
          const BlockId id = pool.Lookup(cached_hashes[rng() % cached_hashes.size()]);
          if (id == kNoBlock || pool.block(id).withdrawn) continue;
          pool.Acquire(id);
          held.push_back(id);
        }
        break;
      case 5:
        if (pool.shrink_pending()) {
          ASSERT_TRUE(pool.CancelShrink().ok());
        } else if (rng() % 2 == 0) {
          pool.EvictCached(1 + rng() % 8);
        } else {
          ASSERT_TRUE(pool.BeginShrink(1 + rng() % 32).ok());
        }
        break;
    }
    if (op % 13 == 0) {
      ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants() << " op " << op;
      for (int64_t before = step - 30; before <= step + 1; before += 3) {
        int64_t walked = 0;
        pool.ForEachCachedFree([&](const KvBlock& b) {
          if (b.last_used_step >= before) return false;
          ++walked;
          return true;
        });
        ASSERT_EQ(pool.CountCachedFreeUsedBefore(before), walked) << "op " << op;
      }
    }
  }
}

}  // namespace
}  // namespace vamp
