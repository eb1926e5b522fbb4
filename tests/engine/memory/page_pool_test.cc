#include "engine/memory/page_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "engine/memory/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/memory/test_backends.h"

namespace vamp {
namespace {

using testing::BackendTest;
using ::testing::HasSubstr;
using testing::PatternBytes;

// ---- Backend primitives (the same semantics on every backend) ----

class BackendPrimitivesTest : public BackendTest {};

TEST_P(BackendPrimitivesTest, PageContentsSurviveUnmapAndRemapElsewhere) {
  absl::StatusOr<PhysicalPageHandle> handle = backend_->CreatePhysicalPage();
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<DeviceAddress> a = backend_->ReserveAddressRange(2 * page());
  absl::StatusOr<DeviceAddress> b = backend_->ReserveAddressRange(3 * page());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a % page(), 0u);
  EXPECT_EQ(*b % page(), 0u);

  ASSERT_TRUE(backend_->MapPage(*a + page(), *handle).ok());
  ASSERT_TRUE(backend_->SetReadWriteAccess(*a + page(), page()).ok());
  const std::vector<uint8_t> data = PatternBytes(7, page());
  ASSERT_TRUE(backend_->CopyHostToDevice(*a + page(), data.data(), data.size()).ok());
  ASSERT_TRUE(backend_->UnmapPages(*a + page(), page()).ok());

  // Same physical page, different virtual address: same bytes.
  ASSERT_TRUE(backend_->MapPage(*b + 2 * page(), *handle).ok());
  ASSERT_TRUE(backend_->SetReadWriteAccess(*b + 2 * page(), page()).ok());
  std::vector<uint8_t> back(page());
  ASSERT_TRUE(backend_->CopyDeviceToHost(back.data(), *b + 2 * page(), back.size()).ok());
  EXPECT_EQ(back, data);

  ASSERT_TRUE(backend_->UnmapPages(*b + 2 * page(), page()).ok());
  EXPECT_TRUE(backend_->FreeAddressRange(*a, 2 * page()).ok());
  EXPECT_TRUE(backend_->FreeAddressRange(*b, 3 * page()).ok());
  EXPECT_TRUE(backend_->ReleasePhysicalPage(*handle).ok());
}

TEST_P(BackendPrimitivesTest, RefusesWhatTheDriverRefuses) {
  absl::StatusOr<PhysicalPageHandle> p1 = backend_->CreatePhysicalPage();
  absl::StatusOr<PhysicalPageHandle> p2 = backend_->CreatePhysicalPage();
  ASSERT_TRUE(p1.ok() && p2.ok());
  absl::StatusOr<DeviceAddress> base = backend_->ReserveAddressRange(2 * page());
  ASSERT_TRUE(base.ok());
  EXPECT_FALSE(backend_->ReserveAddressRange(page() + 1).ok());
  ASSERT_TRUE(backend_->MapPage(*base, *p1).ok());
  // Mapping over a mapped page.
  EXPECT_FALSE(backend_->MapPage(*base, *p2).ok());
  // Access over a range with an unmapped page.
  EXPECT_FALSE(backend_->SetReadWriteAccess(*base, 2 * page()).ok());
  ASSERT_TRUE(backend_->SetReadWriteAccess(*base, page()).ok());
  ASSERT_TRUE(backend_->UnmapPages(*base, page()).ok());
  EXPECT_TRUE(backend_->FreeAddressRange(*base, 2 * page()).ok());
  EXPECT_TRUE(backend_->ReleasePhysicalPage(*p1).ok());
  EXPECT_TRUE(backend_->ReleasePhysicalPage(*p2).ok());
}

TEST_P(BackendPrimitivesTest, PinnedHostBufferIsUsable) {
  absl::StatusOr<PinnedHostBuffer> buffer = PinnedHostBuffer::Allocate(backend_.get(), 12345);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_NE(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 12345u);
  std::memset(buffer->data(), 0xAB, buffer->size());
  PinnedHostBuffer moved = std::move(*buffer);
  EXPECT_EQ(moved.data()[12344], 0xAB);
  EXPECT_EQ(buffer->data(), nullptr);
}

VAMP_INSTANTIATE_BACKEND_SUITE(BackendPrimitivesTest);

// ---- PagePool and VirtualRegion ----

class PagePoolTest : public BackendTest {};

TEST_P(PagePoolTest, AllocateAndFreeTrackEveryPage) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(backend_.get(), 8);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->num_pages(), 8);
  absl::StatusOr<std::vector<PageId>> pages = (*pool)->Allocate(5);
  ASSERT_TRUE(pages.ok());
  EXPECT_THAT(*pages, ::testing::ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ((*pool)->num_free(), 3);
  PagePool::Accounting a = (*pool)->Account();
  EXPECT_EQ(a.free, 3);
  EXPECT_EQ(a.held, 5);

  absl::StatusOr<std::vector<PageId>> too_many = (*pool)->Allocate(4);
  EXPECT_TRUE(absl::IsResourceExhausted(too_many.status()));
  EXPECT_THAT(too_many.status().message(), HasSubstr("3 of 8 are free"));

  ASSERT_TRUE((*pool)->Free(*pages).ok());
  EXPECT_EQ((*pool)->num_free(), 8);
  // Freeing a free page is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition((*pool)->Free(std::vector<PageId>{2})));
}

