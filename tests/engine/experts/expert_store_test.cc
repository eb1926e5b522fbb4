#include "engine/experts/expert_store.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/memory/test_backends.h"

namespace vamp {
namespace {

using testing::BackendTest;
using ::testing::HasSubstr;
using testing::PatternBytes;

constexpr int kLayers = 3;
constexpr int64_t kExperts = 16;
constexpr int64_t kScratchPages = 40;

uint64_t Seed(int layer, int64_t expert) { return 1000 * static_cast<uint64_t>(layer) + expert; }

class ExpertStoreTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    OffloadConfig offload;
    offload.max_offload_ratio = 0.5;  // 8 of 16 experts: 4 groups of 2
    auto geometry = ComputeExpertGeometry(testing::SmallTestShape(page(), kLayers, kExperts), 1,
                                          page(), offload);
    ASSERT_TRUE(geometry.ok()) << geometry.status();
    geometry_ = *geometry;
    ASSERT_EQ(geometry_.group_experts, 2);
    ASSERT_EQ(geometry_.group_pages, 3);
    ASSERT_EQ(geometry_.max_groups, 4);
    auto pool = PagePool::Create(backend_.get(), geometry_.total_pages() + kScratchPages);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    auto store = ExpertStore::Create(pool_.get(), geometry_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void TearDown() override {
    store_.reset();
    pool_.reset();
  }

  std::vector<uint8_t> Original(int layer, int64_t expert) const {
    return PatternBytes(Seed(layer, expert), geometry_.expert_bytes);
  }

  void LoadAll() {
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int64_t e = 0; e < kExperts; ++e) {
        const std::vector<uint8_t> bytes = Original(layer, e);
        ASSERT_TRUE(store_
                        ->WriteExpert(layer, e,
                                      absl::MakeConstSpan(bytes).first(geometry_.w13_bytes),
                                      absl::MakeConstSpan(bytes).subspan(geometry_.w13_bytes))
                        .ok());
      }
    }
    ASSERT_TRUE(store_->FinalizeLoad().ok());
  }

