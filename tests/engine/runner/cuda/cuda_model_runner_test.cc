// The GPU execution path end to end: ModelRunner driving CudaQwen3MoeModel, with the KV cache and
// the expert regions in the CUDA VMM backend (CreateAgentMemory) and offloaded experts staged
// through CudaExpertStoreWeights. Checks, on a real device (each case skips without one):
//   1. the tiny checkpoint's logits match the HF goldens and the greedy continuations are exact;
//   2. the GPU logits match the CPU engine's on mixed prefill/decode steps;
//   3. every residency boundary gives bit-identical logits (shared/DESIGN.md invariant 1), on a
//      dummy-weight model whose experts are large enough to be offloaded in 2 MiB pages;
//   4. decoding after a prefix-cache hit matches a fresh prefill.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "engine/kv/memory_repartitioner.h"
#include "engine/memory/cuda_backend.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/model_loader.h"
#include "engine/model/weight_source.h"
#include "engine/runner/cuda/cuda_expert_weights.h"
#include "engine/runner/cuda/cuda_qwen3_moe.h"
#include "engine/runner/cuda/cuda_runner_support.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/model/tiny_model.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp {
namespace {

using testing::Goldens;
using testing::LoadGoldens;
using testing::LogitsMatch;
using testing::MakeTinyEngine;
using testing::MiniScheduler;
using testing::Range;
using testing::TinyModelDir;

constexpr int64_t kVocab = 256;

// Everything one GPU rank holds, torn down in reverse order of declaration (runner and models
// first, the memory regions before the backend).
struct GpuEngine {
  ModelConfig config;
  MemoryPlan plan;
  std::unique_ptr<MemoryBackend> backend;
  std::unique_ptr<InFlightFence> fence;
  AgentMemory memory;
  CudaStream stream;
  std::unique_ptr<CudaExpertStoreWeights> experts;
  std::unique_ptr<CausalLm> host_model;
  std::unique_ptr<CudaQwen3MoeModel> model;
  std::unique_ptr<ModelRunner> runner;

