// vamp-agent's remaps over gRPC on loopback, CPU, tiny qwen3_moe checkpoint: offload and restore
// mid-decode keep the tokens and give exactly the blocks the geometry declared at Init predicts,
// an offload riding on a decode step is applied before it and its blocks used by it, remap errors
// refuse the step (nothing of it runs) and rollback, and restores that would take blocks still in
// use (refused, unless the same step releases their requests).
#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

TEST(AgentTest, OffloadMidDecodeThenRestoreKeepsTokens) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t baseline = init.memory().kv_blocks();
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(baseline);
  controller.Submit(1, g.prompts[1], 16);
  for (int i = 0; i < 6; ++i) {
    auto r = client.Step(controller.Next());
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->error_message(), "");
    EXPECT_EQ(r->timings().staged_bytes(), 0u);
    controller.Apply(*r);
  }

  // Offload 3 groups between two decode steps; the controller computes the count from the
  // geometry the agent declared.
  EXPECT_EQ(init.offload().kv_pages_per_group(), 18);  // 2 layers x 9 pages of experts
  EXPECT_EQ(init.memory().max_offload_groups(), 6);
  const int64_t grown = KvBlocksAfter(init, init.memory(), 3);
  EXPECT_EQ(grown, baseline + 3 * 6);  // 18 pages per group step = 6 blocks
  auto offload = client.Step(RemapOnly(
      controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD, 3, grown, "remap-1"));
  ASSERT_TRUE(offload.ok());
  ASSERT_EQ(offload->error_message(), "");
  EXPECT_EQ(offload->memory().kv_blocks(), baseline + 18);
  EXPECT_EQ(offload->memory().offloaded_groups(), 3);
  EXPECT_EQ(offload->memory().offloaded_expert_bytes(), 2u * 3 * 2 * 18432);
  EXPECT_GT(offload->timings().remap_us(), 0);
  EXPECT_TRUE(offload->sampled().empty());
  controller.set_num_blocks(offload->memory().kv_blocks());

  for (int i = 0; i < 5; ++i) {
    auto r = client.Step(controller.Next());
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->error_message(), "");
    EXPECT_GT(r->timings().staged_bytes(), 0u) << "offloaded experts are staged every step";
    controller.Apply(*r);
  }

  EXPECT_EQ(KvBlocksAfter(init, offload->memory(), -3), baseline);
  auto restore = client.Step(RemapOnly(
      controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE, 3, baseline, "remap-2"));
  ASSERT_TRUE(restore.ok());
  ASSERT_EQ(restore->error_message(), "");
  EXPECT_EQ(restore->memory().kv_blocks(), baseline);
  EXPECT_EQ(restore->memory().offloaded_groups(), 0);
  controller.set_num_blocks(baseline);
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
}