  // The bytes in the expert's place in its region (not the pinned copy).
  std::vector<uint8_t> RegionBytes(int layer, int64_t expert) const {
    std::vector<uint8_t> out(geometry_.expert_bytes);
    absl::Status s =
        backend_->CopyDeviceToHost(out.data(), store_->W13Address(layer, expert), out.size());
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // Every expert below b (and every expert of the first layer) still holds its original bytes.
  void ExpectResidentExpertsUnchanged() const {
    for (int layer = 0; layer < kLayers; ++layer) {
      const int64_t b = layer == 0 ? kExperts : store_->boundary();
      for (int64_t e = 0; e < b; ++e) {
        ASSERT_EQ(RegionBytes(layer, e), Original(layer, e))
            << "layer " << layer << " expert " << e;
      }
    }
  }

  // Overwrites `pages` (held) with garbage through a scratch region, as the KV cache would.
  void Scribble(const std::vector<PageId>& pages) {
    auto scratch = VirtualRegion::Reserve(pool_.get(), RegionKind::kOther, "scratch",
                                          static_cast<int64_t>(pages.size()));
    ASSERT_TRUE(scratch.ok());
    ASSERT_TRUE((*scratch)->MapPages(0, pages).ok());
    const std::vector<uint8_t> garbage = PatternBytes(99, pages.size() * page());
    ASSERT_TRUE(
        backend_->CopyHostToDevice((*scratch)->base(), garbage.data(), garbage.size()).ok());
    ASSERT_TRUE((*scratch)->UnmapPages(0, static_cast<int64_t>(pages.size())).ok());
  }

  ExpertGeometry geometry_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<ExpertStore> store_;
  CallbackFence idle_{[] { return absl::OkStatus(); }};
};

TEST_P(ExpertStoreTest, LayoutIsExpertMajorWithStableAddresses) {
  LoadAll();
  for (int layer = 0; layer < kLayers; ++layer) {
    const DeviceAddress base = store_->RegionBase(layer);
    EXPECT_EQ(base % page(), 0u);
    for (int64_t e = 0; e < kExperts; ++e) {
      EXPECT_EQ(store_->W13Address(layer, e), base + e * geometry_.expert_bytes);
      EXPECT_EQ(store_->W2Address(layer, e), store_->W13Address(layer, e) + geometry_.w13_bytes);
    }
    const std::vector<ExpertLocation> table = store_->PointerTable(layer);
    ASSERT_EQ(table.size(), static_cast<size_t>(kExperts));
    for (int64_t e = 0; e < kExperts; ++e) {
      EXPECT_EQ(table[e].where, ExpertLocation::Where::kResident);
      EXPECT_EQ(table[e].w13, store_->W13Address(layer, e));
      EXPECT_EQ(table[e].w2, store_->W2Address(layer, e));
    }
  }
  ExpectResidentExpertsUnchanged();
  EXPECT_EQ(pool_->Account().mapped_expert, geometry_.total_pages());
}

TEST_P(ExpertStoreTest, OffloadMovesTheBoundaryAndHandsOutTheTopPages) {
  LoadAll();
  const uint64_t version = store_->table_version();
  const std::vector<DeviceAddress> bases = {store_->RegionBase(0), store_->RegionBase(1),
                                            store_->RegionBase(2)};
  auto pages = store_->Offload(1, idle_);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(pages->size(), 2u * 3);  // 2 eligible layers x 3 pages
  EXPECT_EQ(store_->boundary(), 14);
  EXPECT_EQ(store_->offloaded_groups(), 1);
  EXPECT_EQ(store_->remaining_groups(), 3);
  EXPECT_GT(store_->table_version(), version);
  EXPECT_EQ(store_->offloaded_bytes(), 2 * 2 * geometry_.expert_bytes);
  EXPECT_EQ(pool_->Account().mapped_expert, geometry_.total_pages() - 6);
  // Addresses never move.
  EXPECT_EQ(store_->RegionBase(0), bases[0]);
  EXPECT_EQ(store_->RegionBase(2), bases[2]);

  // The first MoE layer stays resident; eligible layers read 14 and 15 from the staging buffer.
  for (const ExpertLocation& loc : store_->PointerTable(0)) {
    EXPECT_EQ(loc.where, ExpertLocation::Where::kResident);
  }
  const std::vector<ExpertLocation> table = store_->PointerTable(1);
  EXPECT_EQ(table[13].where, ExpertLocation::Where::kResident);
  EXPECT_EQ(table[14].where, ExpertLocation::Where::kStaging);
  EXPECT_EQ(table[14].w13, 0u);
  EXPECT_EQ(table[14].w2, geometry_.w13_bytes);
  EXPECT_EQ(table[15].w13, geometry_.expert_bytes);

  // What the staging engine copies: the pinned copy of [14, 16).
  const ExpertStore::HostRange range = store_->OffloadedHostRange(2);
  EXPECT_EQ(range.first_expert, 14);
  EXPECT_EQ(range.num_experts, 2);
  ASSERT_EQ(range.bytes, 2 * geometry_.expert_bytes);
  std::vector<uint8_t> expected = Original(2, 14);
  const std::vector<uint8_t> e15 = Original(2, 15);
  expected.insert(expected.end(), e15.begin(), e15.end());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), range.data));
  EXPECT_EQ(store_->OffloadedHostRange(0).bytes, 0u);

  // Offloaded experts read from their pinned copy; resident ones are untouched.
  std::vector<uint8_t> read(geometry_.expert_bytes);
  ASSERT_TRUE(store_->ReadExpert(1, 15, absl::MakeSpan(read)).ok());
  EXPECT_EQ(read, Original(1, 15));
  Scribble(*pages);
  ExpectResidentExpertsUnchanged();
  ASSERT_TRUE(store_->Restore(*pages).ok());
}