  // After a remap: the KV pool's new size.
  absl::Status RefreshKv() {
    absl::StatusOr<KvCacheView> view = CudaKvRegionView(*memory.kv, config.num_hidden_layers);
    if (!view.ok()) return view.status();
    return runner->SetKvCache(*view);
  }
};

// A float32 memory plan on `page`-byte pages whose baseline KV pool is exactly `kv_pages` pages,
// with VAMP-r = `ratio`.
absl::StatusOr<MemoryPlan> PlanWithKvPages(const ModelConfig& config, uint64_t page,
                                           int64_t kv_pages, double ratio) {
  MemoryPlanConfig c;
  c.page_bytes = page;
  c.gpu_memory_utilization = 1.0;
  c.runtime_overhead_bytes = 0;
  c.activation_bytes = page;
  c.offload.max_offload_ratio = ratio;
  c.device_memory_bytes = uint64_t{1} << 36;
  const ModelShape shape = config.ToModelShape(sizeof(float));
  absl::StatusOr<MemoryPlan> big = PlanMemory(shape, c);
  if (!big.ok()) return big.status();
  c.device_memory_bytes =
      big->budget_bytes - big->kv_baseline_pages * page - big->slack_bytes() + kv_pages * page;
  return PlanMemory(shape, c);
}

using ModelLoad =
    std::function<absl::StatusOr<std::unique_ptr<CausalLm>>(const ModelConfig&, ExpertWeightSink&)>;

absl::StatusOr<std::unique_ptr<GpuEngine>> MakeGpuEngine(const ModelConfig& config,
                                                         const ModelLoad& load, int64_t kv_pages,
                                                         double ratio, RunnerConfig rc = {},
                                                         CudaForwardOptions forward = {}) {
  auto e = std::make_unique<GpuEngine>();
  e->config = config;
  VAMP_ASSIGN_OR_RETURN(e->backend, CreateCudaMemoryBackend(0));
  VAMP_ASSIGN_OR_RETURN(e->plan,
                        PlanWithKvPages(config, e->backend->page_bytes(), kv_pages, ratio));
  e->fence = CreateCudaStreamFence(0, {});  // the whole device
  VAMP_ASSIGN_OR_RETURN(e->memory, CreateAgentMemory(e->backend.get(), e->plan, e->fence.get()));
  VAMP_ASSIGN_OR_RETURN(e->stream, CudaStream::Create());
  VAMP_ASSIGN_OR_RETURN(const ExpertShardLayout layout, ExpertLayoutFor(config, {}));
  VAMP_ASSIGN_OR_RETURN(
      e->experts, CudaExpertStoreWeights::Create(e->memory.experts.get(), layout, e->stream.get()));
  VAMP_ASSIGN_OR_RETURN(e->host_model, load(config, *e->experts));
  VAMP_RETURN_IF_ERROR(e->memory.experts->FinalizeLoad());
  VAMP_ASSIGN_OR_RETURN(
      e->model, CudaQwen3MoeModel::Create(e->host_model.get(), rc, e->stream.get(), forward));
  VAMP_ASSIGN_OR_RETURN(KvCacheView kv, CudaKvRegionView(*e->memory.kv, config.num_hidden_layers));
  VAMP_ASSIGN_OR_RETURN(e->runner,
                        ModelRunner::Create(rc, e->model.get(), e->experts.get(), nullptr, kv));
  return e;
}

ModelLoad TinyCheckpoint() {
  return [](const ModelConfig& config,
            ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    LoadOptions options;
    options.model_path = TinyModelDir();
    return LoadModel(config, options, sink);
  };
}

// The tiny checkpoint, fully resident (its 18 KiB experts cannot be offloaded in 2 MiB pages),
// KV in 2 pages (341 blocks).
absl::StatusOr<std::unique_ptr<GpuEngine>> MakeTinyGpuEngine(RunnerConfig rc = {},
                                                             CudaForwardOptions forward = {}) {
  VAMP_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(TinyModelDir()));
  return MakeGpuEngine(config, TinyCheckpoint(), /*kv_pages=*/2, /*ratio=*/0.0, rc, forward);
}

class CudaModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device (" << cudaGetErrorName(err) << ", count " << count << ")";
    }
  }
};

// Runs every golden prompt to 16 tokens in one batch with prefill chunks of `chunk`.
MiniScheduler RunGoldens(ModelRunner& runner, const Goldens& g, int chunk) {
  MiniScheduler sched(16, Range(0, 256), chunk);
  for (size_t i = 0; i < g.prompts.size(); ++i) sched.Submit(i, g.prompts[i], 16);
  sched.RunAll(runner);
  return sched;
}

TEST_F(CudaModelRunnerTest, LogitsAndGreedyContinuationsMatchHfGoldens) {
  const Goldens g = LoadGoldens();
  ASSERT_FALSE(g.prompts.empty());
  // Few logits rows per LM-head launch, so the chunked logits path runs too.
  CudaForwardOptions forward;
  forward.max_logits_rows = 8;
  for (int chunk : {1 << 20, 7}) {
    auto engine = MakeTinyGpuEngine({}, forward);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const MiniScheduler sched = RunGoldens(*(*engine)->runner, g, chunk);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const auto& r = sched.request(i);
      EXPECT_EQ(r.outputs, g.continuations[i]) << "chunk " << chunk << " prompt " << i;
      ASSERT_GE(r.all_logits.size(), g.logits[i].size());
      EXPECT_TRUE(LogitsMatch(r.all_logits.data(), g.logits[i].data(), g.logits[i].size()))
          << "chunk " << chunk << " prompt " << i;
    }
  }
}

