#include "engine/kv/kv_region.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/memory/test_backends.h"

namespace vamp {
namespace {

using testing::BackendTest;
using testing::PatternBytes;

constexpr int64_t kBaselinePages = 4;
constexpr int64_t kExtraPages = 8;

class KvRegionTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto kv = ComputeKvBlockGeometry(testing::SmallTestShape(page(), 4, 8), 1, 16);
    ASSERT_TRUE(kv.ok()) << kv.status();
    geometry_ = *kv;
    ASSERT_NE(page() % geometry_.block_bytes, 0u) << "blocks should straddle pages";
    auto pool = PagePool::Create(backend_.get(), kBaselinePages + kExtraPages + 1);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    auto region = KvRegion::Create(pool_.get(), geometry_, kBaselinePages, kExtraPages);
    ASSERT_TRUE(region.ok()) << region.status();
    kv_ = std::move(*region);
  }
  void TearDown() override {
    kv_.reset();
    pool_.reset();
  }

  int64_t Floor(int64_t pages) const {
    return static_cast<int64_t>(pages * page() / geometry_.block_bytes);
  }
  // Fills blocks [first, last) with a pattern and returns it.
  std::vector<uint8_t> Fill(int64_t first, int64_t last, uint64_t seed) {
    std::vector<uint8_t> data = PatternBytes(seed, (last - first) * geometry_.block_bytes);
    EXPECT_TRUE(
        backend_->CopyHostToDevice(kv_->BlockAddress(first), data.data(), data.size()).ok());
    return data;
  }
  std::vector<uint8_t> Read(int64_t first, int64_t last) const {
    std::vector<uint8_t> out((last - first) * geometry_.block_bytes);
    EXPECT_TRUE(backend_->CopyDeviceToHost(out.data(), kv_->BlockAddress(first), out.size()).ok());
    return out;
  }

  KvBlockGeometry geometry_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<KvRegion> kv_;
};

TEST_P(KvRegionTest, BlocksAreWholeAndTheRemainderWaitsForTheNextPage) {
  EXPECT_EQ(kv_->mapped_pages(), kBaselinePages);
  EXPECT_EQ(kv_->capacity_pages(), kBaselinePages + kExtraPages);
  EXPECT_EQ(kv_->num_blocks(), Floor(kBaselinePages));
  EXPECT_EQ(kv_->BlocksWithPages(kBaselinePages + 1), Floor(kBaselinePages + 1));
  EXPECT_EQ(kv_->BlockAddress(3), kv_->base() + 3 * geometry_.block_bytes);
  EXPECT_EQ(pool_->Account().mapped_kv, kBaselinePages);
}

TEST_P(KvRegionTest, GrowingKeepsEveryExistingBlockInPlaceWithItsContents) {
  const int64_t before = kv_->num_blocks();
  const DeviceAddress base = kv_->base();
  const std::vector<uint8_t> old_blocks = Fill(0, before, 1);

  auto pages = pool_->Allocate(3);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(kv_->Grow(*pages).ok());
  EXPECT_EQ(kv_->base(), base);
  EXPECT_EQ(kv_->num_blocks(), Floor(kBaselinePages + 3));
  EXPECT_EQ(Read(0, before), old_blocks);
  // The block that straddled the old end is now whole and usable, as are the new ones.
  const std::vector<uint8_t> new_blocks = Fill(before, kv_->num_blocks(), 2);
  EXPECT_EQ(Read(before, kv_->num_blocks()), new_blocks);
  EXPECT_EQ(Read(0, before), old_blocks);

  auto rest = pool_->Allocate(kExtraPages - 3);
  ASSERT_TRUE(rest.ok());
  ASSERT_TRUE(kv_->Grow(*rest).ok());
  EXPECT_EQ(kv_->mapped_pages(), kBaselinePages + kExtraPages);
  auto one_more = pool_->Allocate(1);
  ASSERT_TRUE(one_more.ok());
  EXPECT_TRUE(absl::IsOutOfRange(kv_->Grow(*one_more)));
  EXPECT_EQ(kv_->mapped_pages(), kBaselinePages + kExtraPages);
  EXPECT_EQ(Read(0, before), old_blocks);
  ASSERT_TRUE(pool_->Free(*one_more).ok());
}

TEST_P(KvRegionTest, ShrinksOnlyFromTheTailAndNeverBelowTheBaseline) {
  auto pages = pool_->Allocate(4);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(kv_->Grow(*pages).ok());
  const int64_t kept_blocks = kv_->BlocksWithPages(kBaselinePages + 2);
  const std::vector<uint8_t> kept = Fill(0, kept_blocks, 3);

  const PageId tail0 = kv_->region().PageAt(kBaselinePages + 2);
  const PageId tail1 = kv_->region().PageAt(kBaselinePages + 3);
  auto removed = kv_->ShrinkTail(2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, (std::vector<PageId>{tail0, tail1}));
  EXPECT_EQ(kv_->num_blocks(), kept_blocks);
  EXPECT_EQ(Read(0, kept_blocks), kept);

  EXPECT_TRUE(absl::IsOutOfRange(kv_->ShrinkTail(3).status()));  // would cut into the baseline
  EXPECT_EQ(kv_->mapped_pages(), kBaselinePages + 2);
  auto to_baseline = kv_->ShrinkTail(2);
  ASSERT_TRUE(to_baseline.ok());
  EXPECT_EQ(kv_->num_blocks(), Floor(kBaselinePages));
  ASSERT_TRUE(pool_->Free(*removed).ok());
  ASSERT_TRUE(pool_->Free(*to_baseline).ok());
  EXPECT_TRUE(pool_->Audit({&kv_->region()}).ok());
}

TEST_P(KvRegionTest, KAndVOfAllLayersTileEachBlock) {
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  for (int layer : geometry_.attention_layers) {
    parts.emplace_back(kv_->KAddress(2, layer) - kv_->BlockAddress(2), geometry_.layer_part_bytes);
    parts.emplace_back(kv_->VAddress(2, layer) - kv_->BlockAddress(2), geometry_.layer_part_bytes);
  }
  std::sort(parts.begin(), parts.end());
  uint64_t next = 0;
  for (const auto& [offset, bytes] : parts) {
    EXPECT_EQ(offset, next);
    next = offset + bytes;
  }
  EXPECT_EQ(next, geometry_.block_bytes);
}

VAMP_INSTANTIATE_BACKEND_SUITE(KvRegionTest);

}  // namespace
}  // namespace vamp
