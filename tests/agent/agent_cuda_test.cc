// vamp-agent on GPUs, in process over gRPC on loopback.
//   TP=1 (cuda:0): the tiny checkpoint's greedy continuations match the HF goldens (float32),
//   offloading expert groups mid-decode and restoring them keeps the sampled tokens identical (a
//   dummy-weight model whose float32 experts are 1.5 MiB, so 2 MiB pages hold groups of 4 and
//   offloading is possible), tp_size > 1 without an NCCL unique id and dtype float16 are refused,
//   and the default dtype is bfloat16.
//   TP=2 (cuda:0 and cuda:1, NCCL; skipped with fewer than 2 devices): float32 greedy decoding
//   matches the goldens on both ranks, an offload/restore mid-decode keeps the tokens, bfloat16
//   decodes identically after a re-initialisation with a fresh id, a rank waiting in a collective
//   for a silent peer is released by Abort and the group re-forms, and ranks given different
//   requests are refused.
// Every case skips without a usable CUDA device, or when the agent is built without
// -DVAMP_AGENT_CUDA=ON.
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#if VAMP_AGENT_CUDA
#include <cuda_runtime_api.h>
#endif

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp {
namespace {

using testing::AgentClient;
using testing::GroupClient;
using ::testing::HasSubstr;
using testing::KvBlocksAfter;
using testing::LoadGoldens;
using testing::MiniController;
using testing::RemapOnly;
using testing::TinyInitRequest;

// Fraction of the device the agent plans with: enough for these models and a few hundred MiB of
// KV, small enough that mapping the KV pool stays quick on a large GPU.
constexpr double kGpuMemoryUtilization = 0.02;

class AgentCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !VAMP_AGENT_CUDA
    GTEST_SKIP() << "vamp_agent was built without -DVAMP_AGENT_CUDA=ON (agent/CMakeLists.txt)";
#endif
    AgentOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics_address = "";
    o.device.kind = DeviceSpec::Kind::kCuda;
    o.device.ordinal = 0;
    absl::StatusOr<std::unique_ptr<AgentService>> agent = AgentService::Start(o);
    if (!agent.ok()) GTEST_SKIP() << "no usable CUDA device: " << agent.status();
    agent_ = std::move(*agent);
    client_ = std::make_unique<AgentClient>(agent_->grpc_port());
  }

  std::unique_ptr<AgentService> agent_;
  std::unique_ptr<AgentClient> client_;
};

vamp::v1::InitRequest TinyGpuInitRequest() {
  vamp::v1::InitRequest r = TinyInitRequest();
  r.mutable_memory()->set_gpu_memory_utilization(kGpuMemoryUtilization);
  r.mutable_memory()->set_max_offload_ratio(0.0);  // 18 KiB experts: nothing fits a 2 MiB page
  return r;
}

// The dummy-weight model of tests/data/small-qwen3-moe-gpu, VAMP-75.
vamp::v1::InitRequest SmallGpuInitRequest() {
  vamp::v1::InitRequest r = TinyGpuInitRequest();
  r.set_model_path(testing::TestDataDir() + "/small-qwen3-moe-gpu");
  r.set_load_format("dummy");
  r.set_dummy_seed(7);
  r.mutable_memory()->set_max_offload_ratio(0.75);
  return r;
}

TEST_F(AgentCudaTest, GreedyDecodingMatchesGoldens) {
  vamp::v1::InitResponse init;
  grpc::Status s = client_->Init(TinyGpuInitRequest(), &init);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(init.memory().device(), "cuda:0");
  EXPECT_GT(init.memory().device_total_bytes(), uint64_t{1} << 30);
  EXPECT_GT(init.memory().kv_blocks(), 100);
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[3], 16);  // batched with another request
  controller.Run(*client_);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[3]);
}