TEST_F(CudaModelRunnerTest, LogitsMatchTheCpuEngine) {
  const Goldens g = LoadGoldens();
  auto cpu = MakeTinyEngine();
  ASSERT_NE(cpu, nullptr);
  const MiniScheduler want = RunGoldens(*cpu->runner, g, 5);
  auto gpu = MakeTinyGpuEngine();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const MiniScheduler got = RunGoldens(*(*gpu)->runner, g, 5);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const auto& a = got.request(i);
    const auto& b = want.request(i);
    EXPECT_EQ(a.outputs, b.outputs) << "prompt " << i;
    ASSERT_EQ(a.all_logits.size(), b.all_logits.size()) << "prompt " << i;
    EXPECT_TRUE(LogitsMatch(a.all_logits.data(), b.all_logits.data(), b.all_logits.size()))
        << "prompt " << i;
  }
}

TEST_F(CudaModelRunnerTest, DecodingAfterAPrefixCacheHitMatchesAFreshPrefill) {
  const Goldens g = LoadGoldens();
  const std::vector<int32_t>& prefix = g.prompts[2];  // 33 tokens: two full blocks and one more
  ASSERT_GE(prefix.size(), 32u);
  std::vector<int32_t> prompt_b = prefix;
  for (int32_t t : {200, 13, 77, 5, 5, 9, 250, 31, 64}) prompt_b.push_back(t);

  // A computes the prefix (and more); B reuses A's first two full blocks: 32 cached tokens.
  auto engine = MakeTinyGpuEngine();
  ASSERT_TRUE(engine.ok()) << engine.status();
  MiniScheduler sched(16, Range(0, 256));
  sched.Submit(1, prefix, 6);
  sched.RunAll(*(*engine)->runner);
  const std::vector<int32_t> shared(sched.request(1).blocks.begin(),
                                    sched.request(1).blocks.begin() + 2);
  sched.Submit(2, prompt_b, 12, MiniScheduler::Greedy(), shared, 32);
  sched.RunAll(*(*engine)->runner);

  auto fresh_engine = MakeTinyGpuEngine();
  ASSERT_TRUE(fresh_engine.ok()) << fresh_engine.status();
  MiniScheduler fresh(16, Range(50, 256));
  fresh.Submit(2, prompt_b, 12);
  fresh.RunAll(*(*fresh_engine)->runner);

  const auto& hit = sched.request(2);
  const auto& ref = fresh.request(2);
  EXPECT_EQ(hit.outputs, ref.outputs);
  ASSERT_EQ(hit.sampled_logits.size(), ref.sampled_logits.size());
  for (size_t s = 0; s < hit.sampled_logits.size(); ++s) {
    EXPECT_TRUE(LogitsMatch(hit.sampled_logits[s].data(), ref.sampled_logits[s].data(), kVocab))
        << "sampled token " << s;
  }
  // The positions B computed (32 onwards) match the fresh run's.
  ASSERT_EQ(hit.all_logits.size() + 32 * kVocab, ref.all_logits.size());
  EXPECT_TRUE(LogitsMatch(hit.all_logits.data(), ref.all_logits.data() + 32 * kVocab,
                          hit.all_logits.size()));
}

// A qwen3_moe shape whose float32 experts are 1.5 MiB ([w13 | w2] = 1 MiB + 0.5 MiB), so that on
// 2 MiB pages a group is 4 experts (3 pages) and VAMP-75 offloads up to 3 groups of 16 experts in
// layers 1 and 2. Dummy (seeded random) weights: bit-identity needs no checkpoint.
constexpr char kPageSizedExpertsConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 256, "hidden_size": 512, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
  "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 16,
  "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "max_position_embeddings": 1024, "tie_word_embeddings": false, "torch_dtype": "float32",
  "bos_token_id": 1, "eos_token_id": 2
})";

struct PromptsRun {
  std::vector<std::vector<int32_t>> outputs;
  std::vector<std::vector<float>> logits;
};