TEST(AgentTest, RemapErrorsAndRollback) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t baseline = init.memory().kv_blocks();
  int64_t step = 0;

  // Past the cap: the step is refused with an error naming the remap; nothing changes.
  auto r = client.Step(RemapOnly(++step, vamp::v1::RemapCommand::ACTION_OFFLOAD, 7, 0, "big"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("remaps[0] (remap_id 'big')"));
  EXPECT_TRUE(r->refused());
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  // More blocks expected than the offload gives: refused and undone.
  r = client.Step(
      RemapOnly(++step, vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, baseline + 100, "greedy"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("expected_kv_blocks"));
  EXPECT_TRUE(r->refused());
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  EXPECT_EQ(r->memory().offloaded_groups(), 0);
  // Restoring what is not offloaded.
  r = client.Step(RemapOnly(++step, vamp::v1::RemapCommand::ACTION_RESTORE, 1, 0, "nothing"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("restore of 1 group"));
  EXPECT_TRUE(r->refused());

  // A good offload, using fewer blocks than it could (another rank added fewer), then undone.
  r = client.Step(
      RemapOnly(++step, vamp::v1::RemapCommand::ACTION_OFFLOAD, 2, baseline + 10, "two"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  EXPECT_EQ(r->memory().kv_blocks(), baseline + 10);
  EXPECT_EQ(r->memory().offloaded_groups(), 2);
  vamp::v1::StepRequest rollback;
  rollback.set_step_id(++step);
  rollback.add_rollback_remap_ids("two");
  rollback.add_rollback_remap_ids("never-applied");  // failed here: nothing to undo
  r = client.Step(rollback);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error_message(), "");
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  EXPECT_EQ(r->memory().offloaded_groups(), 0);
  EXPECT_FALSE(r->refused());
}

// The controller's path: the offload rides on a decode step whose new block lies in the tail the
// offload maps; a step whose remap fails runs nothing of its requests, and sent again without the
// remap it gives the same tokens.
TEST(AgentTest, AnOffloadRidingADecodeStepIsAppliedFirstAndARefusedOneRunsNothing) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t baseline = init.memory().kv_blocks();
  const auto g = LoadGoldens();
  const int64_t grown = KvBlocksAfter(init, init.memory(), 1);
  ASSERT_GT(grown, baseline);
  // The request's blocks start in the last baseline block, so its next blocks are in the tail.
  MiniController controller(static_cast<int32_t>(baseline - 1));
  controller.set_num_blocks(baseline);
  controller.Submit(1, g.prompts[1], 16);

  // Refused: the step's remap expects more than the offload gives; the step's tokens do not run.
  controller.set_num_blocks(grown);
  vamp::v1::StepRequest step = controller.Next();
  vamp::v1::StepRequest refused = step;
  vamp::v1::RemapCommand& bad = *refused.add_remaps();
  bad.set_action(vamp::v1::RemapCommand::ACTION_OFFLOAD);
  bad.set_num_groups(1);
  bad.set_expected_kv_blocks(grown + 1);
  bad.set_remap_id("too-many");
  auto r = client.Step(refused);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->refused());
  EXPECT_THAT(r->error_message(), HasSubstr("expected_kv_blocks"));
  EXPECT_TRUE(r->sampled().empty()) << "nothing of a refused step runs";
  EXPECT_EQ(r->memory().kv_blocks(), baseline);

  // The same step with a good remap: mapped first, then the prefill uses blocks past baseline.
  vamp::v1::StepRequest good = step;
  good.set_step_id(controller.NextStepId());
  vamp::v1::RemapCommand& offload = *good.add_remaps();
  offload.set_action(vamp::v1::RemapCommand::ACTION_OFFLOAD);
  offload.set_num_groups(1);
  offload.set_expected_kv_blocks(grown);
  offload.set_remap_id("one");
  r = client.Step(good);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  EXPECT_FALSE(r->refused());
  EXPECT_EQ(r->memory().kv_blocks(), grown);
  EXPECT_EQ(r->memory().kv_pool_bytes(),
            init.memory().kv_pool_bytes() +
                init.offload().kv_pages_per_group() * init.memory().page_bytes());
  ASSERT_EQ(r->sampled_size(), 1);
  controller.Apply(*r);
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
}

TEST(AgentTest, RestoreRefusesTailBlocksStillInUse) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t baseline = init.memory().kv_blocks();
  auto r = client.Step(RemapOnly(1, vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, 0, "one"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  const int64_t grown = r->memory().kv_blocks();
  ASSERT_GT(grown, baseline);
  // A request lives in the last block, which the restore would take back.
  MiniController controller(static_cast<int32_t>(grown - 1));
  controller.set_num_blocks(grown);
  controller.Submit(1, LoadGoldens().prompts[1], 4);
  auto step = client.Step(controller.Next());
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->error_message(), "");
  r = client.Step(
      RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE, 1, 0, "back"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("still held by a request"));
  EXPECT_EQ(r->memory().kv_blocks(), grown);
  EXPECT_EQ(r->memory().offloaded_groups(), 1);

  // The controller finished (or preempted) it and restores before its next step: the restore
  // names it, and the agent drops it before taking the tail back.
  vamp::v1::StepRequest restore =
      RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE, 1, 0, "back2");
  restore.add_finished_request_ids(1);
  r = client.Step(restore);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error_message(), "");
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  EXPECT_EQ(r->memory().offloaded_groups(), 0);
  // A later step naming it again changes nothing.
  vamp::v1::StepRequest again;
  again.set_step_id(controller.NextStepId());
  again.add_finished_request_ids(1);
  r = client.Step(again);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error_message(), "");
}

TEST(AgentTest, RestoreDropsPreemptedHoldersFirst) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t baseline = init.memory().kv_blocks();
  auto r = client.Step(RemapOnly(1, vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, 0, "one"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  const int64_t grown = r->memory().kv_blocks();
  MiniController controller(static_cast<int32_t>(grown - 1));
  controller.set_num_blocks(grown);
  controller.Submit(1, LoadGoldens().prompts[1], 4);
  auto step = client.Step(controller.Next());
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->error_message(), "");
  vamp::v1::StepRequest restore =
      RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE, 1, 0, "back");
  restore.add_preempted_request_ids(1);
  r = client.Step(restore);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error_message(), "");
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  EXPECT_EQ(r->memory().offloaded_groups(), 0);
}

}  // namespace
}  // namespace vamp::testing
