// Prefix caching for models with recurrent state (SchedulerConfig::recurrent_state_blocks > 0):
// the scheduler captures a request's state at its prompt's last block boundary and at the last
// one its output reaches, keeps those snapshots in the pool with their anchor blocks, grants hits
// only up to a block that anchors one (the fake agent, keeping snapshots as the runner does,
// refuses any other), and lets them go with their blocks.
#include <memory>
#include <vector>

#include "controller/core/scheduler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/core/scheduler_test_util.h"

namespace vamp {
namespace {

using testing::DefaultSample;
using testing::Harness;
using testing::Iota;
using testing::Spec;

constexpr int32_t kSnapshotBlocks = 2;

SchedulerConfig RecurrentConfig(int32_t num_blocks = 64) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = num_blocks;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 16;
  c.max_model_len = 48;
  c.recurrent_state_blocks = kSnapshotBlocks;
  return c;
}

std::unique_ptr<Harness> RecurrentHarness(const SchedulerConfig& c) {
  auto h = std::make_unique<Harness>(c);
  h->agent().set_recurrent(true);
  return h;
}

// Request `id`'s tokens once it has `n`: its prompt, then the fake agent's samples.
std::vector<TokenId> TokensOf(RequestId id, const std::vector<TokenId>& prompt, int32_t n) {
  std::vector<TokenId> t = prompt;
  while (static_cast<int32_t>(t.size()) < n) {
    t.push_back(DefaultSample(id, static_cast<int32_t>(t.size())));
  }
  return t;
}

// The plan's one new request.
const NewRequestPlan& OnlyNew(const Harness::StepResult& r) {
  EXPECT_EQ(r.plan.new_requests.size(), 1u);
  return r.plan.new_requests.front();
}

// Turn 1 (10 prompt tokens, 7 outputs) leaves snapshots after 8 tokens (its prompt's last block
// boundary) and 16 (the last one its output reached). A second turn continues from 16; the same
// prompt hits 8; a prefix that goes beyond the snapshot at 8 but not to 16 hits 8.
TEST(SchedulerSnapshotTest, HitsEndAtTheSnapshotsATurnLeaves) {
  auto h = RecurrentHarness(RecurrentConfig());
  Scheduler& s = h->scheduler();
  const std::vector<TokenId> prompt = Iota(10);
  ASSERT_TRUE(s.AddRequest(Spec(1, prompt, 7)).ok());
  auto first = h->Step();
  ASSERT_EQ(first.plan.new_requests.size(), 1u);
  EXPECT_EQ(first.plan.new_requests[0].capture_state_tokens, 8);
  EXPECT_EQ(first.plan.new_requests[0].capture_state_blocks.size(), 2u);
  EXPECT_TRUE(first.plan.new_requests[0].restore_state_blocks.empty());
  h->RunToCompletion();
  EXPECT_EQ(s.pool().num_snapshots(), 2);
  EXPECT_EQ(s.pool().num_snapshot_blocks(), 2 * kSnapshotBlocks);
  EXPECT_EQ(s.Stats().num_snapshot_blocks, 2 * kSnapshotBlocks);
  EXPECT_EQ(h->agent().num_snapshots(), 2u);
  // Captures at 8, 12 and 16 (12 and 16 into the same blocks).
  EXPECT_EQ(s.counters().num_state_captures, 3);
  ASSERT_TRUE(s.CheckInvariants().ok());

  const std::vector<TokenId> turn1 = TokensOf(1, prompt, 17);
  std::vector<TokenId> turn2 = turn1;
  turn2.insert(turn2.end(), {7, 8, 9});
  ASSERT_TRUE(s.AddRequest(Spec(2, turn2, 4)).ok());
  auto second = h->Step();
  const NewRequestPlan& p2 = OnlyNew(second);
  EXPECT_EQ(p2.num_computed_tokens, 16);
  const KvBlock& anchor = s.pool().block(p2.block_ids[3]);
  ASSERT_NE(anchor.snapshot, kNoSnapshot);
  EXPECT_EQ(p2.restore_state_blocks, s.pool().snapshot(anchor.snapshot).blocks);
  EXPECT_EQ(s.pool().snapshot(anchor.snapshot).num_tokens, 16);
  h->RunToCompletion();

  ASSERT_TRUE(s.AddRequest(Spec(3, prompt, 2)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 8);
  h->RunToCompletion();
  // 14 tokens of turn 1: blocks [0, 12) are cached, but only 8 tokens have a snapshot.
  ASSERT_TRUE(
      s.AddRequest(Spec(4, std::vector<TokenId>(turn1.begin(), turn1.begin() + 14), 2)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 8);
  h->RunToCompletion();
  EXPECT_EQ(h->agent().num_restores(), 3);
  EXPECT_EQ(s.counters().prefix_cache.hit_tokens, 16 + 8 + 8);
}

TEST(SchedulerSnapshotTest, WithoutOutputSnapshotsATurnLeavesItsPromptsOnly) {
  SchedulerConfig c = RecurrentConfig();
  c.snapshot_outputs = false;
  auto h = RecurrentHarness(c);
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(10), 7)).ok());
  h->RunToCompletion();
  EXPECT_EQ(s.pool().num_snapshots(), 1);
  EXPECT_EQ(s.counters().num_state_captures, 1);
  std::vector<TokenId> turn2 = TokensOf(1, Iota(10), 17);
  turn2.push_back(5);
  ASSERT_TRUE(s.AddRequest(Spec(2, turn2, 2)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 8);
  h->RunToCompletion();
}

// Evicting a block that anchors a snapshot frees the snapshot's blocks too; the eviction counts
// them, and the hits it leaves end at the snapshots that remain.
TEST(SchedulerSnapshotTest, SnapshotsAreEvictedWithTheirBlocks) {
  auto h = RecurrentHarness(RecurrentConfig(16));
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(10), 7)).ok());
  h->RunToCompletion();
  // Its 4 blocks are cached, the second and the fourth anchoring snapshots of 2 blocks.
  EXPECT_EQ(s.pool().num_free_cached(), 4 + 2 * kSnapshotBlocks);
  EXPECT_EQ(s.pool().num_free_uncached(), 16 - 8);
  // 40 other tokens: 10 blocks and a snapshot of 2 (after 36); 8 are free. The arbiter evicts
  // the oldest cached block, the anchor of the snapshot after 16 tokens (3 blocks freed), and
  // the capture evicts one more (turn 1's third block).
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(40, 100), 1)).ok());
  auto r = h->Step();
  EXPECT_EQ(OnlyNew(r).capture_state_tokens, 36);
  EXPECT_EQ(s.counters().num_evicted_blocks, 3 + 1);
  EXPECT_EQ(s.pool().num_snapshots(), 2);  // after 8 (request 1's) and 36 (request 2's)
  std::vector<TokenId> turn2 = TokensOf(1, Iota(10), 17);
  turn2.push_back(5);
  ASSERT_TRUE(s.AddRequest(Spec(3, turn2, 2)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 8);
  h->RunToCompletion();
  EXPECT_TRUE(s.pool().CheckInvariants().ok());
}