TEST_F(AgentCudaTest, TensorParallelNeedsTheNcclUniqueIdAndFloat16IsRefused) {
  vamp::v1::InitRequest r = TinyGpuInitRequest();
  r.mutable_parallel()->set_tp_size(2);
  r.mutable_parallel()->set_host_transport_address("127.0.0.1:1");
  vamp::v1::InitResponse init;
  grpc::Status s = client_->Init(r, &init);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("parallel.nccl_unique_id has 0 bytes"));
  r.mutable_parallel()->set_nccl_unique_id(std::string(100, 'x'));
  s = client_->Init(r, &init);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("parallel.nccl_unique_id has 100 bytes"));
  vamp::v1::InitRequest f16 = TinyGpuInitRequest();
  f16.set_dtype("float16");
  s = client_->Init(f16, &init);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("dtype 'float16'"));
  // The agent still serves a valid request afterwards.
  s = client_->Init(TinyGpuInitRequest(), &init);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // And hands out NCCL unique ids, a new one each time.
  std::string a, b;
  ASSERT_TRUE(client_->CreateCollectiveId(&a).ok());
  ASSERT_TRUE(client_->CreateCollectiveId(&b).ok());
  EXPECT_EQ(a.size(), 128u);
  EXPECT_NE(a, b);
}

TEST_F(AgentCudaTest, DefaultDTypeIsBFloat16) {
  vamp::v1::InitRequest r = SmallGpuInitRequest();
  vamp::v1::InitResponse f32;
  ASSERT_TRUE(client_->Init(r, &f32).ok());
  r.clear_dtype();  // "" = auto: bfloat16 on a CUDA agent
  vamp::v1::InitResponse bf16;
  grpc::Status s = client_->Init(r, &bf16);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(bf16.memory_plan_text(), ::testing::Not(::testing::IsEmpty()));
  // Experts of half the bytes: groups of twice as many experts fill the same 2 MiB pages.
  EXPECT_EQ(bf16.experts_per_group(), 2 * f32.experts_per_group());
  EXPECT_LT(bf16.memory().other_weight_bytes(), f32.memory().other_weight_bytes());
  MiniController controller;
  controller.set_num_blocks(bf16.memory().kv_blocks());
  controller.Submit(1, LoadGoldens().prompts[1], 8);
  controller.Run(*client_);
  EXPECT_EQ(controller.request(1).outputs.size(), 8u);
}

// Two prompts decoded for `tokens` tokens; with `groups` > 0, that many groups are offloaded after
// 6 steps and restored 6 steps later.
struct DecodeRun {
  std::vector<int32_t> a, b;
  uint64_t staged_bytes = 0;  // staged while offloaded
};

DecodeRun DecodeWithRemaps(AgentClient& client, const vamp::v1::InitResponse& init,
                           int32_t groups) {
  const auto g = LoadGoldens();
  const int64_t baseline = init.memory().kv_blocks();
  MiniController controller;
  controller.set_num_blocks(baseline);
  controller.Submit(1, g.prompts[1], 24);
  controller.Submit(2, g.prompts[2], 24);
  DecodeRun run;
  auto step = [&]() -> uint64_t {
    auto r = client.Step(controller.Next());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    EXPECT_EQ(r->error_message(), "");
    controller.Apply(*r);
    return r->timings().staged_bytes();
  };
  for (int i = 0; i < 6; ++i) step();
  if (groups > 0) {
    const int64_t expected = KvBlocksAfter(init, init.memory(), groups);
    EXPECT_GT(expected, baseline);
    auto offload =
        client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD,
                              groups, expected, "offload-1"));
    EXPECT_TRUE(offload.ok());
    if (offload.ok()) {
      EXPECT_EQ(offload->error_message(), "");
      EXPECT_EQ(offload->memory().offloaded_groups(), groups);
      EXPECT_GT(offload->memory().offloaded_expert_bytes(), 0u);
      controller.set_num_blocks(offload->memory().kv_blocks());
    }
  }
  for (int i = 0; i < 6; ++i) run.staged_bytes += step();
  if (groups > 0) {
    auto restore =
        client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE,
                              groups, baseline, "restore-1"));
    EXPECT_TRUE(restore.ok());
    if (restore.ok()) {
      EXPECT_EQ(restore->error_message(), "");
      EXPECT_EQ(restore->memory().offloaded_groups(), 0);
      EXPECT_EQ(restore->memory().kv_blocks(), baseline);
    }
    controller.set_num_blocks(baseline);
  }
  controller.Run(client);
  run.a = controller.request(1).outputs;
  run.b = controller.request(2).outputs;
  return run;
}

