// vamp-agent over gRPC on loopback, CPU, tiny qwen3_moe checkpoint: Init, golden greedy decoding,
// offload/restore mid-decode, prefix-cache hits, preemption, TP=2 across two agents, bad input,
// authentication, /metrics, registration, and the real binary.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "tests/common/metrics_scrape.h"

namespace vamp {
namespace {

using testing::AgentClient;
using testing::GroupClient;
using ::testing::HasSubstr;
using testing::LoadGoldens;
using testing::MiniController;
using testing::TinyAgentOptions;
using testing::TinyInitRequest;

std::unique_ptr<AgentService> StartAgent(AgentOptions options = TinyAgentOptions()) {
  absl::StatusOr<std::unique_ptr<AgentService>> agent = AgentService::Start(std::move(options));
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? std::move(*agent) : nullptr;
}

vamp::v1::StepRequest RemapOnly(int64_t step_id, vamp::v1::RemapCommand::Action action,
                                int32_t groups, int64_t expected, const std::string& id) {
  vamp::v1::StepRequest step;
  step.set_step_id(step_id);
  vamp::v1::RemapCommand* c = step.add_remaps();
  c->set_action(action);
  c->set_num_groups(groups);
  c->set_expected_kv_blocks(expected);
  c->set_remap_id(id);
  return step;
}

TEST(AgentTest, InitReportsModelAndMemoryPlan) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  grpc::Status s = client.Init(TinyInitRequest(), &init);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(init.num_layers(), 3);
  EXPECT_EQ(init.num_experts(), 16);
  EXPECT_EQ(init.experts_per_group(), 2);  // 18 KiB shards on 4 KiB pages
  EXPECT_EQ(init.vocab_size(), 256);
  EXPECT_EQ(init.eos_token_id(), 2);
  EXPECT_EQ(init.max_position_embeddings(), 1024);
  EXPECT_THAT(init.memory_plan_text(), HasSubstr("KV cache:"));
  const vamp::v1::RankMemory& m = init.memory();
  EXPECT_EQ(m.rank(), 0);
  EXPECT_EQ(m.device(), "cpu");
  EXPECT_EQ(m.device_total_bytes(), uint64_t{8} << 20);
  EXPECT_EQ(m.page_bytes(), 4096u);
  EXPECT_GT(m.kv_blocks(), 100);
  // Whole pages are mapped; blocks are 3 pages (12 KiB) each.
  EXPECT_GE(m.kv_pool_bytes(), static_cast<uint64_t>(m.kv_blocks()) * 12288);
  EXPECT_LT(m.kv_pool_bytes(), static_cast<uint64_t>(m.kv_blocks() + 1) * 12288);
  EXPECT_EQ(m.offloaded_groups(), 0);
  EXPECT_EQ(m.max_offload_groups(), 6);
  EXPECT_EQ(m.resident_expert_bytes(), 3u * 72 * 4096);  // 3 regions of 72 pages
  EXPECT_EQ(m.offloaded_expert_bytes(), 0u);
  EXPECT_GT(m.other_weight_bytes(), 0u);
  EXPECT_GT(m.staging_bytes(), 0u);
}

TEST(AgentTest, GreedyDecodingMatchesGoldens) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[3], 16);  // batched with another request
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[3]);
  vamp::v1::GetStatsResponse stats;
  ASSERT_TRUE(client.GetStats(&stats).ok());
  EXPECT_EQ(stats.steps(), controller.step_id());
  EXPECT_GT(stats.last_step().total_us(), 0);
}

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

  // Offload 3 groups between two decode steps, as the controller's RemoteExpander does.
  vamp::v1::CapacityResponse capacity;
  ASSERT_TRUE(client.Capacity(3, &capacity).ok());
  EXPECT_EQ(capacity.kv_blocks_now(), baseline);
  EXPECT_EQ(capacity.kv_blocks_after(), baseline + 3 * 6);  // 18 pages per group step = 6 blocks
  EXPECT_EQ(capacity.offloaded_groups(), 0);
  EXPECT_EQ(capacity.max_offload_groups(), 6);
  auto offload =
      client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD, 3,
                            capacity.kv_blocks_after(), "remap-1"));
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

  ASSERT_TRUE(client.Capacity(-3, &capacity).ok());
  EXPECT_EQ(capacity.kv_blocks_after(), baseline);
  auto restore =
      client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE, 3,
                            capacity.kv_blocks_after(), "remap-2"));
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

  // Past the cap: an error naming the remap; nothing changes.
  auto r = client.Step(RemapOnly(++step, vamp::v1::RemapCommand::ACTION_OFFLOAD, 7, 0, "big"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("remaps[0] (remap_id 'big')"));
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  // More blocks expected than the offload gives: refused and undone.
  r = client.Step(
      RemapOnly(++step, vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, baseline + 100, "greedy"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("expected_kv_blocks"));
  EXPECT_EQ(r->memory().kv_blocks(), baseline);
  EXPECT_EQ(r->memory().offloaded_groups(), 0);
  // Restoring what is not offloaded.
  r = client.Step(RemapOnly(++step, vamp::v1::RemapCommand::ACTION_RESTORE, 1, 0, "nothing"));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("restore of 1 group"));

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
  vamp::v1::CapacityResponse capacity;
  ASSERT_TRUE(client.Capacity(0, &capacity).ok());
  EXPECT_EQ(capacity.kv_blocks_now(), baseline);
  ASSERT_TRUE(client.Capacity(7, &capacity).ok());
  EXPECT_EQ(capacity.kv_blocks_after(), baseline) << "past the cap nothing would change";
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
}

