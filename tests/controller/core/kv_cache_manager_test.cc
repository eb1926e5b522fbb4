#include "controller/core/kv_cache_manager.h"

#include <memory>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int32_t kBs = 4;

std::unique_ptr<Request> MakeRequest(RequestId id, std::vector<TokenId> prompt,
                                     std::string salt = "") {
  RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids = std::move(prompt);
  spec.cache_salt = std::move(salt);
  return std::make_unique<Request>(std::move(spec), 0, id);
}

std::vector<TokenId> Iota(int n, TokenId start = 0) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Runs a request's whole prompt through the manager as one step and caches its blocks.
void Prefill(KvCacheManager& kv, Request& r) {
  const PrefixHit hit = kv.FindCachedPrefix(r);
  kv.AcquirePrefix(r, hit);
  ASSERT_EQ(kv.Gap(r, r.num_tokens()), 0);
  kv.AllocateSlots(r, r.num_tokens());
  r.set_num_computed_tokens(r.num_tokens());
  kv.CacheComputedBlocks(r);
}

TEST(KvCacheManagerTest, CachesOnlyFullComputedBlocks) {
  KvCacheManager kv(16, kBs, true, BlockHasher());
  auto r = MakeRequest(1, Iota(10));
  kv.AcquirePrefix(*r, {});
  EXPECT_EQ(kv.NumNewBlocksNeeded(*r, 10), 3);
  EXPECT_THAT(kv.AllocateSlots(*r, 10), ElementsAre(0, 1, 2));
  r->set_num_computed_tokens(7);  // one full block computed, the second not yet
  kv.CacheComputedBlocks(*r);
  EXPECT_EQ(r->num_cached_blocks(), 1);
  EXPECT_EQ(kv.pool().num_cached(), 1);
  r->set_num_computed_tokens(10);
  kv.CacheComputedBlocks(*r);
  EXPECT_EQ(r->num_cached_blocks(), 2);  // the third block is partial
  EXPECT_EQ(kv.pool().block(1).hash, r->block_hashes()[1]);
  EXPECT_TRUE(kv.pool().CheckInvariants().ok());
}

TEST(KvCacheManagerTest, LongestPrefixHitLeavesTheLastTokenToCompute) {
  KvCacheManager kv(32, kBs, true, BlockHasher());
  auto a = MakeRequest(1, Iota(12));  // exactly 3 blocks
  Prefill(kv, *a);
  EXPECT_EQ(a->num_cached_blocks(), 3);
  // The same 12 tokens: a full hit would leave nothing to compute, so only 2 blocks count.
  auto same = MakeRequest(2, Iota(12));
  PrefixHit hit = kv.FindCachedPrefix(*same);
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_THAT(hit.blocks, ElementsAre(a->block_ids()[0], a->block_ids()[1]));
  // 13 tokens: all 3 cached blocks hit.
  auto longer = MakeRequest(3, Iota(13));
  EXPECT_EQ(kv.FindCachedPrefix(*longer).num_tokens, 12);
  // Diverging in the second block: only the first block hits.
  std::vector<TokenId> diverging = Iota(12);
  diverging[5] = 999;
  auto div = MakeRequest(4, diverging);
  EXPECT_THAT(kv.FindCachedPrefix(*div).blocks, ElementsAre(a->block_ids()[0]));
  // Same tokens, other salt: nothing.
  auto salted = MakeRequest(5, Iota(13), "other-tenant");
  EXPECT_THAT(kv.FindCachedPrefix(*salted).blocks, IsEmpty());
}

TEST(KvCacheManagerTest, HitBlocksAreSharedAndReferenceCounted) {
  KvCacheManager kv(32, kBs, true, BlockHasher());
  auto a = MakeRequest(1, Iota(9));
  Prefill(kv, *a);
  auto b = MakeRequest(2, Iota(9));
  Prefill(kv, *b);
  EXPECT_EQ(b->block_ids()[0], a->block_ids()[0]);
  EXPECT_EQ(b->block_ids()[1], a->block_ids()[1]);
  EXPECT_NE(b->block_ids()[2], a->block_ids()[2]);  // partial blocks are never shared
  EXPECT_EQ(kv.pool().block(a->block_ids()[0]).ref_count, 2);
  kv.Free(*a);
  EXPECT_EQ(kv.pool().block(b->block_ids()[0]).ref_count, 1);
  EXPECT_TRUE(a->block_ids().empty());
  EXPECT_TRUE(kv.pool().CheckInvariants().ok());
}

TEST(KvCacheManagerTest, FreeReleasesDeepestBlockFirstSoItIsEvictedFirst) {
  KvCacheManager kv(8, kBs, true, BlockHasher());
  auto a = MakeRequest(1, Iota(13));
  Prefill(kv, *a);
  const std::vector<BlockId> table = a->block_ids();
  kv.Free(*a);
  // The partial 4th block is uncached; the full ones wait deepest-first in eviction order.
  std::vector<BlockId> order;
  kv.pool().ForEachCachedFree([&](const KvBlock& b) {
    order.push_back(b.id);
    return true;
  });
  EXPECT_THAT(order, ElementsAre(table[2], table[1], table[0]));
  EXPECT_EQ(kv.pool().free_queue().ToVector().front(), table[3]);
}

TEST(KvCacheManagerTest, GapCountsOnlyUncachedFreeBlocks) {
  KvCacheManager kv(4, kBs, true, BlockHasher());
  auto a = MakeRequest(1, Iota(8));
  Prefill(kv, *a);
  kv.Free(*a);  // 2 cached free, 2 uncached free
  auto b = MakeRequest(2, Iota(16, 100));
  kv.AcquirePrefix(*b, {});
  EXPECT_EQ(kv.NumNewBlocksNeeded(*b, 16), 4);
  EXPECT_EQ(kv.Gap(*b, 16), 2);
  EXPECT_EQ(kv.Gap(*b, 8), 0);
  EXPECT_EQ(kv.pool().EvictCached(2), 2);
  EXPECT_EQ(kv.Gap(*b, 16), 0);
  EXPECT_EQ(kv.AllocateSlots(*b, 16).size(), 4u);
}

TEST(KvCacheManagerTest, PrefixCachingOffFindsNothing) {
  KvCacheManager kv(8, kBs, false, BlockHasher());
  auto a = MakeRequest(1, Iota(9));
  Prefill(kv, *a);
  auto b = MakeRequest(2, Iota(9));
  EXPECT_EQ(kv.FindCachedPrefix(*b).num_tokens, 0);
  EXPECT_EQ(kv.pool().num_cached(), 0);
}

}  // namespace
}  // namespace vamp