TEST_F(AgentCudaTest, OffloadMidDecodeThenRestoreKeepsTokens) {
  vamp::v1::InitResponse init;
  grpc::Status s = client_->Init(SmallGpuInitRequest(), &init);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(init.experts_per_group(), 4);  // 1.5 MiB experts on 2 MiB pages
  ASSERT_GE(init.memory().max_offload_groups(), 2);

  const DecodeRun want = DecodeWithRemaps(*client_, init, /*groups=*/0);
  ASSERT_EQ(want.a.size(), 24u);
  ASSERT_EQ(want.b.size(), 24u);
  EXPECT_EQ(want.staged_bytes, 0u);

  for (int32_t groups : {1, 2}) {
    // The same InitRequest keeps weights and memory and forgets the requests.
    ASSERT_TRUE(client_->Init(SmallGpuInitRequest(), &init).ok());
    ASSERT_EQ(init.memory().offloaded_groups(), 0);
    const DecodeRun got = DecodeWithRemaps(*client_, init, groups);
    EXPECT_EQ(got.a, want.a) << groups << " group(s)";
    EXPECT_EQ(got.b, want.b) << groups << " group(s)";
    EXPECT_GT(got.staged_bytes, 0u) << "offloaded experts are staged every step";
  }
}

// --- Tensor parallelism over NCCL: two agents on cuda:0 and cuda:1 in this process. ---

class AgentCudaTpTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !VAMP_AGENT_CUDA
    GTEST_SKIP() << "vamp_agent was built without -DVAMP_AGENT_CUDA=ON (agent/CMakeLists.txt)";
#else
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
      GTEST_SKIP() << "needs 2 CUDA devices, found " << devices;
    }
    // NVLink multicast is not needed and the shared GPU hosts keep it off; an explicit setting in
    // the environment wins.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    for (int r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(StartRank(r));
