#include "controller/core/scheduler.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/core/scheduler_test_util.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;
using testing::Harness;
using testing::Iota;
using ::testing::IsEmpty;
using testing::Spec;

SchedulerConfig SmallConfig() {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 8;
  c.max_num_seqs = 16;
  c.max_model_len = 64;
  return c;
}

TEST(SchedulerTest, NewRequestOnceThenDiffsUntilFinished) {
  Harness h(SmallConfig());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), /*max_tokens=*/3)).ok());

  auto s1 = h.Step();  // prefill chunk 1: 8 of 10 tokens
  ASSERT_EQ(s1.plan.new_requests.size(), 1u);
  const NewRequestPlan& n = s1.plan.new_requests[0];
  EXPECT_EQ(n.request_id, 1u);
  EXPECT_EQ(n.prompt_token_ids, Iota(10));
  EXPECT_EQ(n.num_computed_tokens, 0);
  EXPECT_EQ(n.num_scheduled_tokens, 8);
  EXPECT_THAT(n.block_ids, ElementsAre(0, 1));
  EXPECT_EQ(n.sampling_params.max_tokens, 3);
  EXPECT_THAT(s1.outputs, IsEmpty());  // no sample mid-prefill

  auto s2 = h.Step();  // the last 2 prompt tokens, then the first sample
  EXPECT_THAT(s2.plan.new_requests, IsEmpty());
  ASSERT_EQ(s2.plan.cached_requests.size(), 1u);
  EXPECT_FALSE(s2.plan.cached_requests[0].resumed);
  EXPECT_EQ(s2.plan.cached_requests[0].num_computed_tokens, 8);
  EXPECT_EQ(s2.plan.cached_requests[0].num_scheduled_tokens, 2);
  EXPECT_THAT(s2.plan.cached_requests[0].new_block_ids, ElementsAre(2));
  ASSERT_EQ(s2.outputs.size(), 1u);
  EXPECT_EQ(s2.outputs[0].new_token_ids.size(), 1u);
  EXPECT_EQ(s2.outputs[0].finish_reason, FinishReason::kNone);

  auto s3 = h.Step();  // decode: 11 tokens fit the 3 blocks
  EXPECT_EQ(s3.plan.cached_requests[0].num_computed_tokens, 10);
  EXPECT_EQ(s3.plan.cached_requests[0].num_scheduled_tokens, 1);
  EXPECT_THAT(s3.plan.cached_requests[0].new_block_ids, IsEmpty());

  auto s4 = h.Step();  // third output: max_tokens
  ASSERT_EQ(s4.outputs.size(), 1u);
  EXPECT_EQ(s4.outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(h.scheduler().has_unfinished_requests());
  EXPECT_EQ(h.scheduler().FindRequest(1), nullptr);

  auto s5 = h.Step();
  EXPECT_TRUE(s5.plan.empty());
  EXPECT_THAT(s5.plan.finished_ids, ElementsAre(1));
  // 12 tokens were computed (the last sample never is): 3 full blocks stay cached, free.
  const SchedulerStats stats = h.scheduler().Stats();
  EXPECT_EQ(stats.num_free_cached_blocks, 3);
  EXPECT_EQ(stats.num_used_blocks, 0);
  EXPECT_EQ(stats.counters.num_finished, 1);
  EXPECT_EQ(stats.counters.num_steps, 4);
  EXPECT_TRUE(h.agent().requests().empty());
}

TEST(SchedulerTest, LaterRequestReusesTheCachedPrefix) {
  Harness h(SmallConfig());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), 2)).ok());
  h.RunToCompletion();
  std::vector<TokenId> prompt = Iota(8);
  prompt.push_back(77);
  prompt.push_back(78);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, prompt, 1)).ok());
  auto s = h.Step();
  ASSERT_EQ(s.plan.new_requests.size(), 1u);
  EXPECT_EQ(s.plan.new_requests[0].num_computed_tokens, 8);
  EXPECT_EQ(s.plan.new_requests[0].num_scheduled_tokens, 2);
  // Blocks 0 and 1 are shared; request 1's partial block 2 was freed to the front of the queue
  // (uncached), so it is the first one reused.
  EXPECT_THAT(s.plan.new_requests[0].block_ids, ElementsAre(0, 1, 2));
  const PrefixCacheStats pc = h.scheduler().counters().prefix_cache;
  EXPECT_EQ(pc.requests, 2);
  EXPECT_EQ(pc.query_tokens, 20);
  EXPECT_EQ(pc.hit_tokens, 8);
  EXPECT_DOUBLE_EQ(pc.HitRate(), 0.4);
}

TEST(SchedulerTest, FullyCachedPromptStillComputesItsLastToken) {
  Harness h(SmallConfig());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(8), 1)).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(8), 1)).ok());
  auto s = h.Step();
  ASSERT_EQ(s.plan.new_requests.size(), 1u);
  EXPECT_EQ(s.plan.new_requests[0].num_computed_tokens, 4);
  EXPECT_EQ(s.plan.new_requests[0].num_scheduled_tokens, 4);
  EXPECT_EQ(s.outputs.size(), 1u);
}

