// The staging schedule (plan), its CPU executor, and expert pointer tables over a real
// ExpertStore with offloaded experts.
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/memory/geometry.h"
#include "engine/memory/host_backend.h"
#include "engine/memory/page_pool.h"
#include "engine/staging/expert_store_weights.h"
#include "engine/staging/host_staging_engine.h"
#include "engine/staging/staging_plan.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

TEST(StagingPlanTest, AlternatesBuffersAndWaitsForThePreviousReader) {
  auto plan = PlanStagingPass({1, 2, 4, 5, 7}, 2);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 5u);
  const int layers[] = {1, 2, 4, 5, 7}, buffers[] = {0, 1, 0, 1, 0}, after[] = {-1, -1, 0, 1, 2};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*plan)[i].layer, layers[i]);
    EXPECT_EQ((*plan)[i].buffer, buffers[i]);
    EXPECT_EQ((*plan)[i].after_release_of, after[i]);
  }
  auto single = PlanStagingPass({3, 6, 9}, 1);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)[2].after_release_of, 1);
  EXPECT_EQ((*single)[2].buffer, 0);
  EXPECT_TRUE(PlanStagingPass({}, 2)->empty());
  EXPECT_FALSE(PlanStagingPass({2, 1}, 2).ok());
  EXPECT_FALSE(PlanStagingPass({1, 1}, 2).ok());
  EXPECT_FALSE(PlanStagingPass({1}, 0).ok());
}

// Index of the first event of `kind` for job `index`, or -1.
int Find(const std::vector<StagingEvent>& events, StagingEvent::Kind kind, int index) {
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == kind && events[i].index == index) return static_cast<int>(i);
  }
  return -1;
}

TEST(HostStagingEngineTest, CopiesAheadButNeverIntoABufferBeingRead) {
  constexpr int kJobs = 5;
  constexpr size_t kBytes = 64 << 10;
  std::vector<std::vector<uint8_t>> src(kJobs, std::vector<uint8_t>(kBytes));
  for (int j = 0; j < kJobs; ++j) std::fill(src[j].begin(), src[j].end(), uint8_t(j + 1));
  std::vector<std::vector<uint8_t>> buffers(2, std::vector<uint8_t>(kBytes));
  auto plan = PlanStagingPass({0, 1, 2, 3, 4}, 2);
  ASSERT_TRUE(plan.ok());
  HostStagingEngine engine(/*record_events=*/true);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<HostStagingEngine::Job> jobs;
    for (int j = 0; j < kJobs; ++j) {
      jobs.push_back({(*plan)[j], buffers[(*plan)[j].buffer].data(), src[j].data(), kBytes});
    }
    ASSERT_TRUE(engine.BeginPass(jobs).ok());
    for (int j = 0; j < kJobs; ++j) {
      ASSERT_TRUE(engine.WaitCopied(j).ok());
      const std::vector<uint8_t>& buf = buffers[(*plan)[j].buffer];
      EXPECT_EQ(buf, src[j]) << "job " << j;
      // "Compute" while holding the buffer: the worker copies ahead into the other buffer but
      // must leave this one alone.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(buf, src[j]) << "job " << j << " was overwritten while read";
      ASSERT_TRUE(engine.Release(j).ok());
    }
    ASSERT_TRUE(engine.EndPass().ok());
    const auto events = engine.events();
    ASSERT_EQ(events.size(), 3u * kJobs);
    for (int j = 0; j < kJobs; ++j) {
      const int start = Find(events, StagingEvent::Kind::kCopyStart, j);
      ASSERT_GE(start, 0);
      if (j >= 2) {
        EXPECT_GT(start, Find(events, StagingEvent::Kind::kRelease, j - 2)) << "job " << j;
      }
      if (j + 1 < kJobs) {
        // Overlap: the next layer's copy finished while this layer was still being read.
        EXPECT_LT(Find(events, StagingEvent::Kind::kCopyDone, j + 1),
                  Find(events, StagingEvent::Kind::kRelease, j))
            << "job " << j;
      }
    }
  }
  const StagingStats stats = engine.stats();
  EXPECT_EQ(stats.passes, 2);
  EXPECT_EQ(stats.copies, 2 * kJobs);
  EXPECT_EQ(stats.bytes, 2u * kJobs * kBytes);
}

TEST(HostStagingEngineTest, EndingAPassEarlyCancelsPendingCopies) {
  std::vector<uint8_t> src(1024, 7), buffer(1024, 0);
  auto plan = PlanStagingPass({0, 1, 2}, 1);
  std::vector<HostStagingEngine::Job> jobs;
  for (const StagingCopy& c : *plan) jobs.push_back({c, buffer.data(), src.data(), src.size()});
  HostStagingEngine engine(true);
  ASSERT_TRUE(engine.BeginPass(jobs).ok());
  EXPECT_EQ(engine.BeginPass(jobs).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine.WaitCopied(0).ok());
  ASSERT_TRUE(engine.EndPass().ok());  // job 0 never released: jobs 1 and 2 must not run
  EXPECT_EQ(Find(engine.events(), StagingEvent::Kind::kCopyStart, 1), -1);
  EXPECT_EQ(engine.stats().copies, 1);
  EXPECT_FALSE(engine.WaitCopied(0).ok()) << "no pass active";
  EXPECT_FALSE(engine.EndPass().ok());
  // The engine is reusable.
  ASSERT_TRUE(engine.BeginPass(jobs).ok());
  for (int j = 0; j < 3; ++j) {
    ASSERT_TRUE(engine.WaitCopied(j).ok());
    ASSERT_TRUE(engine.Release(j).ok());
  }
  EXPECT_FALSE(engine.Release(3).ok());
  ASSERT_TRUE(engine.EndPass().ok());
  EXPECT_EQ(engine.stats().copies, 4);
  // A job may only wait for an earlier one.
  jobs[1].copy.after_release_of = 1;
  EXPECT_EQ(engine.BeginPass(jobs).code(), absl::StatusCode::kInvalidArgument);
}

