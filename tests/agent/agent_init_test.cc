// vamp-agent's Init over gRPC on loopback, CPU, tiny qwen3_moe checkpoint: the model and memory
// plan it reports, bad requests naming the field (the agent keeps serving), the same request
// again, the dtype by device, and dummy weights.
#include <chrono>

#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_TRUE(init.prompt_logprobs_supported()) << "CPU agents compute prompt logprobs";
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

}  // namespace
}  // namespace vamp::testing