TEST(AgentTest, PrefixCacheHitGivesSameTokensAsFreshPrefill) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  const std::vector<int32_t>& prompt = g.prompts[2];  // 33 tokens: 2 full blocks + 1
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, prompt, 8);
  controller.Run(client);
  const std::vector<int32_t> fresh = controller.request(1).outputs;
  EXPECT_EQ(fresh,
            std::vector<int32_t>(g.continuations[2].begin(), g.continuations[2].begin() + 8));
  // The second request reuses the first one's two full prompt blocks (a prefix-cache hit).
  const std::vector<int32_t> cached(controller.request(1).blocks.begin(),
                                    controller.request(1).blocks.begin() + 2);
  controller.Submit(2, prompt, 8, cached, 32);
  controller.Run(client);
  EXPECT_EQ(controller.request(2).outputs, fresh);
  EXPECT_EQ(controller.request(2).initial_computed, 32);
}

TEST(AgentTest, PreemptedRequestResumesWithSameTokens) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[0], 16);
  for (int i = 0; i < 5; ++i) {
    auto r = client.Step(controller.Next());
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->error_message(), "");
    controller.Apply(*r);
  }
  controller.Preempt(1);
  auto r = client.Step(controller.Next());  // request 1 preempted, request 2 decodes
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  ASSERT_EQ(r->sampled_size(), 1);
  EXPECT_EQ(r->sampled(0).request_id(), 2u);
  controller.Apply(*r);
  controller.Run(client);  // resumed with a new block table, recomputed from 0
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[0]);
}

TEST(AgentTest, TensorParallelTwoAgentsEqualOne) {
  const auto g = LoadGoldens();
  // TP=1 reference through an agent.
  std::vector<int32_t> tp1;
  {
    auto agent = StartAgent();
    ASSERT_NE(agent, nullptr);
    AgentClient client(agent->grpc_port());
    vamp::v1::InitResponse init;
    ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
    MiniController controller;
    controller.Submit(1, g.prompts[3], 16);
    controller.Run(client);
    tp1 = controller.request(1).outputs;
  }
  auto rank0 = StartAgent();
  auto rank1 = StartAgent();
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  AgentClient c0(rank0->grpc_port()), c1(rank1->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.mutable_parallel()->set_tp_size(2);
  request.mutable_parallel()->set_host_transport_address(
      absl::StrCat("127.0.0.1:", testing::PickFreePort()));
  // Init every rank in parallel, as the controller does.
  auto init_rank = [&](AgentClient* c, int rank) {
    vamp::v1::InitRequest r = request;
    r.mutable_parallel()->set_tp_rank(rank);
    vamp::v1::InitResponse response;
    grpc::Status s = c->Init(r, &response);
    EXPECT_TRUE(s.ok()) << "rank " << rank << ": " << s.error_message();
    return response;
  };
  auto f1 = std::async(std::launch::async, init_rank, &c1, 1);
  const vamp::v1::InitResponse i0 = init_rank(&c0, 0);
  const vamp::v1::InitResponse i1 = f1.get();
  EXPECT_EQ(i0.memory().rank(), 0);
  EXPECT_EQ(i1.memory().rank(), 1);
  EXPECT_EQ(i0.memory().kv_blocks(), i1.memory().kv_blocks());
  // Each rank holds half of every expert: half the expert bytes of TP=1.
  EXPECT_LT(i0.memory().resident_expert_bytes(), 3u * 72 * 4096);

  GroupClient group({&c0, &c1});
  MiniController controller;
  controller.set_num_blocks(i0.memory().kv_blocks());
  controller.Submit(1, g.prompts[3], 16);
  bool offloaded = false;
  for (int i = 0; i < 100 && !controller.Done(); ++i) {
    if (i == 4 && !offloaded) {
      // A synchronized offload mid-decode: every rank ends with the cross-rank minimum.
      auto r = group.Step(
          RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, 0, "tp-1"));
      ASSERT_EQ(r[0].error_message(), "");
      ASSERT_EQ(r[1].error_message(), "");
      EXPECT_EQ(r[0].memory().kv_blocks(), r[1].memory().kv_blocks());
      offloaded = true;
    }
    auto r = group.Step(controller.Next());
    ASSERT_EQ(r[0].error_message(), "");
    ASSERT_EQ(r[1].error_message(), "");
    EXPECT_EQ(r[0].rank(), 0);
    EXPECT_EQ(r[1].rank(), 1);
    // Both ranks sampled the same tokens.
    ASSERT_EQ(r[0].sampled_size(), r[1].sampled_size());
    for (int k = 0; k < r[0].sampled_size(); ++k) {
      EXPECT_EQ(r[0].sampled(k).token_ids(0), r[1].sampled(k).token_ids(0));
    }
    controller.Apply(r[0]);
  }
  EXPECT_EQ(controller.request(1).outputs, tp1);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[3]);
}