TEST(SchedulerTest, ARequestThatSkipsCacheReadsComputesItsWholePromptAndCachesItForOthers) {
  Harness h(SmallConfig());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), 2)).ok());
  h.RunToCompletion();
  // Its prefix is cached, but it needs logits at every prompt position (prompt logprobs).
  RequestSpec skip = Spec(2, Iota(10), 1);
  skip.skip_prefix_cache_reads = true;
  ASSERT_TRUE(h.scheduler().AddRequest(std::move(skip)).ok());
  auto s = h.Step();
  ASSERT_EQ(s.plan.new_requests.size(), 1u);
  EXPECT_EQ(s.plan.new_requests[0].num_computed_tokens, 0);
  h.RunToCompletion();
  // Not a lookup: the hit rate counts request 1 only.
  PrefixCacheStats pc = h.scheduler().counters().prefix_cache;
  EXPECT_EQ(pc.requests, 1);
  EXPECT_EQ(pc.query_tokens, 10);
  // What it computed is cached under the same hashes: a plain request finds it.
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(3, Iota(10), 1)).ok());
  s = h.Step();
  EXPECT_EQ(s.plan.new_requests[0].num_computed_tokens, 8);
}

TEST(SchedulerTest, PrefixCachingOffNeverHits) {
  SchedulerConfig c = SmallConfig();
  c.enable_prefix_caching = false;
  Harness h(c);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), 2)).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(10), 2)).ok());
  auto s = h.Step();
  EXPECT_EQ(s.plan.new_requests[0].num_computed_tokens, 0);
  EXPECT_EQ(h.scheduler().Stats().num_cached_blocks, 0);
  EXPECT_EQ(h.scheduler().counters().prefix_cache.query_tokens, 0);
}

TEST(SchedulerTest, StepProtocolIsEnforced) {
  Harness h(SmallConfig());
  Scheduler& s = h.scheduler();
  EXPECT_EQ(s.UpdateFromOutput(StepOutput{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(3), 5)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(3, 50), 5)).ok());
  auto plan = s.Schedule();
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(s.step_in_flight());
  EXPECT_EQ(s.Schedule().status().code(), absl::StatusCode::kFailedPrecondition);

  StepOutput wrong_step{plan->step + 1, {{1, {5}}, {2, {6}}}};
  EXPECT_EQ(s.UpdateFromOutput(wrong_step).status().code(), absl::StatusCode::kFailedPrecondition);
  StepOutput missing{plan->step, {{1, {5}}}};
  EXPECT_EQ(s.UpdateFromOutput(missing).status().code(), absl::StatusCode::kInvalidArgument);
  StepOutput stranger{plan->step, {{1, {5}}, {2, {6}}, {3, {7}}}};
  EXPECT_EQ(s.UpdateFromOutput(stranger).status().code(), absl::StatusCode::kInvalidArgument);
  StepOutput twice{plan->step, {{1, {5}}, {1, {5}}, {2, {6}}}};
  EXPECT_EQ(s.UpdateFromOutput(twice).status().code(), absl::StatusCode::kInvalidArgument);
  StepOutput negative{plan->step, {{1, {-5}}, {2, {6}}}};
  EXPECT_EQ(s.UpdateFromOutput(negative).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was applied by the rejected outputs.
  EXPECT_EQ(s.FindRequest(1)->num_output_tokens(), 0);
  // Out of plan order is fine.
  StepOutput good{plan->step, {{2, {6}}, {1, {5}}}};
  auto outputs = s.UpdateFromOutput(good);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 2u);
  EXPECT_EQ((*outputs)[0].request_id, 1u);  // plan order
  EXPECT_EQ(s.FindRequest(1)->output_token_ids()[0], 5);
  EXPECT_EQ(s.FindRequest(2)->output_token_ids()[0], 6);
  EXPECT_TRUE(s.CheckInvariants().ok());
}

TEST(SchedulerTest, ArbiterIsReplacedOnlyBetweenSteps) {
  Harness h(SmallConfig());
  Scheduler& s = h.scheduler();
  EXPECT_EQ(s.ReplaceArbiter(nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(3), 5)).ok());
  auto plan = s.Schedule();
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(s.ReplaceArbiter(std::make_unique<StaticArbiter>()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.UpdateFromOutput(StepOutput{plan->step, {{1, {5}}}}).ok());
  ASSERT_TRUE(s.ReplaceArbiter(std::make_unique<StaticArbiter>()).ok());
  EXPECT_EQ(s.arbiter().name(), "static");
  EXPECT_TRUE(s.CheckInvariants().ok());
}

TEST(SchedulerTest, TokensForRequestsStillInPrefillAreIgnored) {
  Harness h(SmallConfig());
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(20), 5)).ok());
  auto plan = s.Schedule();
  ASSERT_TRUE(plan.ok());
  auto outputs = s.UpdateFromOutput(StepOutput{plan->step, {{1, {42}}}});
  ASSERT_TRUE(outputs.ok());
  EXPECT_THAT(*outputs, IsEmpty());
  EXPECT_EQ(s.FindRequest(1)->num_output_tokens(), 0);
}