TEST_P(ExpertStoreTest, RestoredExpertsAreByteIdenticalToTheOriginals) {
  LoadAll();
  auto pages = store_->Offload(3, idle_);
  ASSERT_TRUE(pages.ok()) << pages.status();
  ASSERT_EQ(store_->boundary(), 10);
  Scribble(*pages);  // the pages served as KV blocks meanwhile
  ExpectResidentExpertsUnchanged();

  // Restore one group step (any 6 pages), then the rest.
  std::vector<PageId> first(pages->begin(), pages->begin() + 6);
  std::vector<PageId> rest(pages->begin() + 6, pages->end());
  RemapTimings timings;
  ASSERT_TRUE(store_->Restore(first, &timings).ok());
  EXPECT_EQ(store_->boundary(), 12);
  EXPECT_GE(timings.copy_us, 0.0);
  ExpectResidentExpertsUnchanged();
  ASSERT_TRUE(store_->Restore(rest).ok());
  EXPECT_EQ(store_->boundary(), kExperts);
  EXPECT_EQ(store_->offloaded_groups(), 0);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int64_t e = 0; e < kExperts; ++e) {
      ASSERT_EQ(RegionBytes(layer, e), Original(layer, e)) << "layer " << layer << " expert " << e;
    }
  }
  EXPECT_EQ(pool_->Account().mapped_expert, geometry_.total_pages());
  std::vector<const VirtualRegion*> regions = store_->regions();
  for (const VirtualRegion* region : store_->staging_regions()) regions.push_back(region);
  EXPECT_TRUE(pool_->Audit(regions).ok());
}

TEST_P(ExpertStoreTest, OffloadPastTheCapAndRestoringMoreThanOffloadedFail) {
  LoadAll();
  EXPECT_TRUE(absl::IsOutOfRange(store_->Offload(0, idle_).status()));
  absl::Status past = store_->Offload(5, idle_).status();
  EXPECT_TRUE(absl::IsOutOfRange(past));
  EXPECT_THAT(past.message(), HasSubstr("cap: 8 of 16 experts"));
  auto all = store_->Offload(4, idle_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(store_->boundary(), 8);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Offload(1, idle_).status()));

  // Not a whole group step.
  std::vector<PageId> seven(all->begin(), all->begin() + 7);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Restore(seven)));
  ASSERT_TRUE(store_->Restore(*all).ok());
  // More than is offloaded (nothing is now), with spare pages from the pool.
  auto held = pool_->Allocate(6);
  ASSERT_TRUE(held.ok());
  absl::Status more = store_->Restore(*held);
  EXPECT_TRUE(absl::IsOutOfRange(more));
  EXPECT_THAT(more.message(), HasSubstr("at most the 0 offloaded"));
  EXPECT_EQ(store_->boundary(), kExperts);
  ASSERT_TRUE(pool_->Free(*held).ok());
}

TEST_P(ExpertStoreTest, LoadingRules) {
  // Remapping needs the pinned copies.
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Offload(1, idle_).status()));
  std::vector<uint8_t> small(10);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->WriteExpert(0, 0, small, small)));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->WriteExpertBytes(0, kExperts, 0, small)));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->WriteExpertBytes(7, 0, 0, small)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(store_->WriteExpertBytes(0, 0, geometry_.expert_bytes - 5, small)));

  // Writing an expert in pieces (gate, up, down) gives the same bytes as one write.
  const std::vector<uint8_t> bytes = Original(1, 3);
  const uint64_t half = geometry_.w13_bytes / 2;
  auto span = absl::MakeConstSpan(bytes);
  ASSERT_TRUE(store_->WriteExpertBytes(1, 3, 0, span.first(half)).ok());
  ASSERT_TRUE(store_->WriteExpertBytes(1, 3, half, span.subspan(half, half)).ok());
  ASSERT_TRUE(
      store_->WriteExpertBytes(1, 3, geometry_.w13_bytes, span.subspan(geometry_.w13_bytes)).ok());
  EXPECT_EQ(RegionBytes(1, 3), bytes);

  LoadAll();
  EXPECT_TRUE(store_->load_finalized());
  absl::Status frozen = store_->WriteExpertBytes(1, 3, 0, span.first(half));
  EXPECT_TRUE(absl::IsFailedPrecondition(frozen));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->FinalizeLoad()));
}

