// The agent engine's parts on their own, over a host rank of the tiny qwen3_moe checkpoint built by
// BuildRank (no gRPC, no AgentEngine): StepExecutor turning StepRequests into runner steps, and
// RankRemapper's remaps, rollbacks and capacity answers.
#include <memory>
#include <utility>

#include "agent/rank_remapper.h"
#include "agent/step_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "tests/engine/rank/tiny_rank.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;  // expert shard 18 KiB: groups of 2 experts

// The tiny model on the host in 4 KiB pages: 96 KV pages (32 blocks) and VAMP-75 (6 groups).
std::unique_ptr<Rank> TinyRank() {
  absl::StatusOr<std::unique_ptr<Rank>> rank =
      BuildHostRank(TinyModelDir(), kPage, /*kv_pages=*/96, /*ratio=*/0.75);
  EXPECT_TRUE(rank.ok()) << rank.status();
  return rank.ok() ? *std::move(rank) : nullptr;
}

// Runs `request` through `steps` on `rank`, whose whole KV pool is usable.
absl::StatusOr<vamp::v1::StepResponse> RunStep(StepExecutor& steps, Rank& rank,
                                               const vamp::v1::StepRequest& request) {
  vamp::v1::StepResponse response;
  const absl::Status s = steps.Run(request, rank.runner->kv_cache().num_blocks,
                                   rank.config.vocab_size, *rank.runner, &response);
  if (!s.ok()) return s;
  return response;
}

TEST(StepExecutorTest, DecodesGoldensAcrossAPreemption) {
  std::unique_ptr<Rank> rank = TinyRank();
  ASSERT_NE(rank, nullptr);
  StepExecutor steps;
  const Goldens g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(rank->runner->kv_cache().num_blocks);
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[0], 16);
  for (int i = 0; i < 1000 && !controller.Done(); ++i) {
    if (i == 4) controller.Preempt(1);  // resumed with every token it has, recomputed from 0
    absl::StatusOr<vamp::v1::StepResponse> r = RunStep(steps, *rank, controller.Next());
    ASSERT_TRUE(r.ok()) << r.status();
    controller.Apply(*r);
  }
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[0]);
  // The last step finished both; the next one makes the executor forget them.
  ASSERT_TRUE(RunStep(steps, *rank, controller.Next()).ok());
  EXPECT_EQ(steps.size(), 0u);
}

TEST(StepExecutorTest, ARejectedStepNamesTheFieldAndChangesNothing) {
  std::unique_ptr<Rank> rank = TinyRank();
  ASSERT_NE(rank, nullptr);
  StepExecutor steps;
  vamp::v1::StepRequest bad;
  bad.set_step_id(1);
  vamp::v1::NewRequest* fresh = bad.add_new_requests();
  fresh->set_request_id(5);
  fresh->add_prompt_token_ids(3);
  fresh->add_block_ids(0);
  fresh->set_num_scheduled_tokens(1);
  bad.add_cached_requests()->set_request_id(7);
  absl::StatusOr<vamp::v1::StepResponse> r = RunStep(steps, *rank, bad);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("cached_requests[0].request_id 7 is unknown"));
  EXPECT_EQ(steps.size(), 0u);

  fresh->set_prompt_token_ids(0, static_cast<int32_t>(rank->config.vocab_size));
  bad.clear_cached_requests();
  r = RunStep(steps, *rank, bad);
  EXPECT_TRUE(absl::IsOutOfRange(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("new_requests[0].prompt_token_ids[0]"));
  EXPECT_EQ(steps.size(), 0u);

  fresh->set_prompt_token_ids(0, 3);
  r = RunStep(steps, *rank, bad);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->sampled_size(), 1);
  EXPECT_EQ(r->sampled(0).request_id(), 5u);
  EXPECT_EQ(steps.size(), 1u);
}