// Inits both ranks of `request` in parallel; both responses.
std::vector<vamp::v1::InitResponse> InitPair(AgentClient& c0, AgentClient& c1,
                                             const vamp::v1::InitRequest& request) {
  auto init_rank = [&](AgentClient* c, int rank) {
    vamp::v1::InitRequest r = request;
    r.mutable_parallel()->set_tp_rank(rank);
    vamp::v1::InitResponse response;
    grpc::Status s = c->Init(r, &response);
    EXPECT_TRUE(s.ok()) << "rank " << rank << ": " << s.error_message();
    return response;
  };
  auto f1 = std::async(std::launch::async, init_rank, &c1, 1);
  vamp::v1::InitResponse r0 = init_rank(&c0, 0);
  return {r0, f1.get()};
}

TEST(AgentTest, TensorParallelPeerDeathFailsPromptlyAndReInitRecovers) {
  const auto g = LoadGoldens();
  auto rank0 = StartAgent();
  auto rank1 = StartAgent();
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  vamp::v1::InitRequest request = TinyInitRequest();
  request.mutable_parallel()->set_tp_size(2);
  request.mutable_parallel()->set_host_transport_address(
      absl::StrCat("127.0.0.1:", testing::PickFreePort()));
  auto c0 = std::make_unique<AgentClient>(rank0->grpc_port());
  auto c1 = std::make_unique<AgentClient>(rank1->grpc_port());
  InitPair(*c0, *c1, request);
  {
    GroupClient group({c0.get(), c1.get()});
    MiniController controller;
    controller.Submit(1, g.prompts[1], 16);
    auto r = group.Step(controller.Next());
    ASSERT_EQ(r[0].error_message(), "");
    controller.Apply(r[0]);
  }
  // Rank 1 dies: rank 0's next forward pass fails at its first all-reduce instead of hanging.
  c1.reset();
  rank1->Shutdown();
  rank1.reset();
  MiniController solo;
  solo.Submit(9, g.prompts[0], 4);
  const auto start = std::chrono::steady_clock::now();
  c0->CloseStream();
  auto lonely = c0->Step(solo.Next());
  ASSERT_TRUE(lonely.ok());
  EXPECT_THAT(lonely->error_message(), HasSubstr("all-reduce"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  // A new rank 1 comes up; the controller initialises both again with the same request: rank 0
  // keeps its model, rebuilds the group and forgets the old requests.
  rank1 = StartAgent();
  ASSERT_NE(rank1, nullptr);
  c1 = std::make_unique<AgentClient>(rank1->grpc_port());
  c0->CloseStream();
  auto again = InitPair(*c0, *c1, request);
  EXPECT_EQ(again[0].memory().kv_blocks(), again[1].memory().kv_blocks());
  GroupClient group({c0.get(), c1.get()});
  MiniController controller;
  controller.Submit(1, g.prompts[1], 16);
  for (int i = 0; i < 100 && !controller.Done(); ++i) {
    auto r = group.Step(controller.Next());
    ASSERT_EQ(r[0].error_message(), "");
    ASSERT_EQ(r[1].error_message(), "");
    controller.Apply(r[0]);
  }
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
}

TEST(AgentTest, TensorParallelRankWithDifferentRequestIsRefused) {
  auto rank0 = StartAgent();
  auto rank1 = StartAgent();
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  AgentClient c0(rank0->grpc_port()), c1(rank1->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.mutable_parallel()->set_tp_size(2);
  request.mutable_parallel()->set_host_transport_address(
      absl::StrCat("127.0.0.1:", testing::PickFreePort()));
  auto f1 = std::async(std::launch::async, [&] {
    vamp::v1::InitRequest r = request;
    r.mutable_parallel()->set_tp_rank(1);
    r.mutable_memory()->set_max_num_seqs(8);  // differs from rank 0
    vamp::v1::InitResponse response;
    return c1.Init(r, &response);
  });
  vamp::v1::InitResponse response;
  grpc::Status s0 = c0.Init(request, &response);
  grpc::Status s1 = f1.get();
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  EXPECT_THAT(s0.error_message(), HasSubstr("different InitRequest"));
  EXPECT_THAT(s1.error_message(), HasSubstr("different InitRequest"));
}

TEST(AgentTest, BadInitRequestNamesFieldAndKeepsServing) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());

  struct Case {
    std::string name;
    std::function<void(vamp::v1::InitRequest*)> edit;
    grpc::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"no model", [](auto* r) { r->clear_model_path(); }, grpc::INVALID_ARGUMENT, "model_path"},
      {"missing model", [](auto* r) { r->set_model_path("/nonexistent/model"); },
       grpc::INVALID_ARGUMENT, "model_path '/nonexistent/model'"},
      {"format", [](auto* r) { r->set_load_format("gguf"); }, grpc::INVALID_ARGUMENT,
       "load_format"},
      {"dtype", [](auto* r) { r->set_dtype("int3"); }, grpc::INVALID_ARGUMENT, "dtype 'int3'"},
      {"dtype case", [](auto* r) { r->set_dtype("BFloat16"); }, grpc::INVALID_ARGUMENT,
       "dtype 'BFloat16'"},
      {"rank", [](auto* r) { r->mutable_parallel()->set_tp_rank(1); }, grpc::INVALID_ARGUMENT,
       "parallel.tp_rank"},
      {"transport", [](auto* r) { r->mutable_parallel()->set_tp_size(2); }, grpc::INVALID_ARGUMENT,
       "parallel.host_transport_address"},
      {"tp split",
       [](auto* r) {
         r->mutable_parallel()->set_tp_size(5);
         r->mutable_parallel()->set_host_transport_address("127.0.0.1:1");
       },
       grpc::INVALID_ARGUMENT, "parallel.tp_size"},
      {"ratio", [](auto* r) { r->mutable_memory()->set_max_offload_ratio(1.5); },
       grpc::INVALID_ARGUMENT, "memory.max_offload_ratio"},
      {"util", [](auto* r) { r->mutable_memory()->set_gpu_memory_utilization(2); },
       grpc::INVALID_ARGUMENT, "memory.gpu_memory_utilization"},
      {"budget", [](auto* r) { r->mutable_memory()->set_gpu_memory_utilization(0.05); },
       grpc::FAILED_PRECONDITION, "memory (gpu_memory_utilization"},
      {"block", [](auto* r) { r->mutable_memory()->set_block_size(-4); }, grpc::INVALID_ARGUMENT,
       "memory.block_size"},
  };
  for (const Case& c : cases) {
    vamp::v1::InitRequest r = TinyInitRequest();
    c.edit(&r);
    vamp::v1::InitResponse response;
    grpc::Status s = client.Init(r, &response);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.field)) << c.name;
  }
  // The checks ran before anything was torn down: the first model still serves.
  MiniController controller;
  controller.Submit(1, LoadGoldens().prompts[1], 4);
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs.size(), 4u);
}