TEST(SchedulerTest, AddRequestValidatesInput) {
  Harness h(SmallConfig());
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(3), 5)).ok());
  EXPECT_EQ(s.AddRequest(Spec(1, Iota(3), 5)).code(), absl::StatusCode::kAlreadyExists);
  absl::Status empty = s.AddRequest(Spec(2, {}, 5));
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("prompt_token_ids"), absl::string_view::npos);
  absl::Status too_long = s.AddRequest(Spec(3, Iota(64), 5));
  EXPECT_NE(too_long.message().find("max_model_len"), absl::string_view::npos);
  EXPECT_FALSE(s.AddRequest(Spec(4, {1, -2}, 5)).ok());
  absl::Status bad_params = s.AddRequest(Spec(5, Iota(3), 0));
  EXPECT_NE(bad_params.message().find("sampling_params.max_tokens"), absl::string_view::npos);
  EXPECT_EQ(s.num_waiting(), 1);
}

// The same requests with their prompt hashes handed over (as the serving engine's Submit does)
// and without (hashed by the scheduler as far as it needs): identical plans, outputs and cache.
TEST(SchedulerTest, HandedOverPromptHashesChangeNothing) {
  auto run = [](bool hand_over) {
    const SchedulerConfig config = SmallConfig();
    Harness h(config);
    std::string log;
    const std::vector<std::vector<TokenId>> prompts = {Iota(13), Iota(17), Iota(9, 50), Iota(16)};
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec spec = Spec(static_cast<RequestId>(i + 1), prompts[i], 3);
      spec.cache_salt = i == 3 ? "other-tenant" : "";
      if (hand_over) {
        spec.prompt_block_hashes =
            Scheduler::HashPromptBlocks(config, spec.prompt_token_ids, spec.cache_salt);
        EXPECT_EQ(spec.prompt_block_hashes.size(), prompts[i].size() / 4);
      }
      EXPECT_TRUE(h.scheduler().AddRequest(std::move(spec)).ok());
      // One step between arrivals, so that later prompts hit what earlier ones cached.
      auto step = h.Step();
      absl::StrAppend(&log, testing::PlanSummary(step.plan), "\n");
    }
    while (h.scheduler().has_unfinished_requests()) {
      absl::StrAppend(&log, testing::PlanSummary(h.Step().plan), "\n");
    }
    const PrefixCacheStats pc = h.scheduler().counters().prefix_cache;
    absl::StrAppend(&log, "hit ", pc.hit_tokens, " of ", pc.query_tokens, " cached ",
                    h.scheduler().Stats().num_cached_blocks);
    return std::make_pair(log, pc.hit_tokens);
  };
  const auto [lazy, lazy_hits] = run(false);
  EXPECT_EQ(run(true).first, lazy);
  EXPECT_GT(lazy_hits, 0) << lazy;  // the comparison covers prefix hits
}

TEST(SchedulerTest, HandedOverPromptHashesMustBeThePrompts) {
  const SchedulerConfig config = SmallConfig();
  Harness h(config);
  Scheduler& s = h.scheduler();
  const std::vector<TokenId> prompt = Iota(13);
  auto spec_with = [&](RequestId id, std::vector<BlockHash> hashes) {
    RequestSpec spec = Spec(id, prompt, 2);
    spec.cache_salt = std::string(1, 'a');  // (GCC 12 -Wrestrict false positive on "a")
    spec.prompt_block_hashes = std::move(hashes);
    return spec;
  };
  const std::vector<BlockHash> good = Scheduler::HashPromptBlocks(config, prompt, "a");
  ASSERT_EQ(good.size(), 3u);
  auto expect_rejected = [&](RequestSpec spec) {
    const absl::Status status = s.AddRequest(std::move(spec));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("prompt_block_hashes"), absl::string_view::npos) << status;
  };
  // Too few (a prefix of the chain), another salt, another key, another block size, a prompt
  // that differs in its last block.
  expect_rejected(spec_with(1, {good.begin(), good.end() - 1}));
  expect_rejected(spec_with(2, Scheduler::HashPromptBlocks(config, prompt, "b")));
  SchedulerConfig other_key = config;
  other_key.prefix_cache_hash_key0 ^= 1;
  expect_rejected(spec_with(3, Scheduler::HashPromptBlocks(other_key, prompt, "a")));
  SchedulerConfig other_size = config;
  other_size.block_size = 3;
  expect_rejected(spec_with(4, Scheduler::HashPromptBlocks(other_size, prompt, "a")));
  std::vector<TokenId> edited = prompt;
  edited[10] = 99;
  expect_rejected(spec_with(5, Scheduler::HashPromptBlocks(config, edited, "a")));
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_TRUE(s.AddRequest(spec_with(6, good)).ok());
  EXPECT_EQ(s.FindRequest(6)->block_hashes(), good);
  // Without prefix caching there is nothing to hash.
  SchedulerConfig no_cache = config;
  no_cache.enable_prefix_caching = false;
  EXPECT_TRUE(Scheduler::HashPromptBlocks(no_cache, prompt, "a").empty());
}