// A capture is cache content: when its blocks are not there (free or evictable) it is skipped,
// never paid for with a preemption or an offload.
TEST(SchedulerSnapshotTest, CapturesWithoutBlocksAreSkipped) {
  auto h = RecurrentHarness(RecurrentConfig(12));
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(47), 1)).ok());  // 12 blocks: the whole pool
  auto r = h->Step();
  EXPECT_EQ(OnlyNew(r).capture_state_tokens, 0);
  EXPECT_EQ(s.counters().num_state_captures_skipped, 1);
  EXPECT_EQ(s.counters().num_preemptions, 0);
  h->RunToCompletion();
  EXPECT_EQ(s.pool().num_snapshots(), 0);
  // Without a snapshot, the same prompt is computed afresh.
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(40), 1)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 0);
}

// A refused step captured nothing: the snapshot it took goes back, and the plan made again
// captures anew.
TEST(SchedulerSnapshotTest, ARefusedStepGivesBackTheSnapshotItTook) {
  auto h = RecurrentHarness(RecurrentConfig());
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(10), 2)).ok());
  absl::StatusOr<StepPlan> refused = s.Schedule();
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->new_requests[0].capture_state_tokens, 8);
  EXPECT_EQ(s.pool().num_snapshot_blocks(), kSnapshotBlocks);
  ASSERT_TRUE(s.RevertStep(0).ok());
  EXPECT_EQ(s.pool().num_snapshot_blocks(), 0);
  EXPECT_EQ(s.counters().num_state_captures, 0);
  ASSERT_TRUE(s.CheckInvariants().ok());
  EXPECT_EQ(OnlyNew(h->Step()).capture_state_tokens, 8);
  h->RunToCompletion();
  EXPECT_EQ(s.pool().num_snapshots(), 1);
}

