// Invariant 1 of shared/DESIGN.md on the CPU engine: with the experts in the ExpertStore (host
// memory backend) and the KV cache in the KvRegion, every residency boundary from fully resident
// to the cap (and back, by restoring) gives bit-identical logits to all-resident host buffers,
// while offloaded experts are staged through the double buffer and the KV pool grows into the
// freed pages.
#include <cstring>

#include "engine/rank/rank.h"
#include "gtest/gtest.h"
#include "tests/engine/rank/tiny_rank.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp {
namespace {

using testing::LoadGoldens;
using testing::MakeTinyEngine;
using testing::MiniScheduler;
using testing::Range;
using testing::TinyModelDir;

constexpr uint64_t kPage = 4096;  // expert shard 18 KiB = 4.5 pages: groups of 2 experts
constexpr int64_t kKvPages = 96;  // 32 blocks of 3 pages

struct PromptsRun {
  std::vector<std::vector<int32_t>> outputs;
  std::vector<std::vector<float>> logits;
};

// The golden prompts, 8 new tokens each, prefill chunks of 7, KV blocks taken from `blocks`.
PromptsRun RunPrompts(ModelRunner& runner, RunnerRequestId first_id, std::vector<int32_t> blocks) {
  const auto g = LoadGoldens();
  MiniScheduler sched(16, std::move(blocks), 7);
  for (size_t i = 0; i < g.prompts.size(); ++i) sched.Submit(first_id + i, g.prompts[i], 8);
  sched.RunAll(runner);
  PromptsRun run;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    run.outputs.push_back(sched.request(first_id + i).outputs);
    run.logits.push_back(sched.request(first_id + i).all_logits);
  }
  // One more step applies the finished ids, so the runner forgets the requests.
  EXPECT_TRUE(runner.ExecuteStep(sched.Next()).ok());
  return run;
}

// Blocks [0, n), newest (highest) first, so requests land in pages that just moved to the KV pool.
std::vector<int32_t> NewestFirst(int64_t n) {
  std::vector<int32_t> blocks;
  for (int64_t b = n - 1; b >= 0; --b) blocks.push_back(static_cast<int32_t>(b));
  return blocks;
}

TEST(ResidencyTest, EveryBoundaryGivesBitIdenticalLogits) {
  // Reference: all experts resident in plain host buffers.
  auto reference = MakeTinyEngine();
  ASSERT_NE(reference, nullptr);
  const PromptsRun want = RunPrompts(*reference->runner, 0, Range(0, 256));

  // The tiny model (float32) in 4 KiB pages: a baseline KV pool of exactly kKvPages pages and a
  // cap of 12 of 16 experts (6 groups) in layers 1 and 2.
  StagingOptions staging;
  staging.record_events = true;
  auto rank = testing::BuildHostRank(TinyModelDir(), kPage, kKvPages, /*ratio=*/0.75, staging);
  ASSERT_TRUE(rank.ok()) << rank.status();
  const MemoryPlan& plan = (*rank)->plan;
  ASSERT_EQ(plan.experts.group_experts, 2);
  ASSERT_EQ(plan.experts.max_groups, 6);
  ASSERT_EQ(plan.kv_baseline_pages, kKvPages);
  AgentMemory& memory = (*rank)->memory;
  ExpertStoreWeights& experts = static_cast<HostRankExperts&>(*(*rank)->experts).store_weights();
  ModelRunner& runner = *(*rank)->runner;
  const int64_t baseline_blocks = runner.kv_cache().num_blocks;
  EXPECT_EQ(baseline_blocks, kKvPages / 3);

  RunnerRequestId next_id = 100;
  auto check = [&](const std::string& where) {
    const PromptsRun got = RunPrompts(runner, next_id, NewestFirst(runner.kv_cache().num_blocks));
    next_id += 10;
    for (size_t i = 0; i < want.outputs.size(); ++i) {
      EXPECT_EQ(got.outputs[i], want.outputs[i]) << where << " prompt " << i;
      ASSERT_EQ(got.logits[i].size(), want.logits[i].size());
      EXPECT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                               want.logits[i].size() * sizeof(float)))
          << where << " prompt " << i;
    }
  };
  auto refresh_kv = [&] { ASSERT_TRUE((*rank)->RefreshKv().ok()); };

  check("fully resident");
  EXPECT_TRUE(experts.staged_layers().empty());
  EXPECT_EQ(experts.engine().stats().copies, 0);
  for (int groups = 1; groups <= 6; ++groups) {
    auto r = memory.page_remapper->Offload(1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(memory.experts->boundary(), 16 - 2 * groups);
    refresh_kv();
    EXPECT_GT(runner.kv_cache().num_blocks, baseline_blocks);
    check("boundary " + std::to_string(16 - 2 * groups));
    EXPECT_EQ(experts.staged_layers(), (std::vector<int>{1, 2}));
    // The last pass staged both eligible layers, each after nothing else held its buffer.
    const auto events = experts.engine().events();
    ASSERT_EQ(events.size(), 6u);
  }
  EXPECT_FALSE(memory.page_remapper->Offload(1).ok()) << "past the cap";
  const StagingStats stats = experts.engine().stats();
  EXPECT_GT(stats.copies, 0);
  EXPECT_GT(stats.bytes, 0u);

  // And back: restore group by group (the runner holds no request between checks).
  for (int groups = 5; groups >= 0; --groups) {
    auto r = memory.page_remapper->Restore(1, runner.kv_cache().num_blocks);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(memory.experts->boundary(), 16 - 2 * groups);
    refresh_kv();
    check("restored to boundary " + std::to_string(16 - 2 * groups));
  }
  EXPECT_EQ(runner.kv_cache().num_blocks, baseline_blocks);
  EXPECT_TRUE(memory.page_remapper->Audit().ok());
}

}  // namespace
}  // namespace vamp