TEST(SchedulerTest, AbortWaitingRunningAndInFlightRequests) {
  Harness h(SmallConfig());
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(4), 50)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(4, 10), 50)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(3, Iota(20, 20), 50)).ok());  // waits: budget is 8
  h.Step();
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.AbortRequest(99).code(), absl::StatusCode::kNotFound);
  // Waiting and never announced: no finished id.
  ASSERT_TRUE(s.AbortRequest(3).ok());
  // Running.
  ASSERT_TRUE(s.AbortRequest(1).ok());
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_TRUE(s.CheckInvariants().ok());
  // In flight: its sample is ignored, and the id may be reused at once.
  auto plan = s.Schedule();
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->finished_ids, ElementsAre(1));
  ASSERT_TRUE(s.AbortRequest(2).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(6, 30), 50)).ok());
  auto outputs = s.UpdateFromOutput(StepOutput{plan->step, {{2, {9}}}});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_THAT(*outputs, IsEmpty());
  EXPECT_EQ(s.FindRequest(2)->num_output_tokens(), 0);
  EXPECT_EQ(s.counters().num_aborted, 3);
  EXPECT_EQ(s.Stats().num_used_blocks, 0);
  EXPECT_TRUE(s.CheckInvariants().ok());
}

TEST(SchedulerTest, StopTokenFinishesAndIsReported) {
  Harness h(SmallConfig());
  RequestSpec spec = Spec(1, Iota(4), 10);
  spec.sampling_params.stop_token_ids = {7};
  ASSERT_TRUE(h.scheduler().AddRequest(spec).ok());
  h.set_sampler([](RequestId, int32_t pos) { return pos == 6 ? 7 : 3; });
  std::vector<RequestOutput> last;
  for (int i = 0; i < 5 && h.scheduler().has_unfinished_requests(); ++i) last = h.Step().outputs;
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(last[0].stop_token_id, 7);
  EXPECT_FALSE(h.scheduler().has_unfinished_requests());
}

TEST(SchedulerTest, RecomputePreemptionTakesTheNewestAndResumesIt) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 32;
  Harness h(c);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(12), 20)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(12, 500), 20)).ok());
  std::vector<TokenId> outputs_of_2;
  bool preempted = false, resumed = false;
  for (int step = 0; step < 200 && h.scheduler().has_unfinished_requests(); ++step) {
    auto r = h.Step();
    if (!r.plan.preempted_ids.empty()) {
      EXPECT_THAT(r.plan.preempted_ids, ElementsAre(2));
      preempted = true;
    }
    for (const auto& c : r.plan.cached_requests) {
      if (c.resumed) {
        EXPECT_EQ(c.request_id, 2u);
        EXPECT_TRUE(preempted);
        EXPECT_EQ(c.num_computed_tokens % 4, 0);
        resumed = true;
      }
    }
    for (const auto& o : r.outputs) {
      if (o.request_id == 2) {
        outputs_of_2.insert(outputs_of_2.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
    }
  }
  EXPECT_TRUE(preempted);
  EXPECT_TRUE(resumed);
  EXPECT_FALSE(h.scheduler().has_unfinished_requests());
  // Every output position produced exactly once, in order, across the preemption.
  ASSERT_EQ(outputs_of_2.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(outputs_of_2[i], testing::DefaultSample(2, 12 + i));
  const SchedulerCounters& k = h.scheduler().counters();
  EXPECT_GE(k.num_preemptions, 1);
  EXPECT_EQ(k.num_resumed, k.num_preemptions);
  EXPECT_GT(k.total_resume_delay_micros, 0);
  EXPECT_GE(k.num_arbiter_calls, 1);
}

TEST(SchedulerTest, MaxNumSeqsAndFcfsOrder) {
  SchedulerConfig c = SmallConfig();
  c.max_num_seqs = 2;
  c.max_num_batched_tokens = 64;
  Harness h(c);
  for (RequestId id : {5, 3, 9}) {
    ASSERT_TRUE(h.scheduler().AddRequest(Spec(id, Iota(4, id * 10), 2)).ok());
  }
  auto s = h.Step();
  ASSERT_EQ(s.plan.new_requests.size(), 2u);
  EXPECT_EQ(s.plan.new_requests[0].request_id, 5u);
  EXPECT_EQ(s.plan.new_requests[1].request_id, 3u);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
}

TEST(SchedulerTest, PriorityPolicyAdmitsLowerValuesFirst) {
  SchedulerConfig c = SmallConfig();
  c.max_num_seqs = 1;
  c.policy = SchedulingPolicy::kPriority;
  Harness h(c);
  RequestSpec low = Spec(1, Iota(4), 2);
  low.priority = 5;
  RequestSpec high = Spec(2, Iota(4, 10), 2);
  high.priority = 0;
  ASSERT_TRUE(h.scheduler().AddRequest(low).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(high).ok());
  auto s = h.Step();
  ASSERT_EQ(s.plan.new_requests.size(), 1u);
  EXPECT_EQ(s.plan.new_requests[0].request_id, 2u);
}

TEST(SchedulerTest, LongPrefillThresholdCapsChunks) {
  SchedulerConfig c = SmallConfig();
  c.max_num_batched_tokens = 64;
  c.long_prefill_token_threshold = 4;
  Harness h(c);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), 1)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(3, 40), 1)).ok());
  auto s1 = h.Step();
  EXPECT_EQ(s1.plan.new_requests[0].num_scheduled_tokens, 4);
  EXPECT_EQ(s1.plan.new_requests[1].num_scheduled_tokens, 3);
  EXPECT_EQ(h.Step().plan.cached_requests[0].num_scheduled_tokens, 4);
  EXPECT_EQ(h.Step().plan.cached_requests[0].num_scheduled_tokens, 2);
}