TEST_P(ExpertStoreTest, FenceRunsAfterTheBoundaryMovesAndBeforeAnyPageIsUnmapped) {
  LoadAll();
  int calls = 0;
  CallbackFence fence([&]() -> absl::Status {
    ++calls;
    EXPECT_EQ(store_->boundary(), 12);  // new steps already read [12, 16) from staging
    for (const VirtualRegion* region : store_->regions()) {
      EXPECT_EQ(region->mapped_pages(), geometry_.region_pages);  // nothing unmapped yet
    }
    return absl::OkStatus();
  });
  auto pages = store_->Offload(2, fence);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(store_->Restore(*pages).ok());
}

TEST_P(ExpertStoreTest, AFailingFenceChangesNothing) {
  LoadAll();
  CallbackFence broken([] { return absl::InternalError("stream sync failed"); });
  absl::StatusOr<std::vector<PageId>> pages = store_->Offload(2, broken);
  EXPECT_TRUE(absl::IsInternal(pages.status()));
  EXPECT_THAT(pages.status().message(), HasSubstr("stream sync failed"));
  EXPECT_EQ(store_->boundary(), kExperts);
  for (const VirtualRegion* region : store_->regions()) {
    EXPECT_EQ(region->mapped_pages(), geometry_.region_pages);
  }
  for (const ExpertLocation& loc : store_->PointerTable(1)) {
    EXPECT_EQ(loc.where, ExpertLocation::Where::kResident);
  }
}

VAMP_INSTANTIATE_BACKEND_SUITE(ExpertStoreTest);

// A region whose expert count is not a multiple of the group keeps its padding in front, so the
// offloaded top experts still start on a page.
TEST(ExpertStorePaddingTest, OddExpertCountRoundTrips) {
  auto backend = testing::MakeTestBackend(testing::TestBackend::kHost);
  ASSERT_TRUE(backend.ok());
  const uint64_t page = (*backend)->page_bytes();
  OffloadConfig offload;
  offload.max_offload_ratio = 1.0;
  auto g = ComputeExpertGeometry(testing::SmallTestShape(page, 2, 5), 1, page, offload);
  ASSERT_TRUE(g.ok());
  ASSERT_GT(g->lead_bytes, 0u);
  ASSERT_FALSE(g->staging_carved);  // one eligible layer: the buffers are reserved
  auto pool = PagePool::Create(backend->get(), g->total_pages() + g->reserved_staging_pages());
  ASSERT_TRUE(pool.ok());
  auto store = ExpertStore::Create(pool->get(), *g);
  ASSERT_TRUE(store.ok());
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t e = 0; e < 5; ++e) {
      const std::vector<uint8_t> bytes = PatternBytes(Seed(layer, e), g->expert_bytes);
      ASSERT_TRUE((*store)->WriteExpertBytes(layer, e, 0, bytes).ok());
    }
  }
  ASSERT_TRUE((*store)->FinalizeLoad().ok());
  CallbackFence idle([] { return absl::OkStatus(); });
  auto pages = (*store)->Offload(2, idle);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ((*store)->boundary(), 1);
  EXPECT_EQ(pages->size(), 6u);
  ASSERT_TRUE((*store)->Restore(*pages).ok());
  for (int64_t e = 0; e < 5; ++e) {
    std::vector<uint8_t> out(g->expert_bytes);
    ASSERT_TRUE((*store)->ReadExpert(1, e, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, PatternBytes(Seed(1, e), g->expert_bytes)) << "expert " << e;
  }
}