#endif
  }

  void StartRank(int r) {
    AgentOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics_address = "";
    o.device.kind = DeviceSpec::Kind::kCuda;
    o.device.ordinal = r;
    o.tp_connect_timeout_ms = 60000;
    o.tp_io_timeout_ms = 60000;
    absl::StatusOr<std::unique_ptr<AgentService>> agent = AgentService::Start(o);
    ASSERT_TRUE(agent.ok()) << "cuda:" << r << ": " << agent.status();
    agents_[r] = std::move(*agent);
    clients_[r] = std::make_unique<AgentClient>(agents_[r]->grpc_port());
  }

  // What the controller does (controller/serving/agent_group.h): a fresh id from rank 0, then
  // both Inits concurrently. `edit_rank1` changes rank 1's request only.
  std::vector<grpc::Status> InitGroup(const vamp::v1::InitRequest& base,
                                      std::vector<vamp::v1::InitResponse>* responses,
                                      std::function<void(vamp::v1::InitRequest*)> edit_rank1 = {}) {
    std::string id;
    grpc::Status s = clients_[0]->CreateCollectiveId(&id);
    if (!s.ok()) return {s, s};
    responses->assign(2, {});
    auto init = [&](int r) {
      vamp::v1::InitRequest req = base;
      req.mutable_parallel()->set_tp_size(2);
      req.mutable_parallel()->set_tp_rank(r);
      req.mutable_parallel()->set_nccl_unique_id(id);
      if (r == 1 && edit_rank1) edit_rank1(&req);
      return clients_[r]->Init(req, &(*responses)[r]);
    };
    auto f1 = std::async(std::launch::async, init, 1);
    grpc::Status s0 = init(0);
    return {s0, f1.get()};
  }

  void InitGroupOk(const vamp::v1::InitRequest& base,
                   std::vector<vamp::v1::InitResponse>* responses) {
    std::vector<grpc::Status> s = InitGroup(base, responses);
    ASSERT_TRUE(s[0].ok()) << "rank 0: " << s[0].error_message();
    ASSERT_TRUE(s[1].ok()) << "rank 1: " << s[1].error_message();
    ASSERT_EQ((*responses)[0].memory().kv_blocks(), (*responses)[1].memory().kv_blocks());
    inits_ = *responses;
  }

  // Greedy decoding of prompts[1] and prompts[3] on both ranks in lockstep; with `groups` > 0,
  // that many groups are offloaded on both ranks after 4 steps and restored 4 steps later. Every
  // step's tokens must agree across the ranks.
  std::vector<std::vector<int32_t>> Decode(int64_t kv_blocks, int32_t tokens, int32_t groups) {
    const auto g = LoadGoldens();
    GroupClient group({clients_[0].get(), clients_[1].get()});
    MiniController controller;
    controller.set_num_blocks(kv_blocks);
    controller.Submit(1, g.prompts[1], tokens);
    controller.Submit(2, g.prompts[3], tokens);
    std::vector<vamp::v1::RankMemory> memory = {inits_[0].memory(), inits_[1].memory()};
    auto remap = [&](vamp::v1::RemapCommand::Action action, const std::string& id) {
      // The controller's synchronized remap: the cross-rank minimum of what the ranks' declared
      // geometry gives.
      const int32_t delta = action == vamp::v1::RemapCommand::ACTION_OFFLOAD ? groups : -groups;
      const int64_t expected = std::min(KvBlocksAfter(inits_[0], memory[0], delta),
                                        KvBlocksAfter(inits_[1], memory[1], delta));
      auto r = group.Step(RemapOnly(controller.NextStepId(), action, groups, expected, id));
      memory = {r[0].memory(), r[1].memory()};
      EXPECT_EQ(r[0].error_message(), "");
      EXPECT_EQ(r[1].error_message(), "");
      EXPECT_EQ(r[0].memory().kv_blocks(), r[1].memory().kv_blocks());
      controller.set_num_blocks(r[0].memory().kv_blocks());
    };
    for (int i = 0; i < 1000 && !controller.Done(); ++i) {
      if (groups > 0 && i == 4) remap(vamp::v1::RemapCommand::ACTION_OFFLOAD, "tp-offload");
      if (groups > 0 && i == 8) remap(vamp::v1::RemapCommand::ACTION_RESTORE, "tp-restore");
      auto r = group.Step(controller.Next());
      EXPECT_EQ(r[0].error_message(), "") << "step " << i;
      EXPECT_EQ(r[1].error_message(), "") << "step " << i;
      if (!r[0].error_message().empty() || !r[1].error_message().empty()) break;
      EXPECT_EQ(r[0].sampled_size(), r[1].sampled_size());
      for (int k = 0; k < std::min(r[0].sampled_size(), r[1].sampled_size()); ++k) {
        EXPECT_EQ(r[0].sampled(k).token_ids(0), r[1].sampled(k).token_ids(0)) << "step " << i;
      }
      controller.Apply(r[0]);
    }
    return {controller.request(1).outputs, controller.request(2).outputs};
  }

  std::unique_ptr<AgentService> agents_[2];
  std::unique_ptr<AgentClient> clients_[2];
  std::vector<vamp::v1::InitResponse> inits_;  // the last InitGroupOk's
};

TEST_F(AgentCudaTpTest, Float32GreedyDecodingMatchesGoldensOnBothRanks) {
  std::vector<vamp::v1::InitResponse> init;
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(TinyGpuInitRequest(), &init));
  EXPECT_EQ(init[0].memory().device(), "cuda:0");
  EXPECT_EQ(init[1].memory().device(), "cuda:1");
  EXPECT_EQ(init[0].memory().rank(), 0);
  EXPECT_EQ(init[1].memory().rank(), 1);
  const auto g = LoadGoldens();
  const auto out = Decode(init[0].memory().kv_blocks(), 16, /*groups=*/0);
  EXPECT_EQ(out[0], g.continuations[1]);
  EXPECT_EQ(out[1], g.continuations[3]);
}