TEST(AgentTest, BadStepNamesFieldAndStreamKeepsServing) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  // Before Init: an error, not a crash.
  vamp::v1::StepRequest empty;
  empty.set_step_id(1);
  auto r = client.Step(empty);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("not initialised"));
  EXPECT_EQ(r->step_id(), 1);
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t pool = init.memory().kv_blocks();

  MiniController controller;
  controller.set_num_blocks(pool);
  controller.Submit(1, LoadGoldens().prompts[1], 16);
  vamp::v1::StepRequest good = controller.Next();

  struct Case {
    std::string name;
    std::function<void(vamp::v1::StepRequest*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown cached",
       [](auto* s) {
         auto* c = s->add_cached_requests();
         c->set_request_id(77);
         c->set_num_scheduled_tokens(1);
       },
       "cached_requests[0].request_id 77 is unknown"},
      {"block range", [&](auto* s) { s->mutable_new_requests(0)->set_block_ids(0, 100000); },
       "new_requests[0].block_ids[0] = 100000 is outside the KV pool"},
      {"token range", [](auto* s) { s->mutable_new_requests(0)->set_prompt_token_ids(2, 999); },
       "new_requests[0].prompt_token_ids[2] = 999"},
      {"min_p", [](auto* s) { s->mutable_new_requests(0)->mutable_sampling()->set_min_p(1.5f); },
       "new_requests[0].sampling.min_p must be in [0, 1]"},
      {"penalty",
       [](auto* s) {
         s->mutable_new_requests(0)->mutable_sampling()->set_repetition_penalty(-1.0f);
       },
       "repetition_penalty >= 0"},
      {"top_p", [](auto* s) { s->mutable_new_requests(0)->mutable_sampling()->set_top_p(3); },
       "new_requests[0].sampling.top_p"},
      {"min_tokens",
       [](auto* s) { s->mutable_new_requests(0)->set_min_tokens(-4); },
       "new_requests[0].min_tokens must be >= 0"},
      {"unknown preempted", [](auto* s) { s->add_preempted_request_ids(5); },
       "preempted_request_ids[0]: request 5 is unknown"},
      {"pool", [&](auto* s) { s->set_num_blocks(pool + 1); }, "num_blocks"},
      {"too many tokens", [](auto* s) { s->mutable_new_requests(0)->set_num_scheduled_tokens(50); },
       "num_tokens 50"},
  };
  for (const Case& c : cases) {
    vamp::v1::StepRequest bad = good;
    c.edit(&bad);
    auto response = client.Step(bad);
    ASSERT_TRUE(response.ok()) << c.name;
    EXPECT_THAT(response->error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(response->sampled().empty()) << c.name;
    EXPECT_TRUE(response->has_memory()) << c.name;
  }
  // Nothing of the rejected steps was applied: the good step and the rest of decoding work.
  auto first = client.Step(good);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->error_message(), "");
  controller.Apply(*first);
  // A duplicate announcement of a running request is refused too.
  vamp::v1::StepRequest again = good;
  again.set_step_id(controller.NextStepId());
  r = client.Step(again);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("new_requests[0].request_id 1 is already known"));
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, LoadGoldens().continuations[1]);
}