TEST(SchedulerTest, WithoutChunkedPrefillAPromptWaitsForAWholeBudget) {
  SchedulerConfig c = SmallConfig();
  c.enable_chunked_prefill = false;
  c.max_model_len = 16;
  c.max_num_batched_tokens = 16;
  Harness h(c);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(10), 3)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(10, 50), 3)).ok());
  auto s1 = h.Step();
  ASSERT_EQ(s1.plan.new_requests.size(), 1u);  // 6 tokens left: not enough for request 2
  auto s2 = h.Step();
  ASSERT_EQ(s2.plan.new_requests.size(), 1u);
  EXPECT_EQ(s2.plan.new_requests[0].request_id, 2u);
  EXPECT_EQ(s2.plan.new_requests[0].num_scheduled_tokens, 10);
}

// Offloads whole groups of `blocks_per_group`.
class FakeOffloader : public ExpertOffloader {
 public:
  FakeOffloader(int32_t groups, int32_t blocks_per_group)
      : groups_(groups), blocks_per_group_(blocks_per_group) {}
  int32_t RemainingGroups() const override { return groups_; }
  int32_t BlocksPerGroup() const override { return blocks_per_group_; }
  absl::StatusOr<int32_t> Offload(int32_t groups) override {
    groups_ -= groups;
    ++calls;
    last_groups = groups;
    return groups * blocks_per_group_;
  }
  bool Ready() const override { return ready; }
  // The agents refused the step that carried the last offload: its groups come back.
  int32_t Refused() {
    groups_ += last_groups;
    ready = false;
    return last_groups * blocks_per_group_;
  }
  int calls = 0;
  int32_t last_groups = 0;
  bool ready = true;

 private:
  int32_t groups_;
  int32_t blocks_per_group_;
};

// Covers every gap by offloading alone.
class OffloadingArbiter : public MemoryArbiter {
 public:
  absl::string_view name() const override { return "offload-only"; }
  ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) override {
    ArbiterPlan plan;
    const OffloadState& e = context.offload();
    if (e.available && e.blocks_per_group > 0) {
      plan.offload_groups = (gap.blocks + e.blocks_per_group - 1) / e.blocks_per_group;
      plan.choice = "offload";
    }
    return plan;
  }
};

TEST(SchedulerTest, ArbiterOffloadGrowsThePool) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 4;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  FakeOffloader offloader(10, 2);
  Harness h(c, std::make_unique<OffloadingArbiter>(), &offloader);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(12), 1)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(12, 100), 1)).ok());
  auto s = h.Step();
  EXPECT_EQ(s.plan.new_requests.size(), 2u);
  EXPECT_EQ(s.plan.num_blocks, 6);
  EXPECT_EQ(offloader.calls, 1);
  ASSERT_EQ(h.scheduler().step_decisions().size(), 1u);
  const ArbiterRecord& rec = h.scheduler().step_decisions()[0];
  EXPECT_EQ(rec.requester, 2u);
  EXPECT_FALSE(rec.requester_running);
  EXPECT_EQ(rec.gap_blocks, 2);
  EXPECT_EQ(rec.blocks_added, 2);
  EXPECT_EQ(rec.plan.choice, "offload");
  EXPECT_EQ(h.scheduler().counters().num_offloaded_blocks, 2);
}

// An offloader that reports the groups it holds (FakeOffloader reports none).
class HoldingOffloader : public FakeOffloader {
 public:
  HoldingOffloader(int32_t groups, int32_t blocks_per_group)
      : FakeOffloader(groups, blocks_per_group), total_(groups) {}
  int32_t OffloadedGroups() const override { return total_ - RemainingGroups(); }

 private:
  const int32_t total_;
};

// OffloadingArbiter on a GPU it reports compute-bound: more running requests do not pay.
class ComputeBoundOffloadingArbiter : public OffloadingArbiter {
 public:
  bool ConcurrencyPays(int64_t) const override { return false; }
};