TEST_F(AgentCudaTpTest, OffloadAndRestoreMidDecodeKeepTokens) {
  // float32 experts of the small model split over 2 ranks: 0.75 MiB, groups of 8 on 2 MiB pages.
  std::vector<vamp::v1::InitResponse> init;
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(SmallGpuInitRequest(), &init));
  ASSERT_GE(init[0].memory().max_offload_groups(), 1);
  const auto want = Decode(init[0].memory().kv_blocks(), 16, /*groups=*/0);
  ASSERT_EQ(want[0].size(), 16u);
  // A new group (fresh id) with the same request: the same model and tokens.
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(SmallGpuInitRequest(), &init));
  const auto got = Decode(init[0].memory().kv_blocks(), 16, /*groups=*/1);
  EXPECT_EQ(got, want);
}

TEST_F(AgentCudaTpTest, BFloat16DecodesIdenticallyAfterReInitialisation) {
  vamp::v1::InitRequest r = SmallGpuInitRequest();
  r.set_dtype("bfloat16");
  std::vector<vamp::v1::InitResponse> init;
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(r, &init));
  const auto first = Decode(init[0].memory().kv_blocks(), 12, /*groups=*/0);
  ASSERT_EQ(first[0].size(), 12u);
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(r, &init));
  EXPECT_EQ(Decode(init[0].memory().kv_blocks(), 12, /*groups=*/0), first);
}

TEST_F(AgentCudaTpTest, AbortReleasesARankWaitingForASilentPeerAndTheGroupReforms) {
  std::vector<vamp::v1::InitResponse> init;
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(TinyGpuInitRequest(), &init));
  // Rank 1 stays alive but never gets the step (a hung peer: the case NCCL cannot notice), so
  // rank 0's forward pass waits in its first all-reduce until Abort, what a re-Init or a shutdown
  // calls. (Rank 1 is not killed: in one process its freed buffers would be rank 0's peer memory.)
  MiniController solo;
  solo.set_num_blocks(init[0].memory().kv_blocks());
  solo.Submit(9, LoadGoldens().prompts[0], 4);
  auto step = std::async(std::launch::async, [&] { return clients_[0]->Step(solo.Next()); });
  ASSERT_EQ(step.wait_for(std::chrono::seconds(2)), std::future_status::timeout)
      << "the all-reduce should wait for rank 1";
  const auto start = std::chrono::steady_clock::now();
  agents_[0]->engine().Abort(absl::AbortedError("test: peer is silent"));
  ASSERT_EQ(step.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "Abort did not release the rank waiting in the collective";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  absl::StatusOr<vamp::v1::StepResponse> r = step.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->error_message(), HasSubstr("NCCL group"));
  EXPECT_THAT(r->error_message(), HasSubstr("test: peer is silent"));
  // Later steps fail at once, saying so, until the next Init.
  solo.Submit(10, LoadGoldens().prompts[1], 4);
  absl::StatusOr<vamp::v1::StepResponse> later = clients_[0]->Step(solo.Next());
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_THAT(later->error_message(), HasSubstr("NCCL group"));

  // The controller initialises both ranks again: a fresh id, a new group that serves.
  clients_[0]->CloseStream();
  ASSERT_NO_FATAL_FAILURE(InitGroupOk(TinyGpuInitRequest(), &init));
  const auto out = Decode(init[0].memory().kv_blocks(), 16, /*groups=*/0);
  EXPECT_EQ(out[0], LoadGoldens().continuations[1]);
}

TEST_F(AgentCudaTpTest, RanksWithDifferentRequestsAreRefused) {
  std::vector<vamp::v1::InitResponse> init;
  std::vector<grpc::Status> s = InitGroup(TinyGpuInitRequest(), &init, [](auto* r) {
    r->mutable_memory()->set_max_num_seqs(8);  // differs from rank 0
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(s[r].error_code(), grpc::FAILED_PRECONDITION) << "rank " << r;
    EXPECT_THAT(s[r].error_message(), HasSubstr("different InitRequests")) << "rank " << r;
  }
}

}  // namespace
}  // namespace vamp