TEST(AgentTest, SameInitAgainKeepsModelAndForgetsRequests) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  MiniController controller;
  controller.Submit(1, LoadGoldens().prompts[1], 16);
  auto r = client.Step(controller.Next());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  auto offload = client.Step(RemapOnly(50, vamp::v1::RemapCommand::ACTION_OFFLOAD, 1, 0, "x"));
  ASSERT_EQ(offload->error_message(), "");
  client.CloseStream();
  // A restarted controller initialises again with the same request and reuses request ids.
  const auto start = std::chrono::steady_clock::now();
  vamp::v1::InitResponse again;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &again).ok());
  EXPECT_EQ(again.memory().offloaded_groups(), 1) << "the offload state survives";
  EXPECT_EQ(again.memory_plan_text(), init.memory_plan_text());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  MiniController fresh;
  fresh.set_num_blocks(again.memory().kv_blocks());
  fresh.Submit(1, LoadGoldens().prompts[1], 16);
  fresh.Run(client);
  EXPECT_EQ(fresh.request(1).outputs, LoadGoldens().continuations[1]);
  // A different request rebuilds.
  vamp::v1::InitRequest other = TinyInitRequest();
  other.mutable_memory()->set_max_offload_ratio(0.5);
  vamp::v1::InitResponse rebuilt;
  ASSERT_TRUE(client.Init(other, &rebuilt).ok());
  EXPECT_EQ(rebuilt.memory().offloaded_groups(), 0);
  EXPECT_EQ(rebuilt.memory().max_offload_groups(), 4);
}

TEST(AgentTest, DTypeByDevice) {
  using Kind = DeviceSpec::Kind;
  for (const char* auto_name : {"", "auto", "bfloat16"}) {
    EXPECT_EQ(*ResolveAgentDType(auto_name, Kind::kCuda), DType::kBFloat16) << auto_name;
  }
  EXPECT_EQ(*ResolveAgentDType("float32", Kind::kCuda), DType::kFloat32);
  absl::StatusOr<DType> f16 = ResolveAgentDType("float16", Kind::kCuda);
  ASSERT_FALSE(f16.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(f16.status()));
  EXPECT_THAT(std::string(f16.status().message()), HasSubstr("dtype 'float16'"));
  EXPECT_THAT(std::string(f16.status().message()), HasSubstr("CUDA agents"));
  // The CPU engine is float32 only: every accepted name gives float32.
  for (const char* name : {"", "auto", "float32", "bfloat16", "float16"}) {
    EXPECT_EQ(*ResolveAgentDType(name, Kind::kCpu), DType::kFloat32) << name;
  }
  for (Kind kind : {Kind::kCpu, Kind::kCuda}) {
    absl::StatusOr<DType> bad = ResolveAgentDType("int8", kind);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("dtype 'int8'"));
  }
}