// admit_within_baseline while more concurrency does not pay: admissions stop where a static
// split's pool would (here 6 blocks of 2 tokens), so the arbiter grows the pool only for running
// requests; the groups it adds let them grow without preemption and admit nobody. With the option
// off, or an arbiter for which concurrency pays, the pool grows to admit the third request at
// once.
TEST(SchedulerTest, AdmissionsStayWithinThePoolAStaticSplitHolds) {
  for (int mode = 0; mode < 3; ++mode) {
    const bool within = mode == 2;
    SchedulerConfig c;
    c.block_size = 2;
    c.num_blocks = 6;
    c.max_num_batched_tokens = 64;
    c.max_model_len = 12;
    c.admit_within_baseline = mode > 0;
    HoldingOffloader offloader(10, 2);
    std::unique_ptr<MemoryArbiter> arbiter = mode == 2
                                                 ? std::make_unique<ComputeBoundOffloadingArbiter>()
                                                 : std::make_unique<OffloadingArbiter>();
    Harness h(c, std::move(arbiter), &offloader);
    Scheduler& s = h.scheduler();
    ASSERT_TRUE(s.AddRequest(Spec(1, Iota(6), 5)).ok());       // 3 blocks, growing to 6
    ASSERT_TRUE(s.AddRequest(Spec(2, Iota(4, 100), 5)).ok());  // 2 blocks, growing to 5
    ASSERT_TRUE(s.AddRequest(Spec(3, Iota(4, 200), 2)).ok());  // 2 blocks
    h.Step();
    if (!within) {
      EXPECT_EQ(s.num_running(), 3) << "mode " << mode;
      EXPECT_EQ(offloader.calls, 1) << "grown to admit request 3";
      h.RunToCompletion();
      continue;
    }
    EXPECT_EQ(s.num_running(), 2);
    EXPECT_EQ(s.num_waiting(), 1);
    EXPECT_EQ(offloader.calls, 0) << "an admission never grows the pool";
    // Requests 1 and 2 decode past the 6 blocks: the pool grows for them, and request 3 still
    // waits (their blocks and its 2 exceed the pool without the groups).
    bool grew = false;
    for (int i = 0; i < 8 && s.num_waiting() == 1; ++i) {
      h.Step();
      if (s.num_waiting() == 1 && s.pool().num_blocks() > 6) grew = true;
    }
    EXPECT_TRUE(grew);
    EXPECT_GE(offloader.calls, 1);
    EXPECT_EQ(s.counters().num_preemptions, 0);
    // Once they finish, request 3 is admitted and everything completes.
    h.RunToCompletion();
    EXPECT_EQ(s.num_running() + s.num_waiting(), 0);
  }
}

// The agents refuse the step that carried an offload: RevertStep puts everything back, and the
// next plan does the same work on the old pool (here, without the offload, less of it) for
// agents that never saw the refused one.
TEST(SchedulerTest, ARefusedStepIsRevertedAndPlannedAgain) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 4;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  FakeOffloader offloader(10, 2);
  Harness h(c, std::make_unique<OffloadingArbiter>(), &offloader);
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(12), 3)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(12, 100), 3)).ok());
  absl::StatusOr<StepPlan> refused = s.Schedule();
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->new_requests.size(), 2u);
  ASSERT_EQ(refused->num_blocks, 6) << "the offload's blocks are used at once";

  ASSERT_TRUE(s.RevertStep(offloader.Refused()).ok());
  EXPECT_EQ(s.pool().num_blocks(), 4);
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_EQ(s.Stats().num_used_blocks, 0);
  EXPECT_EQ(s.counters().num_steps, 0);
  EXPECT_EQ(s.counters().num_offloads, 0);
  EXPECT_EQ(s.counters().num_admitted, 0);
  EXPECT_EQ(s.counters().prefix_cache.query_tokens, 0);
  EXPECT_EQ(s.counters().num_reverted_steps, 1);
  EXPECT_TRUE(s.CheckInvariants().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(s.RevertStep(0))) << "nothing left to revert";

  // Not Ready: no offload, so only request 1 fits; it is announced again, as new.
  auto again = h.Step();
  ASSERT_EQ(again.plan.new_requests.size(), 1u);
  EXPECT_EQ(again.plan.new_requests[0].request_id, 1u);
  EXPECT_EQ(again.plan.new_requests[0].prompt_token_ids, refused->new_requests[0].prompt_token_ids);
  EXPECT_EQ(again.plan.new_requests[0].num_scheduled_tokens, 12);
  EXPECT_EQ(again.plan.num_blocks, 4);
  EXPECT_EQ(s.num_waiting(), 1);
  offloader.ready = true;
  h.RunToCompletion();
  EXPECT_EQ(s.counters().num_finished, 2);
  EXPECT_EQ(s.counters().num_offloads, 1);
}