TEST_P(PagePoolTest, NoPageIsEverMappedTwice) {
  auto pool = PagePool::Create(backend_.get(), 4);
  ASSERT_TRUE(pool.ok());
  auto r1 = VirtualRegion::Reserve(pool->get(), RegionKind::kExpert, "r1", 4);
  auto r2 = VirtualRegion::Reserve(pool->get(), RegionKind::kKv, "r2", 4);
  ASSERT_TRUE(r1.ok() && r2.ok());
  auto pages = (*pool)->Allocate(2);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE((*r1)->MapPages(1, *pages).ok());

  // The same page in another region, or at another slot of the same region.
  absl::Status again = (*r2)->MapPages(0, std::vector<PageId>{(*pages)[0]});
  EXPECT_TRUE(absl::IsFailedPrecondition(again));
  EXPECT_THAT(again.message(), HasSubstr("already mapped in region 'r1' slot 1"));
  EXPECT_TRUE(absl::IsFailedPrecondition((*r1)->MapPages(3, std::vector<PageId>{(*pages)[1]})));
  // A free page (never allocated) cannot be mapped either.
  EXPECT_TRUE(absl::IsFailedPrecondition((*r2)->MapPages(0, std::vector<PageId>{3})));
  // One page twice in one request.
  auto more = (*pool)->Allocate(1);
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(
      absl::IsFailedPrecondition((*r2)->MapPages(0, std::vector<PageId>{(*more)[0], (*more)[0]})));
  // A slot that is already mapped.
  EXPECT_TRUE(absl::IsFailedPrecondition((*r1)->MapPages(2, *more)));

  // Failed requests left nothing behind.
  EXPECT_EQ((*r2)->mapped_pages(), 0);
  EXPECT_TRUE((*pool)->Audit({r1->get(), r2->get()}).ok());
  PagePool::Accounting a = (*pool)->Account();
  EXPECT_EQ(a.mapped_expert, 2);
  EXPECT_EQ(a.mapped_kv, 0);
  EXPECT_EQ(a.held, 1);
  EXPECT_EQ(a.free, 1);

  // Moving a page: unmap from r1, map into r2.
  auto moved = (*r1)->UnmapPages(2, 1);
  ASSERT_TRUE(moved.ok());
  EXPECT_THAT(*moved, ::testing::ElementsAre((*pages)[1]));
  ASSERT_TRUE((*r2)->MapPages(0, *moved).ok());
  EXPECT_EQ((*r2)->PageAt(0), (*pages)[1]);
  EXPECT_EQ((*r1)->PageAt(2), kNoPage);
  EXPECT_TRUE((*pool)->Audit({r1->get(), r2->get()}).ok());
  // An audit that misses a region notices the pages it holds.
  EXPECT_FALSE((*pool)->Audit({r1->get()}).ok());
  ASSERT_TRUE((*pool)->Free(*more).ok());
}

TEST_P(PagePoolTest, RegionRejectsOutOfRangeAndUnmappedSlots) {
  auto pool = PagePool::Create(backend_.get(), 2);
  ASSERT_TRUE(pool.ok());
  auto region = VirtualRegion::Reserve(pool->get(), RegionKind::kOther, "r", 2);
  ASSERT_TRUE(region.ok());
  auto pages = (*pool)->Allocate(2);
  ASSERT_TRUE(pages.ok());
  EXPECT_TRUE(absl::IsOutOfRange((*region)->MapPages(1, *pages)));
  EXPECT_TRUE(absl::IsFailedPrecondition((*region)->UnmapPages(0, 1).status()));
  ASSERT_TRUE((*region)->MapPages(0, *pages).ok());
  EXPECT_EQ((*region)->mapped_pages(), 2);
  EXPECT_EQ((*pool)->Account().mapped_other, 2);
}