TEST(AgentTest, CpuAgentRefusesCreateCollectiveId) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  std::string id;
  grpc::Status s = client.CreateCollectiveId(&id);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("runs on cpu"));
  EXPECT_TRUE(id.empty());
  // Authenticated like every Agent call.
  AgentOptions options = TinyAgentOptions();
  options.auth_token = "secret";
  auto locked = StartAgent(options);
  ASSERT_NE(locked, nullptr);
  AgentClient anonymous(locked->grpc_port());
  EXPECT_EQ(anonymous.CreateCollectiveId(&id).error_code(), grpc::UNAUTHENTICATED);
}

// The agent's flags as its main() reads them (argv[0] added).
absl::StatusOr<AgentOptions> ParseAgentFlags(std::vector<std::string> args) {
  args.insert(args.begin(), "vamp-agent");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  absl::StatusOr<CommandLine> cli =
      ParseCommandLine(AgentConfigSchema(), static_cast<int>(argv.size()), argv.data());
  if (!cli.ok()) return cli.status();
  return AgentOptionsFromConfig(cli->config);
}

TEST(AgentTest, CudaDeviceWithoutOrdinalFollowsTheRank) {
  auto parse_insecure = [](std::vector<std::string> args) {
    args.push_back("--insecure_no_auth");
    return ParseAgentFlags(std::move(args));
  };
  struct Case {
    std::vector<std::string> args;
    int ordinal;
  };
  for (const Case& c : std::vector<Case>{{{"--device=cuda", "--rank=1"}, 1},
                                         {{"--device=cuda"}, 0},
                                         {{"--device=cuda:3", "--rank=1"}, 3},
                                         {{"--device=cuda:0", "--rank=1"}, 0}}) {
    absl::StatusOr<AgentOptions> o = parse_insecure(c.args);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->device.kind, DeviceSpec::Kind::kCuda);
    EXPECT_EQ(o->device.ordinal, c.ordinal) << c.args[0];
  }
  absl::StatusOr<AgentOptions> cpu = parse_insecure({"--device=cpu", "--rank=1"});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device.kind, DeviceSpec::Kind::kCpu);
}

// Issue 14: an agent runs with a token (from --auth_token_file, or from the environment of the
// controller that spawned it) unless told explicitly to run without one.
TEST(AgentTest, TokenRequiredUnlessInsecureFlag) {
  absl::StatusOr<AgentOptions> none = ParseAgentFlags({});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("auth_token_file"));
  EXPECT_THAT(none.status().message(), HasSubstr("insecure_no_auth"));
  absl::StatusOr<AgentOptions> insecure = ParseAgentFlags({"--insecure_no_auth"});
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_TRUE(insecure->auth_token.empty());

  ASSERT_EQ(::setenv("VAMP_AGENT_AUTH_TOKEN", "from-the-controller-0123", 1), 0);
  absl::StatusOr<AgentOptions> spawned = ParseAgentFlags({});
  ASSERT_TRUE(spawned.ok()) << spawned.status();
  EXPECT_EQ(spawned->auth_token, "from-the-controller-0123");
  EXPECT_EQ(std::getenv("VAMP_AGENT_AUTH_TOKEN"), nullptr) << "the token stays in the environment";

  const std::string two_lines = ::testing::TempDir() + "/agent_two_line_token";
  std::ofstream(two_lines) << "line-one-hunter2\nline-two-hunter2\n";
  absl::StatusOr<AgentOptions> bad = ParseAgentFlags({"--auth_token_file=" + two_lines});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(two_lines));
  EXPECT_THAT(bad.status().message(), ::testing::Not(HasSubstr("hunter2")));
}

TEST(AgentTest, DummyWeightsLoad) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.set_load_format("dummy");
  request.set_dummy_seed(7);
  request.set_dtype("bfloat16");  // accepted; the CPU engine computes in float32
  vamp::v1::InitResponse init;
  grpc::Status s = client.Init(request, &init);
  ASSERT_TRUE(s.ok()) << s.error_message();
  MiniController controller;
  controller.Submit(1, LoadGoldens().prompts[1], 4);
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs.size(), 4u);
}