// A refused decode step: the running requests lose the block it appended and the tokens it was
// to compute, and the next plan asks for exactly the same work again.
TEST(SchedulerTest, ARefusedDecodeStepIsRunAgainTheSameWay) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 16;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 32;
  Harness h(c);
  Scheduler& s = h.scheduler();
  ASSERT_TRUE(s.AddRequest(Spec(1, Iota(8), 6)).ok());
  ASSERT_TRUE(s.AddRequest(Spec(2, Iota(5, 100), 6)).ok());
  h.Step();  // prefills
  absl::StatusOr<StepPlan> refused = s.Schedule();
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->cached_requests.size(), 2u);
  // Request 1's 9th token starts block 2: this step appends it.
  EXPECT_EQ(refused->cached_requests[0].new_block_ids.size(), 1u);
  const std::vector<BlockId> table_before = {s.FindRequest(1)->block_ids().begin(),
                                             s.FindRequest(1)->block_ids().end() - 1};
  ASSERT_TRUE(s.RevertStep(0).ok());
  EXPECT_EQ(s.FindRequest(1)->block_ids(), table_before);
  EXPECT_EQ(s.FindRequest(1)->num_computed_tokens(), 8);
  EXPECT_TRUE(s.CheckInvariants().ok());
  auto again = h.Step();  // the fake agent never saw the refused plan
  ASSERT_EQ(again.plan.cached_requests.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again.plan.cached_requests[i].request_id, refused->cached_requests[i].request_id);
    EXPECT_EQ(again.plan.cached_requests[i].num_computed_tokens,
              refused->cached_requests[i].num_computed_tokens);
    EXPECT_EQ(again.plan.cached_requests[i].num_scheduled_tokens,
              refused->cached_requests[i].num_scheduled_tokens);
    EXPECT_EQ(again.plan.cached_requests[i].new_block_ids.size(),
              refused->cached_requests[i].new_block_ids.size());
  }
  EXPECT_EQ(again.outputs.size(), 2u);
  h.RunToCompletion();
  EXPECT_EQ(s.counters().num_finished, 2);
  EXPECT_EQ(s.counters().num_reverted_steps, 1);
}

TEST(SchedulerTest, OffloadWithoutAnOffloaderMakesTheRequestWait) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 4;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  Harness h(c, std::make_unique<OffloadingArbiter>());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(12), 1)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(12, 100), 1)).ok());
  auto s = h.Step();
  EXPECT_EQ(s.plan.new_requests.size(), 1u);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  ASSERT_EQ(h.scheduler().step_decisions().size(), 1u);
  EXPECT_TRUE(h.scheduler().step_decisions()[0].plan.empty());
  // Request 1 finishes, but its 3 full blocks stay cached and this arbiter neither evicts nor
  // offloads: request 2 keeps waiting with a gap of 2.
  for (int i = 0; i < 4; ++i) h.Step();
  EXPECT_EQ(h.scheduler().counters().num_finished, 1);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  EXPECT_EQ(h.scheduler().Stats().num_free_cached_blocks, 3);
  ASSERT_EQ(h.scheduler().step_decisions().size(), 1u);
  EXPECT_EQ(h.scheduler().step_decisions()[0].gap_blocks, 2);
}

TEST(SchedulerTest, StalledRunningRequestBlocksNewAdmissions) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 5;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  c.long_prefill_token_threshold = 8;
  Harness h(c, std::make_unique<OffloadingArbiter>());  // no offloader: it can only say "wait"
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(15), 1)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(8, 100), 5)).ok());
  EXPECT_EQ(h.Step().plan.new_requests.size(), 2u);                      // 2 + 2 blocks, 1 free
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(3, Iota(3, 200), 1)).ok());  // would fit in 1 block
  auto s = h.Step();
  // Request 1 needs 2 more blocks and the arbiter declines; the free block is not handed to the
  // newcomer either.
  EXPECT_TRUE(s.plan.empty());
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  ASSERT_EQ(h.scheduler().step_decisions().size(), 1u);
  EXPECT_EQ(h.scheduler().step_decisions()[0].requester, 1u);
  EXPECT_TRUE(h.scheduler().step_decisions()[0].requester_running);
  EXPECT_EQ(h.scheduler().Stats().num_free_uncached_blocks, 1);
}

TEST(SchedulerTest, ShrinkWaitsForTailBlocksThenCommits) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  Harness h(c);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(8), 4)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(8, 40), 4)).ok());
  h.Step();  // blocks 0..3 in use
  EXPECT_EQ(h.scheduler().BeginShrinkPool(5).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.scheduler().BeginShrinkPool(4).ok());  // tail 4..7 is free: withdrawn at once
  ASSERT_TRUE(h.scheduler().CommitShrinkPool().ok());
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 4);
  ASSERT_TRUE(h.scheduler().GrowPool(4).ok());
  auto s = h.Step();  // each request's third block comes from the new tail: 4 and 5
  ASSERT_EQ(s.plan.cached_requests.size(), 2u);
  EXPECT_THAT(s.plan.cached_requests[0].new_block_ids, ElementsAre(4));
  EXPECT_THAT(s.plan.cached_requests[1].new_block_ids, ElementsAre(5));
  ASSERT_TRUE(h.scheduler().BeginShrinkPool(4).ok());  // 6, 7 free; 4, 5 in use
  EXPECT_EQ(h.scheduler().pool().shrink_outstanding(), 2);
  EXPECT_EQ(h.scheduler().CommitShrinkPool().code(), absl::StatusCode::kFailedPrecondition);
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler().pool().shrink_outstanding(), 0);
  ASSERT_TRUE(h.scheduler().CommitShrinkPool().ok());
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 4);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());
}