// The golden prompts, 8 new tokens each, prefill chunks of 7, KV blocks newest (highest) first so
// requests land in pages that just moved to the KV pool.
PromptsRun RunPrompts(ModelRunner& runner, RunnerRequestId first_id) {
  const Goldens g = LoadGoldens();
  std::vector<int32_t> blocks;
  for (int64_t b = runner.kv_cache().num_blocks - 1; b >= 0; --b) {
    blocks.push_back(static_cast<int32_t>(b));
  }
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

TEST_F(CudaModelRunnerTest, EveryResidencyBoundaryGivesBitIdenticalLogits) {
  auto config = ParseModelConfig(kPageSizedExpertsConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  ModelLoad dummy = [](const ModelConfig& c,
                       ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    std::unique_ptr<WeightSource> source = CreateDummyWeightSource(/*seed=*/7);
    return LoadModelFromSource(c, {}, *source, sink);
  };
  auto made = MakeGpuEngine(*config, dummy, /*kv_pages=*/8, /*ratio=*/0.75);
  ASSERT_TRUE(made.ok()) << made.status();
  GpuEngine& e = **made;
  ASSERT_EQ(e.plan.experts.group_experts, 4);
  ASSERT_EQ(e.plan.experts.max_groups, 3);
  ASSERT_EQ(e.memory.experts->boundary(), 16);
  ModelRunner& runner = *e.runner;
  const int64_t baseline_blocks = runner.kv_cache().num_blocks;

  const PromptsRun want = RunPrompts(runner, 0);
  EXPECT_TRUE(e.experts->staged_layers().empty());
  EXPECT_EQ(e.experts->stats().copies, 0);
  for (const auto& logits : want.logits) {
    ASSERT_FALSE(logits.empty());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }

  RunnerRequestId next_id = 100;
  auto check = [&](const std::string& where) {
    const PromptsRun got = RunPrompts(runner, next_id);
    next_id += 10;
    for (size_t i = 0; i < want.outputs.size(); ++i) {
      EXPECT_EQ(got.outputs[i], want.outputs[i]) << where << " prompt " << i;
      ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << where;
      EXPECT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                               want.logits[i].size() * sizeof(float)))
          << where << " prompt " << i;
    }
  };

  check("fully resident, again");
  for (int groups = 1; groups <= 3; ++groups) {
    auto r = e.memory.repartitioner->Offload(1);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(e.memory.experts->boundary(), 16 - 4 * groups);
    ASSERT_TRUE(e.RefreshKv().ok());
    EXPECT_GT(runner.kv_cache().num_blocks, baseline_blocks);
    const int64_t copies_before = e.experts->stats().copies;
    check("boundary " + std::to_string(16 - 4 * groups));
    EXPECT_EQ(e.experts->staged_layers(), (std::vector<int>{1, 2}));
    EXPECT_GT(e.experts->stats().copies, copies_before);
  }
  EXPECT_FALSE(e.memory.repartitioner->Offload(1).ok()) << "past the cap";

  // And back: restore group by group (the runner holds no request between checks).
  for (int groups = 2; groups >= 0; --groups) {
    auto r = e.memory.repartitioner->Restore(1, runner.kv_cache().num_blocks);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(e.memory.experts->boundary(), 16 - 4 * groups);
    ASSERT_TRUE(e.RefreshKv().ok());
    check("restored to boundary " + std::to_string(16 - 4 * groups));
  }
  EXPECT_EQ(runner.kv_cache().num_blocks, baseline_blocks);
  EXPECT_TRUE(e.memory.repartitioner->Audit().ok());
}

