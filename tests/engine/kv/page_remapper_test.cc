#include "engine/kv/page_remapper.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "engine/kv/agent_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/memory/test_backends.h"

namespace vamp {
namespace {

using testing::BackendTest;
using ::testing::HasSubstr;
using testing::PatternBytes;

constexpr int kLayers = 4;  // 3 eligible
constexpr int64_t kExperts = 16;
constexpr int64_t kKvPages = 6;
// A group step frees 3 pages in each of the 3 eligible layers: the two staging buffers take one
// layer's worth each, the KV cache the third.
constexpr int64_t kPagesPerGroup = 9;
constexpr int64_t kKvPagesPerGroup = 3;
constexpr int64_t kStagingPagesPerGroup = 6;

uint64_t Seed(int layer, int64_t expert) { return 7000 + 100 * layer + expert; }

// A plan for the small test model whose baseline KV pool is exactly `kv_pages` pages.
absl::StatusOr<MemoryPlan> SmallPlan(uint64_t page, int64_t kv_pages) {
  MemoryPlanConfig c;
  c.page_bytes = page;
  c.runtime_overhead_bytes = 0;
  c.activation_bytes = page;
  c.offload.max_offload_ratio = 0.5;  // 8 of 16 experts: 4 groups
  return PlanWithKvPages(testing::SmallTestShape(page, kLayers, kExperts), c, kv_pages);
}

class PageRemapperTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto plan = SmallPlan(page(), kKvPages);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *plan;
    ASSERT_EQ(plan_.kv_baseline_pages, kKvPages);
    ASSERT_EQ(plan_.experts.max_groups, 4);
    ASSERT_EQ(plan_.experts.pages_per_group(), kPagesPerGroup);
    ASSERT_TRUE(plan_.experts.staging_carved);
    ASSERT_EQ(plan_.experts.kv_pages_per_group(), kKvPagesPerGroup);
    auto memory = CreateAgentMemory(backend_.get(), plan_, &fence_);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(*memory);
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int64_t e = 0; e < kExperts; ++e) {
        ASSERT_TRUE(memory_.experts
                        ->WriteExpertBytes(layer, e, 0,
                                           PatternBytes(Seed(layer, e), plan_.experts.expert_bytes))
                        .ok());
      }
    }
    ASSERT_TRUE(memory_.experts->FinalizeLoad().ok());
    baseline_blocks_ = memory_.kv->num_blocks();
    baseline_content_ = FillBlocks(0, baseline_blocks_, 1);
  }
  void TearDown() override { memory_.Reset(); }

  ExpertStore& experts() { return *memory_.experts; }
  KvRegion& kv() { return *memory_.kv; }
  PageRemapper& page_remapper() { return *memory_.page_remapper; }

  std::vector<uint8_t> FillBlocks(int64_t first, int64_t last, uint64_t seed) {
    std::vector<uint8_t> data = PatternBytes(seed, (last - first) * plan_.kv.block_bytes);
    EXPECT_TRUE(
        backend_->CopyHostToDevice(kv().BlockAddress(first), data.data(), data.size()).ok());
    return data;
  }
  std::vector<uint8_t> ReadBlocks(int64_t first, int64_t last) {
    std::vector<uint8_t> out((last - first) * plan_.kv.block_bytes);
    EXPECT_TRUE(backend_->CopyDeviceToHost(out.data(), kv().BlockAddress(first), out.size()).ok());
    return out;
  }

  // Resident experts (from their regions) are byte-identical to what was loaded, and so are the
  // baseline KV blocks.
  void ExpectContentsIntact() {
    std::vector<uint8_t> out(plan_.experts.expert_bytes);
    for (int layer = 0; layer < kLayers; ++layer) {
      const int64_t b = layer == 0 ? kExperts : experts().boundary();
      for (int64_t e = 0; e < b; ++e) {
        ASSERT_TRUE(
            backend_->CopyDeviceToHost(out.data(), experts().W13Address(layer, e), out.size())
                .ok());
        ASSERT_EQ(out, PatternBytes(Seed(layer, e), out.size()))
            << "layer " << layer << " expert " << e;
      }
    }
    ASSERT_EQ(ReadBlocks(0, baseline_blocks_), baseline_content_);
  }

  // Page invariants checked independently of Audit: no page id appears in two slots anywhere,
  // and free + expert + KV pages is the whole pool.
  void ExpectEveryPageAccountedFor() {
    ASSERT_TRUE(page_remapper().Audit().ok()) << page_remapper().Audit();
    std::vector<const VirtualRegion*> regions = experts().regions();
    for (const VirtualRegion* region : experts().staging_regions()) regions.push_back(region);
    regions.push_back(&kv().region());
    std::set<PageId> seen;
    int64_t mapped = 0;
    for (const VirtualRegion* region : regions) {
      for (PageId p : region->SlotTable()) {
        if (p == kNoPage) continue;
        ++mapped;
        ASSERT_TRUE(seen.insert(p).second) << "page " << p << " is mapped twice";
      }
    }
    const PagePool::Accounting a = memory_.pool->Account();
    EXPECT_EQ(a.held, 0);
    EXPECT_EQ(mapped, a.mapped_expert + a.mapped_kv + a.mapped_staging);
    EXPECT_EQ(a.free + mapped, memory_.pool->num_pages());
    const int64_t groups = experts().offloaded_groups();
    EXPECT_EQ(kv().mapped_pages(), kKvPages + groups * kKvPagesPerGroup);
    EXPECT_EQ(a.mapped_staging, groups * kStagingPagesPerGroup);
    EXPECT_EQ(experts().staging_mapped_bytes(),
              static_cast<uint64_t>(groups * kStagingPagesPerGroup) * page());
    EXPECT_EQ(a.mapped_expert, plan_.experts.total_pages() - groups * kPagesPerGroup);
    EXPECT_EQ(experts().boundary(), kExperts - 2 * experts().offloaded_groups());
  }

  MemoryPlan plan_;
  int fence_calls_ = 0;
  std::function<void()> on_fence_;
  CallbackFence fence_{[this] {
    ++fence_calls_;
    if (on_fence_) on_fence_();
    return absl::OkStatus();
  }};
  AgentMemory memory_;
  int64_t baseline_blocks_ = 0;
  std::vector<uint8_t> baseline_content_;
};