TEST(AgentTest, AuthTokenRequiredWhenConfigured) {
  AgentOptions options = TinyAgentOptions();
  options.auth_token = "s3cret-token";
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  vamp::v1::GetStatsResponse stats;
  AgentClient none(agent->grpc_port());
  grpc::Status s = none.GetStats(&stats);
  EXPECT_EQ(s.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("s3cret")));
  AgentClient wrong(agent->grpc_port(), "s3cret-tokeX");
  EXPECT_EQ(wrong.GetStats(&stats).error_code(), grpc::UNAUTHENTICATED);
  vamp::v1::InitResponse init;
  EXPECT_EQ(wrong.Init(TinyInitRequest(), &init).error_code(), grpc::UNAUTHENTICATED);
  vamp::v1::CapacityResponse capacity;
  EXPECT_EQ(wrong.Capacity(1, &capacity).error_code(), grpc::UNAUTHENTICATED);
  auto step = wrong.Step(vamp::v1::StepRequest());
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("invalid auth token"));
  AgentClient right(agent->grpc_port(), "s3cret-token");
  EXPECT_TRUE(right.GetStats(&stats).ok());
  EXPECT_TRUE(right.Init(TinyInitRequest(), &init).ok());
  auto ok = right.Step(vamp::v1::StepRequest());
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->error_message(), "");
  // Health stays open for probes.
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", agent->grpc_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_TRUE(health->Check(&context, {}, &response).ok());
}

TEST(AgentTest, MetricsPassPromtool) {
  AgentOptions options = TinyAgentOptions();
  options.metrics_address = "127.0.0.1:0";
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  ASSERT_GT(agent->metrics_port(), 0);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  MiniController controller;
  controller.Submit(1, LoadGoldens().prompts[1], 3);
  controller.Run(client);
  auto offload = client.Step(
      RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD, 2, 0, "m"));
  ASSERT_EQ(offload->error_message(), "");
  absl::StatusOr<std::string> body = testing::ScrapeMetrics(agent->metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("vamp_agent_initialized 1"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_offloaded_groups 2"));
  EXPECT_THAT(*body,
              HasSubstr(absl::StrCat("vamp_agent_kv_pool_blocks ", offload->memory().kv_blocks())));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_offloaded_expert_bytes 147456"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_resident_expert_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_kv_pool_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_staging_buffer_bytes"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_staging_stall_seconds_bucket"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_step_duration_seconds_count"));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_remap_duration_seconds_bucket{action=\"offload\""));
  EXPECT_THAT(*body, HasSubstr("vamp_agent_sampled_tokens_total 3"));
  absl::Status check = testing::PromtoolCheckMetrics(*body);
  if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
  EXPECT_TRUE(check.ok()) << check;
}

// The GPU serving cases are in agent_cuda_test.cc.
TEST(AgentTest, CudaDeviceNeedsCudaBuildAndNcclIdForTensorParallel) {
  AgentOptions options = TinyAgentOptions();
  options.device.kind = DeviceSpec::Kind::kCuda;
  absl::StatusOr<std::unique_ptr<AgentService>> agent = AgentService::Start(options);
#if VAMP_HAVE_CUDA
  if (!agent.ok()) GTEST_SKIP() << "no usable CUDA device: " << agent.status();
  AgentClient client((*agent)->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.mutable_parallel()->set_tp_size(2);
  request.mutable_parallel()->set_host_transport_address("127.0.0.1:1");  // not what CUDA uses
  vamp::v1::InitResponse init;
  grpc::Status s = client.Init(request, &init);
#if VAMP_AGENT_CUDA
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("parallel.nccl_unique_id has 0 bytes"));
#else
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("VAMP_AGENT_CUDA"));
#endif
#else
  ASSERT_FALSE(agent.ok());
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("'device'"));
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("without CUDA"));
#endif
  EXPECT_FALSE(ParseDevice("tpu:0").ok());
  EXPECT_EQ(ParseDevice("cuda:3")->ordinal, 3);
}

// A stand-in for the controller's AgentRegistry.
class FakeRegistry final : public vamp::v1::AgentRegistry::Service {
 public:
  grpc::Status Register(grpc::ServerContext* context, const vamp::v1::RegisterRequest* request,
                        vamp::v1::RegisterResponse* response) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    response->set_rank(request->rank() < 0 ? 0 : request->rank());
    response->set_world_size(1);
    response->set_controller_id(id_);
    response->set_health_service(health_service());
    return grpc::Status::OK;
  }
  std::vector<vamp::v1::RegisterRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::string health_service() const { return "vamp.controller." + id_; }
  std::string id_ = "controller-1";

 private:
  absl::Mutex mu_;
  std::vector<vamp::v1::RegisterRequest> requests_;
};