// The tiny model's expert shape (float32): hidden 64, intermediate 24, 16 experts, 3 MoE layers.
ModelShape TinyShape() {
  ModelShape s;
  s.name = "tiny";
  s.hidden_size = 64;
  s.moe_intermediate_size = 24;
  s.num_experts = 16;
  s.num_experts_per_token = 4;
  s.num_layers = 3;
  s.moe_layers = {0, 1, 2};
  s.attention_layers = {0, 1, 2};
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 16;
  s.dtype_bytes = 4;
  s.vocab_size = 256;
  return s;
}

float Pattern(int layer, int expert, int64_t i) {
  return static_cast<float>(layer * 100000 + expert * 1000) + static_cast<float>(i % 997);
}

// Two buffers on two eligible layers are reserved at start-up; one buffer is carved out of the
// offloaded pages. The tables must reach every expert either way.
class ExpertStoreWeightsTest : public ::testing::TestWithParam<int> {};

TEST_P(ExpertStoreWeightsTest, PointerTablesReachEveryExpertAtEveryBoundary) {
  constexpr uint64_t kPage = 4096;
  OffloadConfig offload;
  offload.max_offload_ratio = 0.5;
  offload.staging_buffers = GetParam();
  auto geometry = ComputeExpertGeometry(TinyShape(), 1, kPage, offload);
  ASSERT_TRUE(geometry.ok()) << geometry.status();
  ASSERT_EQ(geometry->max_groups, 4);
  ASSERT_EQ(geometry->staging_carved, GetParam() == 1);
  auto backend = HostMemoryBackend::Create(kPage);
  ASSERT_TRUE(backend.ok());
  auto pool =
      PagePool::Create(backend->get(), geometry->total_pages() + geometry->reserved_staging_pages());
  ASSERT_TRUE(pool.ok());
  auto store = ExpertStore::Create(pool->get(), *geometry);
  ASSERT_TRUE(store.ok()) << store.status();
  const ExpertShardLayout layout{64, 24};
  EXPECT_FALSE(ExpertStoreWeights::Create(store->get(), ExpertShardLayout{64, 12}).ok());
  auto weights = ExpertStoreWeights::Create(store->get(), layout);
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<float> shard(layout.Elements());
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 16; ++e) {
      for (int64_t i = 0; i < layout.Elements(); ++i) shard[i] = Pattern(l, e, i);
      ASSERT_TRUE((*weights)->StoreExpertShard(l, e, shard).ok());
    }
  }
  EXPECT_FALSE((*weights)->StoreExpertShard(0, 0, absl::MakeSpan(shard).subspan(1)).ok());
  ASSERT_TRUE((*store)->FinalizeLoad().ok());
  CallbackFence fence([] { return absl::OkStatus(); });

  for (int offloaded = 0; offloaded <= 4; ++offloaded) {
    if (offloaded > 0) {
      auto pages = (*store)->Offload(1, fence);
      ASSERT_TRUE(pages.ok()) << pages.status();
      ASSERT_TRUE((*pool)->Free(*pages).ok());  // unmapped: reading them would fault
    }
    ASSERT_TRUE((*weights)->BeginPass().ok());
    for (int l = 0; l < 3; ++l) {
      auto table = (*weights)->AcquireLayer(l);
      ASSERT_TRUE(table.ok()) << table.status();
      for (int e = 0; e < 16; ++e) {
        const auto* w13 = static_cast<const float*>(table->w13[e]);
        const auto* w2 = static_cast<const float*>(table->w2[e]);
        ASSERT_EQ(w13[0], Pattern(l, e, 0)) << "layer " << l << " expert " << e;
        ASSERT_EQ(w13[layout.W13Elements() - 1], Pattern(l, e, layout.W13Elements() - 1));
        ASSERT_EQ(w2[0], Pattern(l, e, layout.W13Elements()));
        ASSERT_EQ(w2[layout.W2Elements() - 1], Pattern(l, e, layout.Elements() - 1));
      }
      ASSERT_TRUE((*weights)->ReleaseLayer(l).ok());
    }
    ASSERT_TRUE((*weights)->EndPass().ok());
    const std::vector<int> staged = offloaded == 0 ? std::vector<int>{} : std::vector<int>{1, 2};
    EXPECT_EQ((*weights)->staged_layers(), staged);
  }
  EXPECT_EQ((*weights)->engine().stats().copies, 8);
  EXPECT_FALSE((*weights)->AcquireLayer(7).ok());
}

INSTANTIATE_TEST_SUITE_P(StagingBuffers, ExpertStoreWeightsTest, ::testing::Values(2, 1));

}  // namespace
}  // namespace vamp