TEST(SchedulerTest, StatsReportPoolRequestsAndQueueTimes) {
  SchedulerConfig c = SmallConfig();
  c.max_num_seqs = 1;
  Harness h(c);
  h.set_step_micros(0);
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(6), 2)).ok());  // arrives at t=0
  RequestSpec second = Spec(2, Iota(6, 30), 2);
  second.arrival_micros = 1000;
  ASSERT_TRUE(h.scheduler().AddRequest(second).ok());
  h.clock().SetMicros(2500);
  h.Step();
  SchedulerStats st = h.scheduler().Stats();
  ASSERT_EQ(st.step_queue_times.size(), 1u);
  EXPECT_EQ(st.step_queue_times[0].request_id, 1u);
  EXPECT_EQ(st.step_queue_times[0].queue_micros, 2500);
  EXPECT_FALSE(st.step_queue_times[0].resumed);
  EXPECT_EQ(st.num_running, 1);
  EXPECT_EQ(st.num_waiting, 1);
  EXPECT_EQ(st.num_used_blocks, 2);
  EXPECT_EQ(st.num_free_uncached_blocks, 62);
  EXPECT_DOUBLE_EQ(st.kv_usage, 2.0 / 64);
  EXPECT_EQ(st.step_num_scheduled_tokens, 6);
  h.clock().SetMicros(9000);
  h.Step();  // request 1 finishes (2 outputs)
  h.Step();  // request 2 admitted
  st = h.scheduler().Stats();
  ASSERT_EQ(st.step_queue_times.size(), 1u);
  EXPECT_EQ(st.step_queue_times[0].queue_micros, 8000);
  EXPECT_EQ(st.counters.num_admitted, 2);
  EXPECT_EQ(st.counters.total_queue_micros, 10500);
  EXPECT_EQ(st.num_free_cached_blocks, 1);  // request 1's first block (7 computed tokens)
}

TEST(SchedulerTest, IdenticalInputsGiveIdenticalPlans) {
  auto run = [] {
    SchedulerConfig c = SmallConfig();
    c.num_blocks = 20;
    c.max_model_len = 40;
    Harness h(c);
    std::vector<std::string> log;
    for (RequestId id = 1; id <= 6; ++id) {
      EXPECT_TRUE(h.scheduler().AddRequest(Spec(id, Iota(9 + id, id % 2 ? 0 : 300), 12)).ok());
    }
    for (int i = 0; i < 60 && h.scheduler().has_unfinished_requests(); ++i) {
      log.push_back(testing::PlanSummary(h.Step().plan));
    }
    return log;
  };
  const auto a = run();
  EXPECT_EQ(a, run());
  EXPECT_GT(a.size(), 10u);
}

TEST(SchedulerConfigTest, ValidateNamesTheField) {
  auto error_of = [](auto mutate) {
    SchedulerConfig c = SmallConfig();
    mutate(c);
    return std::string(c.Validate().message());
  };
  EXPECT_TRUE(SmallConfig().Validate().ok());
  EXPECT_NE(error_of([](SchedulerConfig& c) { c.num_blocks = 0; }).find("num_blocks"),
            std::string::npos);
  EXPECT_NE(error_of([](SchedulerConfig& c) { c.max_model_len = 1000; }).find("max_model_len"),
            std::string::npos);
  EXPECT_NE(error_of([](SchedulerConfig& c) { c.block_size = 0; }).find("block_size"),
            std::string::npos);
  EXPECT_NE(error_of([](SchedulerConfig& c) {
              c.enable_chunked_prefill = false;
            }).find("max_num_batched_tokens"),
            std::string::npos);
  EXPECT_NE(error_of([](SchedulerConfig& c) {
              c.long_prefill_token_threshold = -1;
            }).find("long_prefill_token_threshold"),
            std::string::npos);
  EXPECT_FALSE(Scheduler::Create(SmallConfig(), nullptr, std::make_unique<StaticArbiter>()).ok());
}

TEST(SchedulerConfigTest, SchemaRoundTrip) {
  ConfigSchema schema;
  AddSchedulerConfigFields(schema);
  Config config(schema);
  ASSERT_TRUE(config.SetFromString("max_num_seqs", "7").ok());
  ASSERT_TRUE(config.SetFromString("scheduling_policy", "priority").ok());
  ASSERT_TRUE(config.SetFromString("num_kv_blocks", "4096").ok());
  ASSERT_TRUE(
      config.SetFromString("prefix_cache_hash_key", "000102030405060708090a0b0c0d0e0f").ok());
  auto c = SchedulerConfigFromConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_num_seqs, 7);
  EXPECT_EQ(c->num_blocks, 4096);
  EXPECT_EQ(c->policy, SchedulingPolicy::kPriority);
  EXPECT_EQ(c->block_size, 16);
  EXPECT_EQ(c->prefix_cache_hash_key0, 0x0001020304050607ULL);
  EXPECT_EQ(c->prefix_cache_hash_key1, 0x08090a0b0c0d0e0fULL);
  EXPECT_TRUE(c->Validate().ok());
  ASSERT_TRUE(config.SetFromString("prefix_cache_hash_key", "xyz").ok());
  EXPECT_FALSE(SchedulerConfigFromConfig(config).ok());
  EXPECT_FALSE(config.SetFromString("scheduling_policy", "lifo").ok());
}

}  // namespace
}  // namespace vamp