TEST(AgentTest, RegistersAndRegistersAgainAfterControllerRestart) {
  FakeRegistry registry;
  auto controller = GrpcServer::Start("127.0.0.1:0", {&registry});
  ASSERT_TRUE(controller.ok()) << controller.status();
  (*controller)->SetServing(registry.health_service(), true);
  const int port = (*controller)->port();
  AgentOptions options = TinyAgentOptions();
  options.controller_address = absl::StrCat("127.0.0.1:", port);
  options.auth_token = "tok";
  options.registration.max_backoff_ms = 200;
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->registrar()->WaitForRegistrations(1, 10000));
  auto requests = registry.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].auth_token(), "tok");
  EXPECT_EQ(requests[0].rank(), -1);
  EXPECT_EQ(requests[0].device(), "cpu");
  EXPECT_EQ(requests[0].agent_address(), absl::StrCat("127.0.0.1:", agent->grpc_port()));
  EXPECT_EQ(requests[0].device_total_bytes(), uint64_t{8} << 20);
  EXPECT_FALSE(requests[0].version().empty());

  // The controller restarts on the same port: the agent notices and registers again, asking for
  // the rank it had.
  (*controller)->Shutdown(0);
  controller->reset();
  FakeRegistry restarted;
  restarted.id_ = "controller-2";
  absl::StatusOr<std::unique_ptr<GrpcServer>> again;
  for (int i = 0; i < 50; ++i) {
    again = GrpcServer::Start(absl::StrCat("127.0.0.1:", port), {&restarted});
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  (*again)->SetServing(restarted.health_service(), true);
  ASSERT_TRUE(agent->registrar()->WaitForRegistrations(2, 15000));
  ASSERT_GE(restarted.requests().size(), 1u);
  EXPECT_EQ(restarted.requests()[0].rank(), 0);
  EXPECT_EQ(agent->registrar()->last_response().controller_id(), "controller-2");
}

TEST(AgentTest, RegistrationRetriesUntilControllerStarts) {
  const int port = testing::PickFreePort();
  AgentOptions options = TinyAgentOptions();
  options.controller_address = absl::StrCat("127.0.0.1:", port);
  options.registration.initial_backoff_ms = 50;
  options.registration.max_backoff_ms = 200;
  auto agent = StartAgent(options);
  ASSERT_NE(agent, nullptr);
  EXPECT_FALSE(agent->registrar()->WaitForRegistrations(1, 500));
  FakeRegistry registry;
  auto controller = GrpcServer::Start(absl::StrCat("127.0.0.1:", port), {&registry});
  ASSERT_TRUE(controller.ok()) << controller.status();
  EXPECT_TRUE(agent->registrar()->WaitForRegistrations(1, 10000));
}

// The real binary: flags, ready file, gRPC, SIGTERM.
TEST(AgentBinaryTest, ServesWithReadyFile) {
  const std::string binary = std::string(VAMP_BINARY_DIR) + "/agent/vamp-agent";
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  const std::string dir = ::testing::TempDir() + "/vamp_agent_bin_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string ready = dir + "/ready.json";
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "bin-token\n";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string ready_flag = "--ready_file=" + ready;
    const std::string token_flag = "--auth_token_file=" + token_file;
    ::execl(binary.c_str(), binary.c_str(), "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
            "--host_page_bytes=4096", "--host_memory_bytes=8388608", "--log_level=warning",
            ready_flag.c_str(), token_flag.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  nlohmann::json ports;
  for (int i = 0; i < 200 && ports.is_null(); ++i) {
    std::ifstream in(ready);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      ports = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (ports.is_discarded()) ports = nullptr;
    }
    if (ports.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(ports.is_null()) << "no ready file";
  const int grpc_port = ports["grpc_port"].get<int>();
  EXPECT_GT(ports["metrics_port"].get<int>(), 0);
  EXPECT_EQ(ports["address"].get<std::string>(), absl::StrCat("127.0.0.1:", grpc_port));
  {
    AgentClient client(grpc_port, "bin-token");
    vamp::v1::InitResponse init;
    grpc::Status s = client.Init(TinyInitRequest(), &init);
    ASSERT_TRUE(s.ok()) << s.error_message();
    MiniController controller;
    controller.Submit(1, LoadGoldens().prompts[1], 16);
    controller.Run(client);
    EXPECT_EQ(controller.request(1).outputs, LoadGoldens().continuations[1]);
    vamp::v1::GetStatsResponse stats;
    AgentClient anonymous(grpc_port);
    EXPECT_EQ(anonymous.GetStats(&stats).error_code(), grpc::UNAUTHENTICATED);
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

TEST(AgentBinaryTest, BadFlagsExitWithUsageError) {
  const std::string binary = std::string(VAMP_BINARY_DIR) + "/agent/vamp-agent";
  const std::string cmd = binary + " --device=tpu 2>/dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string missing = binary + " --auth_token_file=/nonexistent/token 2>/dev/null";
  const int status2 = std::system(missing.c_str());
  ASSERT_TRUE(WIFEXITED(status2));
  EXPECT_EQ(WEXITSTATUS(status2), 2);
}

}  // namespace
}  // namespace vamp