TEST_P(PagePoolTest, DestroyingARegionReturnsItsPages) {
  auto pool = PagePool::Create(backend_.get(), 3);
  ASSERT_TRUE(pool.ok());
  {
    auto region = VirtualRegion::Reserve(pool->get(), RegionKind::kKv, "kv", 3);
    ASSERT_TRUE(region.ok());
    auto pages = (*pool)->Allocate(3);
    ASSERT_TRUE(pages.ok());
    ASSERT_TRUE((*region)->MapPages(0, *pages).ok());
    EXPECT_EQ((*pool)->num_free(), 0);
  }
  EXPECT_EQ((*pool)->num_free(), 3);
}

VAMP_INSTANTIATE_BACKEND_SUITE(PagePoolTest);

// ---- Host-only: what the host backend does to the process's address space ----

TEST(HostBackendTest, RejectsPagesThatAreNotOsPageMultiples) {
  EXPECT_TRUE(absl::IsInvalidArgument(HostMemoryBackend::Create(1000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HostMemoryBackend::Create(0).status()));
}

TEST(HostBackendTest, MemoryIsInaccessibleUntilAccessIsSetAndAfterUnmap) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto backend = HostMemoryBackend::Create(testing::kTestHostPageBytes);
  ASSERT_TRUE(backend.ok());
  const uint64_t page = (*backend)->page_bytes();
  auto handle = (*backend)->CreatePhysicalPage();
  auto base = (*backend)->ReserveAddressRange(page);
  ASSERT_TRUE(handle.ok() && base.ok());
  volatile uint8_t* ptr = reinterpret_cast<volatile uint8_t*>(*base);
  EXPECT_DEATH(ptr[0] = 1, "");  // reserved only
  ASSERT_TRUE((*backend)->MapPage(*base, *handle).ok());
  EXPECT_DEATH(ptr[0] = 1, "");  // mapped, no access yet (as cuMemMap)
  EXPECT_FALSE((*backend)->CopyHostToDevice(*base, "x", 1).ok());
  ASSERT_TRUE((*backend)->SetReadWriteAccess(*base, page).ok());
  ptr[0] = 42;
  EXPECT_EQ(ptr[0], 42);
  // Releasing a mapped page or freeing a reservation with mappings is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition((*backend)->ReleasePhysicalPage(*handle)));
  EXPECT_TRUE(absl::IsFailedPrecondition((*backend)->FreeAddressRange(*base, page)));
  ASSERT_TRUE((*backend)->UnmapPages(*base, page).ok());
  EXPECT_DEATH(ptr[0] = 1, "");  // unmapped, still reserved
  EXPECT_TRUE((*backend)->FreeAddressRange(*base, page).ok());
  EXPECT_TRUE((*backend)->ReleasePhysicalPage(*handle).ok());
  // A released slice is reused by the next page created.
  auto again = (*backend)->CreatePhysicalPage();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *handle);
}

TEST(HostBackendTest, PopulatedBackendCannotCreateMorePagesThanItsMemory) {
  const uint64_t page = testing::kTestHostPageBytes;
  auto backend = HostMemoryBackend::Create(page, 3 * page, /*populate=*/true);
  ASSERT_TRUE(backend.ok());
  std::vector<PhysicalPageHandle> pages;
  for (int i = 0; i < 3; ++i) {
    auto p = (*backend)->CreatePhysicalPage();
    ASSERT_TRUE(p.ok()) << p.status();
    pages.push_back(*p);
  }
  EXPECT_TRUE(absl::IsResourceExhausted((*backend)->CreatePhysicalPage().status()));
  ASSERT_TRUE((*backend)->ReleasePhysicalPage(pages[1]).ok());
  EXPECT_TRUE((*backend)->CreatePhysicalPage().ok());
  // A lazily committed backend reserves more than its memory.
  auto lazy = HostMemoryBackend::Create(page, 3 * page, /*populate=*/false);
  ASSERT_TRUE(lazy.ok());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE((*lazy)->CreatePhysicalPage().ok());
}

TEST(MemoryBackendTest, ParsesKindsAndReportsMissingCuda) {
  EXPECT_EQ(*ParseMemoryBackendKind("host"), MemoryBackendOptions::Kind::kHost);
  EXPECT_EQ(*ParseMemoryBackendKind("cuda"), MemoryBackendOptions::Kind::kCuda);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseMemoryBackendKind("tpu").status()));
  MemoryBackendOptions options;
  options.kind = MemoryBackendOptions::Kind::kCuda;
  absl::StatusOr<std::unique_ptr<MemoryBackend>> cuda = CreateMemoryBackend(options);
  // Either a working backend (GPU host) or a clean Unavailable (no driver, no device, no CUDA).
  if (!cuda.ok()) {
    EXPECT_TRUE(absl::IsUnavailable(cuda.status())) << cuda.status();
  } else {
    EXPECT_EQ((*cuda)->name(), "cuda");
    EXPECT_GT((*cuda)->page_bytes(), 0u);
  }
}

}  // namespace
}  // namespace vamp