// With one staging buffer, copies and compute serialise; the logits must not change either.
TEST_F(CudaModelRunnerTest, OneStagingBufferGivesTheSameLogits) {
  auto config = ParseModelConfig(kPageSizedExpertsConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  ModelLoad dummy = [](const ModelConfig& c,
                       ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    std::unique_ptr<WeightSource> source = CreateDummyWeightSource(/*seed=*/7);
    return LoadModelFromSource(c, {}, *source, sink);
  };
  auto made = MakeGpuEngine(*config, dummy, /*kv_pages=*/8, /*ratio=*/0.75);
  ASSERT_TRUE(made.ok()) << made.status();
  GpuEngine& e = **made;
  const PromptsRun want = RunPrompts(*e.runner, 0);
  // Swap in single-buffered staging over the same store (the model keeps its stream).
  auto single =
      CudaExpertStoreWeights::Create(e.memory.experts.get(), *ExpertLayoutFor(*config, {}),
                                     e.stream.get(), CudaStagingOptions{/*num_buffers=*/1});
  ASSERT_TRUE(single.ok()) << single.status();
  auto kv = CudaKvRegionView(*e.memory.kv, config->num_hidden_layers);
  ASSERT_TRUE(kv.ok());
  auto runner = ModelRunner::Create({}, e.model.get(), single->get(), nullptr, *kv);
  ASSERT_TRUE(runner.ok()) << runner.status();
  auto r = e.memory.repartitioner->Offload(3);
  ASSERT_TRUE(r.ok()) << r.status();
  auto view = CudaKvRegionView(*e.memory.kv, config->num_hidden_layers);
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE((*runner)->SetKvCache(*view).ok());
  const PromptsRun got = RunPrompts(**runner, 100);
  EXPECT_EQ((*single)->staged_layers(), (std::vector<int>{1, 2}));
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    EXPECT_EQ(got.outputs[i], want.outputs[i]) << "prompt " << i;
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size());
    EXPECT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                             want.logits[i].size() * sizeof(float)))
        << "prompt " << i;
  }
  runner->reset();
}

TEST(CudaModelRunnerNoDeviceTest, PlansOnTwoMiBPagesHaveTheShapesTheGpuTestsAssume) {
  // The GPU cases' memory layouts, checked where they can be: pure arithmetic.
  constexpr uint64_t kPage = uint64_t{2} << 20;
  auto dummy = ParseModelConfig(kPageSizedExpertsConfig);
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  auto plan = PlanWithKvPages(*dummy, kPage, 8, 0.75);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->experts.expert_bytes, uint64_t{3} << 19);
  EXPECT_EQ(plan->experts.group_experts, 4);
  EXPECT_EQ(plan->experts.max_groups, 3);
  EXPECT_EQ(plan->experts.eligible_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(plan->kv_baseline_pages, 8);
  EXPECT_GE(plan->kv_baseline_blocks, 64);  // the prompts need fewer than 20 blocks
  auto tiny = LoadModelConfig(TinyModelDir());
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto tiny_plan = PlanWithKvPages(*tiny, kPage, 2, 0.0);
  ASSERT_TRUE(tiny_plan.ok()) << tiny_plan.status();
  EXPECT_EQ(tiny_plan->kv_baseline_pages, 2);
  EXPECT_GE(tiny_plan->kv_baseline_blocks, 256);  // MiniScheduler hands out blocks [0, 256)
  EXPECT_EQ(tiny_plan->experts.max_groups, 0);
}

TEST(CudaModelRunnerNoDeviceTest, CudaKvRegionViewRefusesTheHostBackend) {
  // Runs everywhere: the GPU view must not be built over host memory.
  auto config = LoadModelConfig(TinyModelDir());
  ASSERT_TRUE(config.ok()) << config.status();
  MemoryBackendOptions options;
  options.host_page_bytes = 64 << 10;
  auto backend = CreateMemoryBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto plan = PlanWithKvPages(*config, (*backend)->page_bytes(), 4, 0.0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CallbackFence fence([] { return absl::OkStatus(); });
  auto memory = CreateAgentMemory(backend->get(), *plan, &fence);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto view = CudaKvRegionView(*memory->kv, config->num_hidden_layers);
  ASSERT_FALSE(view.ok());
  EXPECT_NE(std::string(view.status().message()).find("cuda memory backend"), std::string::npos)
      << view.status();
}

}  // namespace
}  // namespace vamp