TEST_P(PageRemapperTest, CapacityQueryMatchesWhatOffloadAdds) {
  EXPECT_EQ(plan_.pool_pages(), memory_.pool->num_pages());
  for (int64_t step = 0; step < 4; ++step) {
    absl::StatusOr<int64_t> predicted = page_remapper().BlocksAddedByOffload(1);
    ASSERT_TRUE(predicted.ok());
    absl::StatusOr<RemapResult> result = page_remapper().Offload(1);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->kv_blocks_after - result->kv_blocks_before, *predicted);
    EXPECT_EQ(result->pages, kKvPagesPerGroup);
    EXPECT_EQ(result->boundary, kExperts - 2 * (step + 1));
    EXPECT_EQ(kv().num_blocks(), result->kv_blocks_after);
    ExpectEveryPageAccountedFor();
  }
  // Every group offloaded: the KV region reaches the plan's maximum.
  EXPECT_EQ(kv().num_blocks(), plan_.kv_max_blocks);
  EXPECT_TRUE(absl::IsOutOfRange(page_remapper().BlocksAddedByOffload(1).status()));
  ExpectContentsIntact();
}

TEST_P(PageRemapperTest, OffloadThenRestoreGivesBackTheExactExpertsAndKeepsKvBlocks) {
  const DeviceAddress kv_base = kv().base();
  absl::StatusOr<RemapResult> offload = page_remapper().Offload(4);
  ASSERT_TRUE(offload.ok()) << offload.status();
  EXPECT_EQ(kv().base(), kv_base);
  ExpectContentsIntact();
  // The new blocks are used (and overwrite the former expert pages).
  FillBlocks(baseline_blocks_, kv().num_blocks(), 2);

  const int64_t free_tail = kv().num_blocks() - baseline_blocks_;
  absl::StatusOr<RemapResult> restore = page_remapper().Restore(4, free_tail);
  ASSERT_TRUE(restore.ok()) << restore.status();
  EXPECT_EQ(restore->kv_blocks_after, baseline_blocks_);
  EXPECT_EQ(experts().boundary(), kExperts);
  ExpectContentsIntact();  // now every expert of every layer
  ExpectEveryPageAccountedFor();
}

TEST_P(PageRemapperTest, RestoreTakesOnlyTailBlocksTheCallerFreed) {
  ASSERT_TRUE(page_remapper().Offload(2).ok());
  absl::StatusOr<int64_t> removed = page_remapper().BlocksRemovedByRestore(1);
  ASSERT_TRUE(removed.ok());
  ASSERT_GT(*removed, 0);
  const int64_t blocks = kv().num_blocks();
  absl::Status refused = page_remapper().Restore(1, *removed - 1).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused));
  EXPECT_THAT(refused.message(), HasSubstr("tail blocks are free"));
  EXPECT_EQ(kv().num_blocks(), blocks);
  ExpectEveryPageAccountedFor();
  absl::StatusOr<RemapResult> restored = page_remapper().Restore(1, *removed);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->kv_blocks_after, blocks - *removed);
  ExpectEveryPageAccountedFor();
}

