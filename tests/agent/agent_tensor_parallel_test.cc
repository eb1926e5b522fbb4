// vamp-agent's tensor parallelism on loopback, CPU: TP=2 across two agents equals one, a remap one
// rank refuses runs the step on no rank, a dead peer fails promptly and a new Init recovers, ranks
// with different requests are refused; NCCL ids and CUDA groups refused where they cannot work.
#include <chrono>
#include <future>

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

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

// Rank 0 can apply a remap riding a decode step and rank 1 cannot: the ranks agree before the
// forward pass, so neither runs the step (rank 0 alone would wait in its first all-reduce), both
// refuse it, and rank 1 stays as it was. The step sent again with the rollback runs on both, an
// offload both can apply then keeps equal block counts, and the tokens are TP=1's.
TEST(AgentTest, TensorParallelRemapOneRankRefusesRunsOnNoRank) {
  const auto g = LoadGoldens();
  auto rank0 = StartAgent();
  auto rank1 = StartAgent();
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  AgentClient c0(rank0->grpc_port()), c1(rank1->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.mutable_parallel()->set_tp_size(2);
  request.mutable_parallel()->set_host_transport_address(
      absl::StrCat("127.0.0.1:", testing::PickFreePort()));
  const std::vector<vamp::v1::InitResponse> init = InitPair(c0, c1, request);
  const int64_t baseline = init[0].memory().kv_blocks();
  ASSERT_EQ(init[1].memory().kv_blocks(), baseline);
  GroupClient group({&c0, &c1});
  MiniController controller;
  controller.set_num_blocks(baseline);
  controller.Submit(1, g.prompts[3], 16);
  for (int i = 0; i < 4; ++i) {
    auto r = group.Step(controller.Next());
    ASSERT_EQ(r[0].error_message(), "");
    ASSERT_EQ(r[1].error_message(), "");
    controller.Apply(r[0]);
  }
  const int64_t grown = std::min(KvBlocksAfter(init[0], init[0].memory(), 1),
                                 KvBlocksAfter(init[1], init[1].memory(), 1));
  ASSERT_GT(grown, baseline);
  auto with_offload = [](vamp::v1::StepRequest step, int64_t expected, const std::string& id) {
    vamp::v1::RemapCommand& c = *step.add_remaps();
    c.set_action(vamp::v1::RemapCommand::ACTION_OFFLOAD);
    c.set_num_groups(1);
    c.set_expected_kv_blocks(expected);
    c.set_remap_id(id);
    return step;
  };
  const vamp::v1::StepRequest step = controller.Next();
  // Rank 1 is asked for more blocks than it can have (as if mapping its pages had failed).
  ASSERT_TRUE(c0.Write(with_offload(step, grown, "tp-refused")));
  ASSERT_TRUE(c1.Write(with_offload(step, grown + 1000, "tp-refused")));
  vamp::v1::StepResponse r0, r1;
  ASSERT_TRUE(c0.Read(&r0));
  ASSERT_TRUE(c1.Read(&r1));
  EXPECT_TRUE(r0.refused()) << r0.error_message();
  EXPECT_TRUE(r1.refused()) << r1.error_message();
  EXPECT_THAT(r0.error_message(), HasSubstr("failed on another rank"));
  EXPECT_THAT(r1.error_message(), HasSubstr("expected_kv_blocks"));
  EXPECT_TRUE(r0.sampled().empty());
  EXPECT_EQ(r0.memory().kv_blocks(), grown) << "applied, until the controller rolls it back";
  EXPECT_EQ(r1.memory().kv_blocks(), baseline);
  EXPECT_EQ(r1.memory().offloaded_groups(), 0);

  // The same work again, with the rollback: both ranks are back at the baseline and run it.
  vamp::v1::StepRequest again = step;
  again.set_step_id(controller.NextStepId());
  again.add_rollback_remap_ids("tp-refused");
  auto r = group.Step(again);
  ASSERT_EQ(r[0].error_message(), "");
  ASSERT_EQ(r[1].error_message(), "");
  EXPECT_EQ(r[0].memory().kv_blocks(), baseline);
  EXPECT_EQ(r[1].memory().kv_blocks(), baseline);
  EXPECT_EQ(r[0].memory().offloaded_groups(), 0);
  ASSERT_EQ(r[0].sampled_size(), r[1].sampled_size());
  controller.Apply(r[0]);

  // An offload both ranks can apply, riding the next decode step: equal block counts after it.
  controller.set_num_blocks(grown);
  r = group.Step(with_offload(controller.Next(), grown, "tp-ok"));
  ASSERT_EQ(r[0].error_message(), "");
  ASSERT_EQ(r[1].error_message(), "");
  EXPECT_EQ(r[0].memory().kv_blocks(), grown);
  EXPECT_EQ(r[1].memory().kv_blocks(), grown);
  EXPECT_EQ(r[0].memory().offloaded_groups(), 1);
  EXPECT_EQ(r[1].memory().offloaded_groups(), 1);
  controller.Apply(r[0]);
  for (int i = 0; i < 100 && !controller.Done(); ++i) {
    r = group.Step(controller.Next());
    ASSERT_EQ(r[0].error_message(), "");
    ASSERT_EQ(r[1].error_message(), "");
    ASSERT_EQ(r[0].sampled_size(), r[1].sampled_size());
    for (int k = 0; k < r[0].sampled_size(); ++k) {
      EXPECT_EQ(r[0].sampled(k).token_ids(0), r[1].sampled(k).token_ids(0));
    }
    controller.Apply(r[0]);
  }
  EXPECT_EQ(controller.request(1).outputs, g.continuations[3]);
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

}  // namespace
}  // namespace vamp::testing