// An abort while the step capturing a request's state is in flight leaves that snapshot out of
// the cache (what its blocks hold is not certain); one between steps keeps the latest capture.
TEST(SchedulerSnapshotTest, AbortKeepsOnlyCompletedCaptures) {
  auto h = RecurrentHarness(RecurrentConfig());
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(10), 20)).ok());
  absl::StatusOr<StepPlan> plan = s.Schedule();
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->new_requests[0].capture_state_tokens, 8);
  ASSERT_TRUE(s.AbortRequest(1).ok());
  EXPECT_EQ(s.pool().num_snapshot_blocks(), 0);
  absl::StatusOr<StepOutput> out = h->agent().Execute(*plan, 4);
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE(s.UpdateFromOutput(*out).ok());
  ASSERT_TRUE(s.CheckInvariants().ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(10), 20)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 0);
  // Request 2 decodes past 12 (captured there), then is aborted between steps.
  while (s.FindRequest(2)->num_computed_tokens() < 14) h->Step();
  ASSERT_TRUE(s.AbortRequest(2).ok());
  EXPECT_EQ(s.pool().num_snapshots(), 2);  // after 8 and 12
  ASSERT_TRUE(s.AddRequest(Spec(3, TokensOf(2, Iota(10), 15), 2)).ok());
  EXPECT_EQ(OnlyNew(h->Step()).num_computed_tokens, 12);
  h->RunToCompletion();
}

// A preempted request's snapshots stay behind with its cached blocks, and it resumes from the
// deepest one left rather than from token 0. Here: both requests fill the pool by their 16th
// token (the captures there find no blocks), request 2 is preempted, request 1 finishes, and
// request 2 resumes after its prompt's snapshot (8 tokens).
TEST(SchedulerSnapshotTest, APreemptedRequestResumesFromItsSnapshot) {
  SchedulerConfig c = RecurrentConfig(12);
  c.max_model_len = 32;
  auto h = RecurrentHarness(c);
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(12), 6)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(12, 500), 20)).ok());
  int resumed_with_hit = 0;
  for (int step = 0; step < 200 && s.has_unfinished_requests(); ++step) {
    auto r = h->Step();
    for (const CachedRequestPlan& p : r.plan.cached_requests) {
      if (!p.resumed) continue;
      EXPECT_EQ(p.request_id, 2u);
      EXPECT_EQ(p.num_computed_tokens, 8);
      EXPECT_EQ(p.restore_state_blocks.size(), 2u);
      ++resumed_with_hit;
    }
  }
  EXPECT_EQ(s.counters().num_preemptions, 1);
  EXPECT_EQ(resumed_with_hit, 1);
  EXPECT_EQ(s.counters().prefix_cache.preempted_hit_tokens, 8);
  EXPECT_FALSE(s.has_unfinished_requests());
}

// A shrink (a restore's) waits for the blocks in its tail; a snapshot a running request holds
// there moves out at the request's next capture instead of holding the shrink up until it ends.
TEST(SchedulerSnapshotTest, AHeldSnapshotLeavesAShrinkingTailAtItsNextCapture) {
  auto h = RecurrentHarness(RecurrentConfig(24));
  Scheduler& s = h->scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(40), 1)).ok());       // blocks 0..9, snapshot 10, 11
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(10, 500), 20)).ok());  // 12..14, snapshot 15, 16
  for (int i = 0; i < 3; ++i) h->Step();  // request 2 captures after 12 tokens into 17, 18
  const Request& r = *s.FindRequest(2);
  ASSERT_NE(r.snapshot(), kNoSnapshot);
  EXPECT_EQ(s.pool().snapshot(r.snapshot()).blocks, (std::vector<BlockId>{17, 18}));
  ASSERT_TRUE(s.BeginShrinkPool(7).ok());
  EXPECT_EQ(s.pool().shrink_outstanding(), 2);
  while (s.FindRequest(2)->num_computed_tokens() < 16) h->Step();  // the capture after 16
  EXPECT_EQ(s.pool().shrink_outstanding(), 0);
  ASSERT_TRUE(s.CommitShrinkPool().ok());
  EXPECT_EQ(s.pool().num_blocks(), 17);
  h->RunToCompletion();
  EXPECT_EQ(s.counters().num_finished, 2);
}

// Attention-only models (recurrent_state_blocks 0) capture nothing and hit as before.
TEST(SchedulerSnapshotTest, AttentionOnlyModelsTakeNoSnapshots) {
  SchedulerConfig c = RecurrentConfig();
  c.recurrent_state_blocks = 0;
  Harness h(c);
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(10), 7)).ok());
  EXPECT_EQ(OnlyNew(h.Step()).capture_state_tokens, 0);
  h.RunToCompletion();
  EXPECT_EQ(s.pool().num_snapshots(), 0);
  ASSERT_TRUE(s.AddRequest(Spec(2, TokensOf(1, Iota(10), 15), 2)).ok());
  const NewRequestPlan& p = OnlyNew(h.Step());
  EXPECT_EQ(p.num_computed_tokens, 12);
  EXPECT_TRUE(p.restore_state_blocks.empty());
}

}  // namespace
}  // namespace vamp