TEST_P(PageRemapperTest, ErrorsLeaveEverythingAsItWas) {
  EXPECT_TRUE(absl::IsOutOfRange(page_remapper().Offload(5).status()));           // past the cap
  EXPECT_TRUE(absl::IsOutOfRange(page_remapper().Restore(1, 1 << 20).status()));  // none out
  ExpectEveryPageAccountedFor();
  ASSERT_TRUE(page_remapper().Offload(1).ok());
  absl::Status more = page_remapper().Restore(2, 1 << 20).status();
  EXPECT_TRUE(absl::IsOutOfRange(more));
  EXPECT_THAT(more.message(), HasSubstr("only 1 are offloaded"));
  EXPECT_TRUE(absl::IsOutOfRange(page_remapper().Restore(0, 1 << 20).status()));
  EXPECT_TRUE(absl::IsOutOfRange(page_remapper().Offload(4).status()));
  EXPECT_EQ(experts().offloaded_groups(), 1);
  ExpectEveryPageAccountedFor();
  ExpectContentsIntact();
}

TEST_P(PageRemapperTest, WaitsForInFlightWorkBeforeUnmappingEitherWay) {
  // Offload: the experts' pages are all still mapped when the fence runs.
  on_fence_ = [this] {
    for (const VirtualRegion* region : experts().regions()) {
      EXPECT_EQ(region->mapped_pages(), plan_.experts.region_pages);
    }
  };
  ASSERT_TRUE(page_remapper().Offload(2).ok());
  EXPECT_EQ(fence_calls_, 1);
  // Restore: the KV tail is still mapped when the fence runs.
  const int64_t kv_pages = kv().mapped_pages();
  on_fence_ = [this, kv_pages] { EXPECT_EQ(kv().mapped_pages(), kv_pages); };
  ASSERT_TRUE(page_remapper().Restore(2, 1 << 20).ok());
  EXPECT_EQ(fence_calls_, 2);
}

TEST_P(PageRemapperTest, RandomisedOffloadRestoreSequencesKeepEveryInvariant) {
  const uint32_t seed = 20261129;
  std::mt19937 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  int offloads = 0;
  int restores = 0;
  for (int step = 0; step < 150; ++step) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    if (rng() % 2 == 0) {
      const bool fits = n <= experts().remaining_groups();
      absl::StatusOr<RemapResult> r = page_remapper().Offload(n);
      ASSERT_EQ(r.ok(), fits) << "step " << step << ": " << r.status();
      if (r.ok()) {
        ++offloads;
        // Blocks are handed out at once and written, as the KV manager would.
        FillBlocks(r->kv_blocks_before, r->kv_blocks_after, 100 + step);
      } else {
        ASSERT_TRUE(absl::IsOutOfRange(r.status()));
      }
    } else {
      const bool fits = n <= experts().offloaded_groups();
      absl::StatusOr<RemapResult> r = page_remapper().Restore(n, kv().num_blocks());
      ASSERT_EQ(r.ok(), fits) << "step " << step << ": " << r.status();
      if (r.ok()) ++restores;
    }
    ExpectEveryPageAccountedFor();
    if (HasFatalFailure()) return;
    if (step % 10 == 0) {
      ExpectContentsIntact();
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(offloads, 10);
  EXPECT_GT(restores, 10);
  // Bring everything back and check every expert of every layer.
  if (experts().offloaded_groups() > 0) {
    ASSERT_TRUE(page_remapper().Restore(experts().offloaded_groups(), kv().num_blocks()).ok());
  }
  ExpectContentsIntact();
  ExpectEveryPageAccountedFor();
}

TEST_P(PageRemapperTest, RejectsAPlanForAnotherPageSize) {
  MemoryPlan other = plan_;
  other.experts.page_bytes = 2 * page();
  absl::StatusOr<AgentMemory> memory = CreateAgentMemory(backend_.get(), other, &fence_);
  EXPECT_TRUE(absl::IsInvalidArgument(memory.status()));
}

VAMP_INSTANTIATE_BACKEND_SUITE(PageRemapperTest);

}  // namespace
}  // namespace vamp