// With more eligible layers than staging buffers, the buffers own no page until an offload: the
// first pages each offload frees (one eligible layer's run per buffer) are mapped at the buffers'
// ends, the rest go to the caller, and a restore takes the buffers' tail back with the caller's
// pages.
TEST(ExpertStoreCarvedStagingTest, BuffersGrowAndShrinkWithTheOffload) {
  auto backend = testing::MakeTestBackend(testing::TestBackend::kHost);
  ASSERT_TRUE(backend.ok());
  const uint64_t page = (*backend)->page_bytes();
  OffloadConfig offload;
  offload.max_offload_ratio = 0.5;
  offload.staging_buffers = 1;
  auto g = ComputeExpertGeometry(testing::SmallTestShape(page, kLayers, kExperts), 1, page,
                                 offload);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->staging_carved);
  ASSERT_EQ(g->group_pages, 3);
  ASSERT_EQ(g->kv_pages_per_group(), 3);  // 2 eligible layers x 3 pages, 3 to the buffer
  ASSERT_EQ(g->reserved_staging_pages(), 0);
  auto pool = PagePool::Create(backend->get(), g->total_pages());
  ASSERT_TRUE(pool.ok());
  auto store = ExpertStore::Create(pool->get(), *g);
  ASSERT_TRUE(store.ok()) << store.status();
  ExpertStore& s = **store;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int64_t e = 0; e < kExperts; ++e) {
      ASSERT_TRUE(s.WriteExpertBytes(layer, e, 0, PatternBytes(Seed(layer, e), g->expert_bytes))
                      .ok());
    }
  }
  ASSERT_TRUE(s.FinalizeLoad().ok());
  ASSERT_EQ(s.num_staging_buffers(), 1);
  const DeviceAddress buffer = s.StagingBufferAddress(0);
  EXPECT_EQ(s.staging_mapped_bytes(), 0u);

  // Layer 1's freed pages become the buffer; layer 2's are handed out.
  const std::vector<PageId> layer1_tail = s.regions()[1]->SlotTable();
  const std::vector<PageId> layer2_tail = s.regions()[2]->SlotTable();
  CallbackFence idle([] { return absl::OkStatus(); });
  auto pages = s.Offload(2, idle);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(s.boundary(), 12);
  const size_t n = 6;  // 2 groups x 3 pages
  EXPECT_EQ(*pages, std::vector<PageId>(layer2_tail.end() - n, layer2_tail.end()));
  EXPECT_EQ(s.staging_regions()[0]->SlotTable(),
            [&] {
              std::vector<PageId> want(layer1_tail.end() - n, layer1_tail.end());
              want.resize(static_cast<size_t>(g->staging_buffer_pages()), kNoPage);
              return want;
            }());
  EXPECT_EQ(s.staging_mapped_bytes(), n * page);
  EXPECT_EQ(s.StagingBufferAddress(0), buffer);
  EXPECT_EQ(pool->get()->Account().mapped_staging, 6);
  // The buffer is usable memory: the staging engine writes there.
  const std::vector<uint8_t> junk = PatternBytes(99, n * page);
  ASSERT_TRUE((*backend)->CopyHostToDevice(buffer, junk.data(), junk.size()).ok());

  // Restoring one group takes 3 pages from the caller and the buffer's last 3.
  ASSERT_TRUE(s.Restore(absl::MakeConstSpan(*pages).first(3)).ok());
  EXPECT_EQ(s.boundary(), 14);
  EXPECT_EQ(s.staging_mapped_bytes(), 3 * page);
  ASSERT_TRUE(s.Restore(absl::MakeConstSpan(*pages).subspan(3)).ok());
  EXPECT_EQ(s.staging_mapped_bytes(), 0u);
  const PagePool::Accounting a = pool->get()->Account();
  EXPECT_EQ(a.mapped_expert, g->total_pages());
  EXPECT_EQ(a.held, 0);
  for (int layer = 1; layer < kLayers; ++layer) {
    for (int64_t e = 0; e < kExperts; ++e) {
      std::vector<uint8_t> out(g->expert_bytes);
      ASSERT_TRUE(
          (*backend)->CopyDeviceToHost(out.data(), s.W13Address(layer, e), out.size()).ok());
      EXPECT_EQ(out, PatternBytes(Seed(layer, e), g->expert_bytes))
          << "layer " << layer << " expert " << e;
    }
  }
  // A restore of pages that are not whole KV shares of a group is refused, changing nothing.
  auto again = s.Offload(1, idle);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(absl::IsOutOfRange(s.Restore(absl::MakeConstSpan(*again).first(2))));
  EXPECT_EQ(s.staging_mapped_bytes(), 3 * page);
  EXPECT_TRUE(s.Restore(*again).ok());
}

}  // namespace
}  // namespace vamp
