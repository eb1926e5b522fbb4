// vamp-agent on a GPU (--device cuda:0, TP=1), in process over gRPC on loopback: the tiny
// checkpoint's greedy continuations match the HF goldens, offloading expert groups mid-decode and
// restoring them keeps the sampled tokens identical (a dummy-weight model whose float32 experts
// are 1.5 MiB, so 2 MiB pages hold groups of 4 and offloading is possible), and tp_size > 1 is
// refused. Every case skips without a usable CUDA device, or when the agent is built without
// -DVAMP_AGENT_CUDA=ON.
#include <string>
#include <vector>

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp {
namespace {

using testing::AgentClient;
using ::testing::HasSubstr;
using testing::LoadGoldens;
using testing::MiniController;
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

TEST_F(AgentCudaTest, TensorParallelIsRefusedWithFailedPrecondition) {
  vamp::v1::InitRequest r = TinyGpuInitRequest();
  r.mutable_parallel()->set_tp_size(2);
  r.mutable_parallel()->set_host_transport_address("127.0.0.1:1");
  vamp::v1::InitResponse init;
  grpc::Status s = client_->Init(r, &init);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("parallel.tp_size"));
  EXPECT_THAT(s.error_message(), HasSubstr("NCCL tensor parallelism is not implemented yet"));
  // The agent still serves a valid request afterwards.
  s = client_->Init(TinyGpuInitRequest(), &init);
  EXPECT_TRUE(s.ok()) << s.error_message();
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
    vamp::v1::CapacityResponse capacity;
    EXPECT_TRUE(client.Capacity(groups, &capacity).ok());
    EXPECT_GT(capacity.kv_blocks_after(), baseline);
    auto offload =
        client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_OFFLOAD,
                              groups, capacity.kv_blocks_after(), "offload-1"));
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
    vamp::v1::CapacityResponse capacity;
    EXPECT_TRUE(client.Capacity(-groups, &capacity).ok());
    EXPECT_EQ(capacity.kv_blocks_after(), baseline);
    auto restore =
        client.Step(RemapOnly(controller.NextStepId(), vamp::v1::RemapCommand::ACTION_RESTORE,
                              groups, capacity.kv_blocks_after(), "restore-1"));
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

}  // namespace
}  // namespace vamp