// NewRequest.prompt_logprobs: refused (naming the field) by an executor that does not offer
// them; otherwise the prompt positions' log-probabilities, with k alternatives, in the response
// of the rank that returns them, and in no other rank's.
TEST(StepExecutorTest, PromptLogprobsOnlyWhereOfferedAndFromTheRankThatReturnsThem) {
  std::unique_ptr<Rank> rank = TinyRank();
  ASSERT_NE(rank, nullptr);
  const Goldens g = LoadGoldens();
  const std::vector<int32_t>& prompt = g.prompts[1];
  vamp::v1::StepRequest step;
  step.set_step_id(1);
  vamp::v1::NewRequest* fresh = step.add_new_requests();
  fresh->set_request_id(5);
  fresh->mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  fresh->add_block_ids(0);
  fresh->add_block_ids(1);
  fresh->set_num_scheduled_tokens(static_cast<int32_t>(prompt.size()));
  fresh->mutable_sampling()->set_num_top_logprobs(2);
  fresh->set_prompt_logprobs(true);
  StepExecutor refusing;
  absl::StatusOr<vamp::v1::StepResponse> r = RunStep(refusing, *rank, step);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("new_requests[0].prompt_logprobs"));
  EXPECT_EQ(refusing.size(), 0u);

  StepExecutor silent;
  silent.set_options({/*prompt_logprobs_supported=*/true, /*return_prompt_logprobs=*/false});
  r = RunStep(silent, *rank, step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_logprobs_size(), 0);
  EXPECT_EQ(r->sampled_size(), 1);

  std::unique_ptr<Rank> rank0 = TinyRank();
  ASSERT_NE(rank0, nullptr);
  StepExecutor returning;
  returning.set_options({true, true});
  r = RunStep(returning, *rank0, step);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompt_logprobs_size(), 1);
  const vamp::v1::PromptLogprobs& lp = r->prompt_logprobs(0);
  EXPECT_EQ(lp.request_id(), 5u);
  EXPECT_EQ(lp.first_position(), 1);
  EXPECT_EQ(lp.logprobs_size(), static_cast<int>(prompt.size()) - 1);
  EXPECT_EQ(lp.top_token_ids_size(), 2 * lp.logprobs_size());
  EXPECT_EQ(lp.top_logprobs_size(), 2 * lp.logprobs_size());
  for (int i = 0; i < lp.logprobs_size(); ++i) {
    EXPECT_LE(lp.logprobs(i), lp.top_logprobs(2 * i)) << "the most likely is at least as likely";
  }
}

TEST(RankRemapperTest, OffloadRestoreAndRollbackMoveTheUsableBlocks) {
  std::unique_ptr<Rank> rank = TinyRank();
  ASSERT_NE(rank, nullptr);
  RankRemapper remapper(rank.get(), /*max_history=*/4, /*metrics=*/nullptr);
  const int64_t baseline = remapper.usable_blocks();
  EXPECT_EQ(baseline, 32);
  const absl::StatusOr<int64_t> added = rank->memory.page_remapper->BlocksAddedByOffload(2);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_GT(*added, 0);
  const int64_t after = baseline + *added;

  vamp::v1::RemapCommand offload;
  offload.set_action(vamp::v1::RemapCommand::ACTION_OFFLOAD);
  offload.set_num_groups(2);
  offload.set_remap_id("r1");
  ASSERT_TRUE(remapper.Apply(0, offload).ok());
  EXPECT_EQ(remapper.usable_blocks(), after);
  EXPECT_EQ(rank->runner->kv_cache().num_blocks, after);
  EXPECT_EQ(rank->memory.page_remapper->offloaded_groups(), 2);

  ASSERT_TRUE(remapper.Rollback("r1").ok());
  EXPECT_EQ(remapper.usable_blocks(), baseline);
  EXPECT_EQ(rank->runner->kv_cache().num_blocks, baseline);
  EXPECT_EQ(rank->memory.page_remapper->offloaded_groups(), 0);
  EXPECT_TRUE(remapper.Rollback("r1").ok()) << "a remap this rank does not know: nothing to undo";

  offload.set_num_groups(0);
  const absl::Status bad = remapper.Apply(3, offload);
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("remaps[3] (remap_id 'r1'): num_groups must be >= 1"));
  EXPECT_TRUE(rank->memory.page_remapper->Audit().ok());
}

}  // namespace
}  // namespace vamp::testing
