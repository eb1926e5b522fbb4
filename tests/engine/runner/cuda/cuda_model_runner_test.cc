// The GPU execution path end to end: ModelRunner driving CudaQwen3MoeModel, with the KV cache and
// the expert regions in the CUDA VMM backend and offloaded experts staged through
// CudaExpertStoreWeights, on ranks BuildRank assembles on the CUDA device. Checks, on a real device
// (each case skips without one):
//   1. the tiny checkpoint's logits match the HF goldens and the greedy continuations are exact;
//   2. the GPU logits match the CPU engine's on mixed prefill/decode steps;
//   3. every residency boundary gives bit-identical logits (shared/DESIGN.md invariant 1), on a
//      dummy-weight model whose experts are large enough to be offloaded in 2 MiB pages;
//   4. decoding after a prefix-cache hit matches a fresh prefill;
//   5. Qwen3-Next (gated attention, Gated DeltaNet with device state slots, shared experts) against
//      its HF goldens and the CPU engine, prefix hits from device snapshots, CUDA graphs, and bit
//      identity across residency boundaries, and its tensor-parallel shards (two ranks on one
//      device) against TP=1.
// Cases 1-4 run in float32 (the CPU engine's precision); the bfloat16 cases check the production
// precision against the CPU engine with bfloat16 tolerances, bit-identity across residency
// boundaries in bfloat16, and that the device-side grouped expert GEMM and cuBLAS agree.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status_macros.h"
#include "engine/model/weight_source.h"
#include "engine/rank/cuda_device.h"
#include "engine/rank/rank.h"
#include "engine/runner/comm/host_communicator.h"
#include "engine/runner/cuda/device_all_reduce.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cpu/sampling.h"
#include "tests/engine/model/tiny_model.h"
#include "tests/engine/model/tiny_qwen3_next.h"
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

// The memory plan of the GPU cases on `page`-byte pages, with VAMP-r = `ratio`.
MemoryPlanConfig TestPlanConfig(uint64_t page, double ratio) {
  MemoryPlanConfig c;
  c.page_bytes = page;
  c.runtime_overhead_bytes = 0;
  c.activation_bytes = page;
  c.offload.max_offload_ratio = ratio;
  return c;
}

// That plan (`dtype` weights and KV) with a baseline KV pool of exactly `kv_pages` pages.
absl::StatusOr<MemoryPlan> TestPlan(const ModelConfig& config, uint64_t page, int64_t kv_pages,
                                    double ratio, DType dtype = DType::kFloat32) {
  return PlanWithKvPages(config.ToModelShape(DTypeBytes(dtype)), TestPlanConfig(page, ratio),
                         kv_pages);
}

// Whole-region staging unless a test asks for routed staging.
CudaForwardOptions F32Forward() {
  CudaForwardOptions o;
  o.dtype = DType::kFloat32;
  o.routed_staging_max_tokens = 0;
  return o;
}

CudaForwardOptions Bf16Forward() {
  CudaForwardOptions o;
  o.dtype = DType::kBFloat16;
  o.routed_staging_max_tokens = 0;
  return o;
}

// A tensor-parallel rank's place in its group (the default: TP 1).
struct GpuRankShard {
  ParallelConfig parallel;
  Communicator* comm = nullptr;
  DeviceAllReduce* all_reduce = nullptr;
};

// One GPU rank on device 0: `kv_pages` pages of KV, VAMP-r = `ratio`, `staging_buffers` staging
// buffers; shard `shard` of the model (its loader must load that shard).
absl::StatusOr<std::unique_ptr<Rank>> MakeGpuEngine(const ModelConfig& config, RankModelLoader load,
                                                    int64_t kv_pages, double ratio,
                                                    RunnerConfig rc = {},
                                                    CudaForwardOptions forward = F32Forward(),
                                                    int staging_buffers = 2,
                                                    const GpuRankShard& shard = {}) {
  CudaDeviceOptions device;
  device.forward = forward;
  RankSpec spec;
  spec.device = CreateCudaDevice(device);
  VAMP_ASSIGN_OR_RETURN(spec.backend, spec.device->CreateMemoryBackend());
  spec.config = config;
  spec.parallel = shard.parallel;
  spec.comm = shard.comm;
  spec.all_reduce = shard.all_reduce;
  spec.dtype = forward.dtype;
  spec.plan = TestPlanConfig(spec.backend->page_bytes(), ratio);
  // The rank's shard sizes the expert store and the KV heads.
  spec.plan.tp_size = shard.parallel.tp_size;
  spec.plan.offload.staging_buffers = staging_buffers;
  spec.kv_pages = kv_pages;
  spec.runner = rc;
  spec.load = std::move(load);
  return BuildRank(std::move(spec));
}

// The CUDA device's expert weights and model of a rank MakeGpuEngine built.
CudaExpertStoreWeights& StoreWeights(Rank& e) {
  return static_cast<CudaRankExperts&>(*e.experts).store_weights();
}
CudaQwen3MoeModel& DeviceModel(Rank& e) { return static_cast<CudaQwen3MoeModel&>(*e.device_model); }

RankModelLoader TinyCheckpoint() {
  LoadOptions options;
  options.model_path = TinyModelDir();
  return LoadWith(options);
}

// The tiny checkpoint, fully resident (its 18 KiB experts cannot be offloaded in 2 MiB pages),
// KV in 2 pages (341 blocks).
absl::StatusOr<std::unique_ptr<Rank>> MakeTinyGpuEngine(RunnerConfig rc = {},
                                                        CudaForwardOptions forward = F32Forward()) {
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
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    sched.Submit(i, g.prompts[i], static_cast<int32_t>(g.continuations[i].size()));
  }
  sched.RunAll(runner);
  return sched;
}

// The greedy continuations are the goldens' and the logits of every position match theirs.
void ExpectGoldens(const MiniScheduler& sched, const Goldens& g, int chunk) {
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const auto& r = sched.request(i);
    EXPECT_EQ(r.outputs, g.continuations[i]) << "chunk " << chunk << " prompt " << i;
    ASSERT_GE(r.all_logits.size(), g.logits[i].size());
    EXPECT_TRUE(LogitsMatch(r.all_logits.data(), g.logits[i].data(), g.logits[i].size()))
        << "chunk " << chunk << " prompt " << i;
  }
}

TEST_F(CudaModelRunnerTest, LogitsAndGreedyContinuationsMatchHfGoldens) {
  const Goldens g = LoadGoldens();
  ASSERT_FALSE(g.prompts.empty());
  // Few logits rows per LM-head launch, so the chunked logits path runs too.
  CudaForwardOptions forward = F32Forward();
  forward.max_logits_rows = 8;
  for (int chunk : {1 << 20, 7}) {
    auto engine = MakeTinyGpuEngine({}, forward);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ExpectGoldens(RunGoldens(*(*engine)->runner, g, chunk), g, chunk);
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

// Steps without return_all_logits sample on the device (CausalLm::ForwardAndSample): the tokens
// must be those of the host sampler over the same logits, greedy and seeded random alike.
TEST_F(CudaModelRunnerTest, DeviceSamplingPicksTheHostSamplersTokens) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams random;
  random.temperature = 0.8f;
  random.top_k = 40;
  random.top_p = 0.9f;
  RunnerSamplingParams hot;
  hot.temperature = 1.3f;
  // Penalties, min_tokens bans and min_p: kernels::cuda::ProcessLogits on the device against
  // the CPU twin on the host; odd requests have none, so batches mix both kinds of rows.
  RunnerSamplingParams penalised;
  penalised.temperature = 0.9f;
  penalised.min_p = 0.05f;
  penalised.presence_penalty = 0.5f;
  penalised.frequency_penalty = 0.3f;
  penalised.repetition_penalty = 1.2f;
  penalised.min_tokens = 3;
  penalised.min_tokens_banned_ids = {0, 1, 2};
  for (const RunnerSamplingParams& sampling : {MiniScheduler::Greedy(), random, hot, penalised}) {
    std::vector<std::vector<int32_t>> outputs[2];
    for (bool all_logits : {true, false}) {  // host sampling, then device sampling
      auto engine = MakeTinyGpuEngine();
      ASSERT_TRUE(engine.ok()) << engine.status();
      MiniScheduler sched(16, Range(0, 256), 5);
      for (size_t i = 0; i < g.prompts.size(); ++i) {
        RunnerSamplingParams p = sampling.needs_processing() && i % 2 == 1 ? hot : sampling;
        p.seed = 1000 + i;
        sched.Submit(i, g.prompts[i], 16, p);
      }
      sched.RunAll(*(*engine)->runner, all_logits);
      for (size_t i = 0; i < g.prompts.size(); ++i) {
        outputs[all_logits ? 0 : 1].push_back(sched.request(i).outputs);
      }
    }
    EXPECT_EQ(outputs[1], outputs[0]) << "temperature " << sampling.temperature
                                      << (sampling.needs_processing() ? ", penalised" : "");
  }
}

// Logprobs and alternatives sampled on the device (kernels::cuda::TopLogprobs on the raw logits,
// sampling from a processed copy when a row has penalties, bans or min_p) against the host
// sampler's over the same float32 logits (return_all_logits): the same tokens and alternative
// ids; log-probabilities within 1e-5 relative (double sums in another order, and LM-head GEMMs
// over other row counts) when TopLogprobs computes them (a row with alternatives or processing),
// within SampleTokens' float32 sums (1e-4) otherwise. Reporting processed logits' logprobs
// instead would be off by the penalties (>= 0.2 here) and min_p's renormalisation.
// Batches mix every kind of row, and steps with alternatives alternate with steps without.
TEST_F(CudaModelRunnerTest, DeviceLogprobsAndAlternativesMatchTheHostSamplers) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams greedy_top = MiniScheduler::Greedy();
  greedy_top.num_top_logprobs = 5;
  RunnerSamplingParams random_top;
  random_top.temperature = 0.9f;
  random_top.top_k = 50;
  random_top.top_p = 0.95f;
  random_top.num_top_logprobs = kernels::cpu::kMaxTopLogprobs;
  RunnerSamplingParams penalised;
  penalised.temperature = 0.8f;
  penalised.min_p = 0.02f;
  penalised.presence_penalty = 0.7f;
  penalised.frequency_penalty = 0.2f;
  penalised.repetition_penalty = 1.3f;
  penalised.min_tokens = 2;
  penalised.min_tokens_banned_ids = {0, 1, 2};
  RunnerSamplingParams penalised_top = penalised;
  penalised_top.num_top_logprobs = 3;
  RunnerSamplingParams plain;
  plain.temperature = 0.7f;
  const std::vector<RunnerSamplingParams> kinds = {greedy_top, random_top, penalised, penalised_top,
                                                   plain};
  // Requests 0-3 run 6 tokens, the others 14: the last steps have no row with alternatives.
  const int kRequests = 10;
  MiniScheduler runs[2] = {MiniScheduler(16, Range(0, 256), 5),
                           MiniScheduler(16, Range(0, 256), 5)};
  for (bool all_logits : {true, false}) {  // host sampling, then device sampling
    auto engine = MakeTinyGpuEngine();
    ASSERT_TRUE(engine.ok()) << engine.status();
    MiniScheduler& sched = runs[all_logits ? 0 : 1];
    for (int i = 0; i < kRequests; ++i) {
      RunnerSamplingParams p = kinds[i % kinds.size()];
      if (i >= 4) p.num_top_logprobs = 0;
      p.seed = 500 + i;
      sched.Submit(i, g.prompts[i % g.prompts.size()], i < 4 ? 6 : 14, p);
    }
    sched.RunAll(*(*engine)->runner, all_logits);
  }
  for (int i = 0; i < kRequests; ++i) {
    const auto& host = runs[0].request(i);
    const auto& device = runs[1].request(i);
    const RunnerSamplingParams& p = host.sampling;
    ASSERT_EQ(device.outputs, host.outputs) << "request " << i;
    const double tol = p.num_top_logprobs > 0 || p.needs_processing() ? 1e-5 : 1e-4;
    auto near = [tol](float got, float want) {
      return std::abs(got - want) <= tol * std::max(1.0f, std::abs(want));
    };
    for (size_t t = 0; t < host.outputs.size(); ++t) {
      EXPECT_PRED2(near, device.logprobs[t], host.logprobs[t]) << "request " << i << " token " << t;
      EXPECT_LE(device.logprobs[t], 0.0f);
      EXPECT_EQ(device.top_ids[t], host.top_ids[t]) << "request " << i << " token " << t;
      ASSERT_EQ(device.top_logprobs[t].size(), static_cast<size_t>(p.num_top_logprobs));
      for (int j = 0; j < p.num_top_logprobs; ++j) {
        EXPECT_PRED2(near, device.top_logprobs[t][j], host.top_logprobs[t][j])
            << "request " << i << " token " << t << " alternative " << j;
      }
      // The sampled token's entry among its alternatives carries its logprob, bit for bit.
      for (int j = 0; j < p.num_top_logprobs; ++j) {
        if (device.top_ids[t][j] == device.outputs[t]) {
          EXPECT_EQ(device.top_logprobs[t][j], device.logprobs[t]) << "request " << i;
        }
      }
    }
  }
}

// Prompt log-probabilities on the GPU path (CUDA agents offer them because this holds): a step
// holding a request that asks brings its logits to the host and samples there. Its prompt
// log-probabilities match the CPU engine's (float32 both) within 1e-4 with the same alternatives,
// and every request of the step samples the tokens the same batch samples on the device.
TEST_F(CudaModelRunnerTest, PromptLogprobsMatchTheCpuEngineAndLeaveTokensUnchanged) {
  const Goldens g = LoadGoldens();
  const std::vector<int32_t>& prompt = g.prompts[1];
  RunnerSamplingParams asks = MiniScheduler::Greedy();
  asks.prompt_logprobs = true;
  asks.num_top_logprobs = 2;
  RunnerSamplingParams other;
  other.temperature = 0.8f;
  other.seed = 9;
  auto step = [&](ModelRunner& runner, bool ask) {
    StepInput in;
    in.new_requests.push_back({9, prompt, {0, 1}, 0, ask ? asks : MiniScheduler::Greedy()});
    in.new_requests.push_back({10, g.prompts[0], {2, 3}, 0, other});
    in.scheduled.push_back({9, static_cast<int32_t>(prompt.size())});
    in.scheduled.push_back({10, static_cast<int32_t>(g.prompts[0].size())});
    return runner.ExecuteStep(in);
  };
  auto with = MakeTinyGpuEngine();
  ASSERT_TRUE(with.ok()) << with.status();
  auto without = MakeTinyGpuEngine();
  ASSERT_TRUE(without.ok()) << without.status();
  auto cpu = MakeTinyEngine();
  ASSERT_NE(cpu, nullptr);
  absl::StatusOr<StepOutput> host_sampled = step(*(*with)->runner, true);
  ASSERT_TRUE(host_sampled.ok()) << host_sampled.status();
  absl::StatusOr<StepOutput> device_sampled = step(*(*without)->runner, false);
  ASSERT_TRUE(device_sampled.ok()) << device_sampled.status();
  absl::StatusOr<StepOutput> reference = step(*cpu->runner, true);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(host_sampled->sampled.size(), 2u);
  ASSERT_EQ(device_sampled->sampled.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(host_sampled->sampled[i].token, device_sampled->sampled[i].token) << i;
  }
  EXPECT_TRUE(device_sampled->prompt_logprobs.empty());
  ASSERT_EQ(host_sampled->prompt_logprobs.size(), 1u);
  ASSERT_EQ(reference->prompt_logprobs.size(), 1u);
  const PromptLogprobs& got = host_sampled->prompt_logprobs[0];
  const PromptLogprobs& want = reference->prompt_logprobs[0];
  EXPECT_EQ(got.first_position, 1);
  ASSERT_EQ(got.logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(want.logprobs.size(), got.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4) << "position " << i + 1;
  }
  EXPECT_EQ(got.top_token_ids, want.top_token_ids);
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
  for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
    EXPECT_NEAR(got.top_logprobs[i], want.top_logprobs[i], 1e-4);
  }
}

// Decode steps replayed from CUDA graphs give the tokens of launch-by-launch execution, across
// batch-size changes (requests finish at different steps) and context buckets.
TEST_F(CudaModelRunnerTest, CudaGraphDecodeStepsMatchEagerSteps) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams random;
  random.temperature = 0.7f;
  random.top_p = 0.95f;
  std::vector<std::vector<int32_t>> outputs[2];
  CudaGraphStats stats[2];
  for (bool graphs : {false, true}) {
    CudaForwardOptions forward = Bf16Forward();
    forward.cuda_graphs = graphs;
    forward.graph_stride_bucket_blocks = 2;  // re-captures as contexts grow past 32 tokens
    auto engine = MakeTinyGpuEngine({}, forward);
    ASSERT_TRUE(engine.ok()) << engine.status();
    MiniScheduler sched(16, Range(0, 256), 7);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      RunnerSamplingParams p = i % 2 == 0 ? MiniScheduler::Greedy() : random;
      p.seed = 77 + i;
      sched.Submit(i, g.prompts[i], 20 + 6 * static_cast<int32_t>(i), p);
    }
    sched.RunAll(*(*engine)->runner, /*all_logits=*/false);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      outputs[graphs].push_back(sched.request(i).outputs);
    }
    stats[graphs] = DeviceModel(**engine).graph_stats();
  }
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(stats[0].replays, 0);
  EXPECT_GT(stats[1].replays, 20);
  EXPECT_GT(stats[1].captures, 1);
  EXPECT_LT(stats[1].captures, stats[1].replays);
  EXPECT_GT(stats[1].eager_steps, 0);  // prefill chunks
}

// Decode steps whose rows ask for alternatives replay CUDA graphs too (captured with
// TopLogprobs; a step without alternatives uses another graph): tokens, logprobs and
// alternatives equal launch-by-launch execution's, bit for bit (the same kernels on the same
// inputs).
TEST_F(CudaModelRunnerTest, CudaGraphStepsWithAlternativesMatchEagerSteps) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams random;
  random.temperature = 0.7f;
  random.top_p = 0.95f;
  const int32_t counts[] = {1, 5, kernels::cpu::kMaxTopLogprobs, 0};
  std::vector<MiniScheduler::Request> requests[2];
  CudaGraphStats stats[2];
  for (bool graphs : {false, true}) {
    CudaForwardOptions forward = Bf16Forward();
    forward.cuda_graphs = graphs;
    forward.graph_stride_bucket_blocks = 2;
    auto engine = MakeTinyGpuEngine({}, forward);
    ASSERT_TRUE(engine.ok()) << engine.status();
    MiniScheduler sched(16, Range(0, 256), 7);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      RunnerSamplingParams p = i % 2 == 0 ? MiniScheduler::Greedy() : random;
      p.num_top_logprobs = counts[i % 4];
      p.seed = 91 + i;
      // The request without alternatives runs longest: the last steps have none.
      sched.Submit(i, g.prompts[i], 20 + 6 * static_cast<int32_t>(i), p);
    }
    sched.RunAll(*(*engine)->runner, /*all_logits=*/false);
    for (size_t i = 0; i < g.prompts.size(); ++i) requests[graphs].push_back(sched.request(i));
    stats[graphs] = DeviceModel(**engine).graph_stats();
  }
  ASSERT_EQ(g.prompts.size(), 4u);
  for (size_t i = 0; i < requests[0].size(); ++i) {
    const auto& eager = requests[0][i];
    const auto& graph = requests[1][i];
    EXPECT_EQ(graph.outputs, eager.outputs) << "request " << i;
    EXPECT_EQ(graph.logprobs, eager.logprobs) << "request " << i;
    EXPECT_EQ(graph.top_ids, eager.top_ids) << "request " << i;
    EXPECT_EQ(graph.top_logprobs, eager.top_logprobs) << "request " << i;
    for (const auto& ids : graph.top_ids) {
      EXPECT_EQ(ids.size(), static_cast<size_t>(counts[i % 4])) << "request " << i;
    }
  }
  EXPECT_EQ(stats[0].replays, 0);
  EXPECT_GT(stats[1].replays, 20);
  EXPECT_GE(stats[1].captures, 2);  // with and without alternatives, context buckets
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

// The same geometry in bfloat16: twice the intermediate size keeps experts at 1.5 MiB.
std::string PageSizedExpertsConfig(DType dtype) {
  std::string c = kPageSizedExpertsConfig;
  if (dtype == DType::kBFloat16) {
    const std::string from = R"("moe_intermediate_size": 256)";
    c.replace(c.find(from), from.size(), R"("moe_intermediate_size": 512)");
  }
  return c;
}

RankModelLoader DummyWeights() {
  return [](const ModelConfig& c, const MemoryPlan&,
            ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    std::unique_ptr<WeightSource> source = CreateDummyWeightSource(/*seed=*/7);
    return LoadModelFromSource(c, {}, *source, sink);
  };
}

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

// Offloads group by group up to the cap and restores back, checking bit-identical logits at every
// boundary.
void CheckEveryResidencyBoundary(CudaForwardOptions forward, std::string config_json = "") {
  if (config_json.empty()) config_json = PageSizedExpertsConfig(forward.dtype);
  auto config = ParseModelConfig(config_json);
  ASSERT_TRUE(config.ok()) << config.status();
  auto made = MakeGpuEngine(*config, DummyWeights(), /*kv_pages=*/8, /*ratio=*/0.75, {}, forward);
  ASSERT_TRUE(made.ok()) << made.status();
  Rank& e = **made;
  ASSERT_EQ(e.plan.experts.group_experts, 4);
  ASSERT_EQ(e.plan.experts.max_groups, 3);
  ASSERT_EQ(e.memory.experts->boundary(), 16);
  ModelRunner& runner = *e.runner;
  const int64_t baseline_blocks = runner.kv_cache().num_blocks;

  const PromptsRun want = RunPrompts(runner, 0);
  EXPECT_TRUE(StoreWeights(e).staged_layers().empty());
  EXPECT_EQ(StoreWeights(e).stats().copies, 0);
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
    auto r = e.memory.page_remapper->Offload(1);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(e.memory.experts->boundary(), 16 - 4 * groups);
    ASSERT_TRUE(e.RefreshKv().ok());
    EXPECT_GT(runner.kv_cache().num_blocks, baseline_blocks);
    const CudaStagingStats before = StoreWeights(e).stats();
    check("boundary " + std::to_string(16 - 4 * groups));
    EXPECT_EQ(StoreWeights(e).staged_layers(), (std::vector<int>{1, 2}));
    const CudaStagingStats after = StoreWeights(e).stats();
    // Whole-region copies for passes above the routed threshold, routed ones at or below it.
    if (forward.routed_staging_max_tokens < (int64_t{1} << 20)) {
      EXPECT_GT(after.copies, before.copies);
    }
    if (forward.routed_staging_max_tokens > 0) {
      EXPECT_GT(after.routed_layers, before.routed_layers);
      EXPECT_GT(after.bytes, before.bytes) << "routed copies are counted";
      // What the agent reports as the routed share: copied bytes of the served layers' region.
      const uint64_t region = after.routed_region_bytes - before.routed_region_bytes;
      const uint64_t routed = after.routed_bytes - before.routed_bytes;
      EXPECT_GT(routed, 0u);
      EXPECT_LE(routed, region);
      // A routed copy is a kernel on the compute stream: all of it is exposed, so its time is
      // measured and positive.
      EXPECT_GT(after.exposed_us, before.exposed_us) << "routed copies take exposed time";
    }
    EXPECT_GE(after.exposed_us, before.exposed_us);
  }
  EXPECT_FALSE(e.memory.page_remapper->Offload(1).ok()) << "past the cap";

  // And back: restore group by group (the runner holds no request between checks).
  for (int groups = 2; groups >= 0; --groups) {
    auto r = e.memory.page_remapper->Restore(1, runner.kv_cache().num_blocks);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(e.memory.experts->boundary(), 16 - 4 * groups);
    ASSERT_TRUE(e.RefreshKv().ok());
    check("restored to boundary " + std::to_string(16 - 4 * groups));
  }
  EXPECT_EQ(runner.kv_cache().num_blocks, baseline_blocks);
  EXPECT_TRUE(e.memory.page_remapper->Audit().ok());
}

TEST_F(CudaModelRunnerTest, EveryResidencyBoundaryGivesBitIdenticalLogits) {
  CheckEveryResidencyBoundary(F32Forward());
}

TEST_F(CudaModelRunnerTest, EveryResidencyBoundaryGivesBitIdenticalLogitsInBFloat16) {
  CheckEveryResidencyBoundary(Bf16Forward());
}

// Routed staging (only the offloaded experts a pass routes to are copied, the rest of the staging
// buffer stale): every pass routed, and passes of up to 8 tokens routed with the prefill chunks
// copying the whole region, so that the buffers change hands between the two kinds of copy.
TEST_F(CudaModelRunnerTest, RoutedStagingGivesBitIdenticalLogitsInBFloat16) {
  CudaForwardOptions forward = Bf16Forward();
  forward.routed_staging_max_tokens = int64_t{1} << 20;
  CheckEveryResidencyBoundary(forward);
}

TEST_F(CudaModelRunnerTest, RoutedStagingOfSmallPassesGivesBitIdenticalLogits) {
  CudaForwardOptions bf16 = Bf16Forward();
  bf16.routed_staging_max_tokens = 8;
  CheckEveryResidencyBoundary(bf16);
  CudaForwardOptions f32 = F32Forward();
  f32.routed_staging_max_tokens = 8;
  CheckEveryResidencyBoundary(f32);
}

TEST_F(CudaModelRunnerTest, BFloat16WithCublasExpertsGivesBitIdenticalLogitsAcrossBoundaries) {
  CudaForwardOptions forward = Bf16Forward();
  forward.device_gemm_max_rows_per_expert = 0;  // cuBLAS's grouped GEMM, offsets on the host
  CheckEveryResidencyBoundary(forward);
}

// Deviation of bf16 logits from float32 ones over the prompt positions (teacher-forced: once a
// greedy token differs, later positions see different inputs and are not comparable).
struct Deviation {
  double worst_scaled_error = 0;  // max over positions of max|got - want| / max(1, max|want|)
  int64_t positions = 0;
  int64_t same_argmax = 0;
  double agreement() const { return positions == 0 ? 0 : double(same_argmax) / positions; }
};

void AddDeviation(const float* got, const float* want, int64_t rows, int64_t vocab, Deviation* d) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = got + r * vocab;
    const float* b = want + r * vocab;
    float range = 0, err = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      ASSERT_TRUE(std::isfinite(a[v])) << "row " << r;
      range = std::max(range, std::abs(b[v]));
      err = std::max(err, std::abs(a[v] - b[v]));
    }
    d->worst_scaled_error =
        std::max(d->worst_scaled_error, static_cast<double>(err) / std::max(1.0f, range));
    d->same_argmax += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
    ++d->positions;
  }
}

// The production precision on well-conditioned weights (the dummy loader's uniform
// +-1/sqrt(fan_in)): bfloat16 logits stay within a few percent of the float32 engine's (which
// matches the CPU engine to 1e-4), with the device-side grouped GEMM and with cuBLAS alike.
TEST_F(CudaModelRunnerTest, BFloat16LogitsStayCloseToFloat32OnADummyModel) {
  auto config = ParseModelConfig(PageSizedExpertsConfig(DType::kBFloat16));
  ASSERT_TRUE(config.ok()) << config.status();
  const Goldens g = LoadGoldens();
  auto f32 =
      MakeGpuEngine(*config, DummyWeights(), /*kv_pages=*/8, /*ratio=*/0.0, {}, F32Forward());
  ASSERT_TRUE(f32.ok()) << f32.status();
  const PromptsRun want = RunPrompts(*(*f32)->runner, 0);
  f32->reset();
  for (int64_t device_rows : {int64_t{-1}, int64_t{0}}) {
    CudaForwardOptions forward = Bf16Forward();
    forward.device_gemm_max_rows_per_expert = device_rows;
    auto bf16 = MakeGpuEngine(*config, DummyWeights(), /*kv_pages=*/8, /*ratio=*/0.0, {}, forward);
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    const PromptsRun got = RunPrompts(*(*bf16)->runner, 0);
    Deviation d;
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const int64_t rows = static_cast<int64_t>(g.prompts[i].size());
      ASSERT_GE(static_cast<int64_t>(got.logits[i].size()), rows * kVocab);
      AddDeviation(got.logits[i].data(), want.logits[i].data(), rows, kVocab, &d);
    }
    RecordProperty(
        device_rows < 0 ? "dummy_worst_scaled_error_device" : "dummy_worst_scaled_error_cublas",
        std::to_string(d.worst_scaled_error));
    std::cout << "bf16 vs f32 (dummy model, device_gemm_max_rows_per_expert " << device_rows
              << "): worst scaled error " << d.worst_scaled_error << ", argmax agreement "
              << d.same_argmax << "/" << d.positions << "\n";
    // Measured on an H200: 0.16 with either GEMM path, every argmax equal (logits span ~1.5
    // here, so the scale floor of 1 makes this an absolute error). A broken kernel moves logits
    // by their whole range.
    EXPECT_LT(d.worst_scaled_error, 0.25) << "device_gemm_max_rows_per_expert " << device_rows;
    EXPECT_GE(d.agreement(), 0.95) << d.same_argmax << " of " << d.positions;
  }
}

// The committed tiny checkpoint in bfloat16 against HF transformers' own bfloat16 run of it
// (tests/data/make_tiny_bf16_goldens.py): the engine may not deviate from the float32 goldens by
// more than the reference implementation does at the same precision. The tiny checkpoint's wide
// weights make some routing decisions flip under bf16 rounding, in HF as here.
TEST_F(CudaModelRunnerTest, BFloat16TinyCheckpointDeviatesNoMoreThanHfInBFloat16) {
  const Goldens f32 = LoadGoldens();
  const Goldens hf = LoadGoldens("tiny-qwen3-moe-goldens-bf16.safetensors");
  ASSERT_EQ(hf.logits.size(), f32.logits.size());
  Deviation hf_dev;
  for (size_t i = 0; i < f32.prompts.size(); ++i) {
    AddDeviation(hf.logits[i].data(), f32.logits[i].data(),
                 static_cast<int64_t>(f32.prompts[i].size()), kVocab, &hf_dev);
  }
  for (int chunk : {1 << 20, 5}) {
    for (int64_t device_rows : {int64_t{-1}, int64_t{0}}) {
      CudaForwardOptions forward = Bf16Forward();
      forward.device_gemm_max_rows_per_expert = device_rows;
      auto gpu = MakeTinyGpuEngine({}, forward);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      const MiniScheduler got = RunGoldens(*(*gpu)->runner, f32, chunk);
      Deviation ours, vs_hf;
      for (size_t i = 0; i < f32.prompts.size(); ++i) {
        const int64_t rows = static_cast<int64_t>(f32.prompts[i].size());
        const std::vector<float>& logits = got.request(i).all_logits;
        ASSERT_GE(static_cast<int64_t>(logits.size()), rows * kVocab);
        AddDeviation(logits.data(), f32.logits[i].data(), rows, kVocab, &ours);
        AddDeviation(logits.data(), hf.logits[i].data(), rows, kVocab, &vs_hf);
      }
      std::cout << "tiny bf16 (chunk " << chunk << ", device_gemm_max_rows_per_expert "
                << device_rows << "): vs float32 worst " << ours.worst_scaled_error << ", argmax "
                << ours.same_argmax << "/" << ours.positions << "; HF bf16 vs float32 worst "
                << hf_dev.worst_scaled_error << ", argmax " << hf_dev.same_argmax << "/"
                << hf_dev.positions << "; vs HF bf16 worst " << vs_hf.worst_scaled_error << "\n";
      EXPECT_LE(ours.worst_scaled_error, 2 * hf_dev.worst_scaled_error + 0.02)
          << "chunk " << chunk << ", device_gemm_max_rows_per_expert " << device_rows;
      EXPECT_GE(ours.agreement(), hf_dev.agreement() - 0.03)
          << "chunk " << chunk << ", device_gemm_max_rows_per_expert " << device_rows;
    }
  }
}

// With one staging buffer, copies and compute serialise; the logits must not change either. With
// one buffer and two eligible layers the buffer is carved out of the offloaded pages: an offload
// maps the first layer's freed pages into it and the second layer's into the KV cache.
TEST_F(CudaModelRunnerTest, OneStagingBufferGivesTheSameLogits) {
  auto config = ParseModelConfig(kPageSizedExpertsConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  auto made = MakeGpuEngine(*config, DummyWeights(), /*kv_pages=*/8, /*ratio=*/0.75, {},
                            F32Forward(), /*staging_buffers=*/1);
  ASSERT_TRUE(made.ok()) << made.status();
  Rank& e = **made;
  ASSERT_TRUE(e.plan.experts.staging_carved);
  EXPECT_EQ(e.memory.experts->staging_mapped_bytes(), 0u);
  const PromptsRun want = RunPrompts(*e.runner, 0);
  auto r = e.memory.page_remapper->Offload(3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(e.memory.experts->staging_mapped_bytes(),
            static_cast<uint64_t>(3 * e.plan.experts.group_pages) * e.plan.experts.page_bytes);
  EXPECT_EQ(r->pages, 3 * e.plan.experts.kv_pages_per_group());
  ASSERT_TRUE(e.memory.page_remapper->Audit().ok());
  ASSERT_TRUE(e.RefreshKv().ok());
  const PromptsRun got = RunPrompts(*e.runner, 100);
  EXPECT_EQ(StoreWeights(e).staged_layers(), (std::vector<int>{1, 2}));
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    EXPECT_EQ(got.outputs[i], want.outputs[i]) << "prompt " << i;
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size());
    EXPECT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                             want.logits[i].size() * sizeof(float)))
        << "prompt " << i;
  }
}

// ---- Qwen3-Next (engine/runner/cuda/cuda_gated_delta_net.h) ----

// The committed tiny qwen3_next checkpoint (tests/data/make_tiny_qwen3_next.py), resident.
absl::StatusOr<std::unique_ptr<Rank>> MakeTinyNextGpuEngine(
    const std::string& dir, RunnerConfig rc = {}, CudaForwardOptions forward = F32Forward()) {
  VAMP_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  LoadOptions options;
  options.model_path = dir;
  return MakeGpuEngine(config, LoadWith(options), /*kv_pages=*/2, /*ratio=*/0.0, rc, forward);
}

// A dummy-valued checkpoint of the tiny config (HF names), as the CPU runner tests use.
const std::string& NextDummyCheckpoint() {
  static const std::string dir = testing::WriteQwen3NextCheckpoint(
      "cuda-runner-qwen3-next", testing::TinyQwen3NextConfig(), 31, /*fused_experts=*/true);
  return dir;
}

// Prompts that cover one-token, short, sub-chunk and multi-chunk (70 > 64) prefills.
std::vector<std::vector<int32_t>> NextPrompts() {
  std::vector<std::vector<int32_t>> p = {{7}, {72, 101, 108, 108, 111, 44, 32}, Range(3, 36)};
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 70; ++i) long_prompt.push_back((i * 37 + 11) % 256);
  p.push_back(long_prompt);
  return p;
}

MiniScheduler RunNextPrompts(ModelRunner& runner, int chunk, int max_tokens = 12) {
  MiniScheduler sched(16, Range(0, 256), chunk);
  const auto prompts = NextPrompts();
  for (size_t i = 0; i < prompts.size(); ++i) sched.Submit(i, prompts[i], max_tokens);
  sched.RunAll(runner);
  return sched;
}

TEST_F(CudaModelRunnerTest, Qwen3NextMatchesHfGoldens) {
  const Goldens g =
      LoadGoldens("tiny-qwen3-next-goldens.safetensors", "tiny-qwen3-next-goldens.json");
  ASSERT_FALSE(g.prompts.empty());
  for (int chunk : {1 << 20, 7}) {
    auto engine = MakeTinyNextGpuEngine(testing::TinyQwen3NextDir());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ExpectGoldens(RunGoldens(*(*engine)->runner, g, chunk), g, chunk);
  }
}

TEST_F(CudaModelRunnerTest, Qwen3NextMatchesTheCpuEngineOnMixedSteps) {
  // Chunks of 5 mix prefill chunks with decodes of the requests already prefilled: recurrent and
  // chunked delta-rule launches in one step.
  for (int chunk : {1 << 20, 5}) {
    auto cpu = MakeTinyEngine({}, nullptr, 256, {}, NextDummyCheckpoint());
    ASSERT_NE(cpu, nullptr);
    const MiniScheduler want = RunNextPrompts(*cpu->runner, chunk);
    auto gpu = MakeTinyNextGpuEngine(NextDummyCheckpoint());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_GT(DeviceModel(**gpu).workspace_bytes(), 0u);
    const MiniScheduler got = RunNextPrompts(*(*gpu)->runner, chunk);
    for (size_t i = 0; i < NextPrompts().size(); ++i) {
      const auto& a = got.request(i);
      const auto& b = want.request(i);
      EXPECT_EQ(a.outputs, b.outputs) << "chunk " << chunk << " prompt " << i;
      ASSERT_EQ(a.all_logits.size(), b.all_logits.size());
      EXPECT_TRUE(LogitsMatch(a.all_logits.data(), b.all_logits.data(), b.all_logits.size()))
          << "chunk " << chunk << " prompt " << i;
    }
  }
}

TEST_F(CudaModelRunnerTest, Qwen3NextPrefixHitFromADeviceSnapshotEqualsAFreshPrefill) {
  auto engine = MakeTinyNextGpuEngine(NextDummyCheckpoint());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ModelRunner& runner = *(*engine)->runner;
  ASSERT_GE(runner.snapshot_blocks(), 1);
  const std::vector<int32_t> prompt = NextPrompts()[3];  // 70 tokens
  const int32_t last = static_cast<int32_t>(runner.kv_cache().num_blocks) - 1;
  MiniScheduler sched(16, Range(0, last - 4));
  // Snapshots at a delta-rule chunk boundary (64) and inside a chunk (32), each in the pool's
  // last blocks.
  sched.Submit(1, prompt, 8);
  sched.mutable_request(1).capture = {64, {last}};
  sched.Submit(2, prompt, 8);
  sched.mutable_request(2).capture = {32, {last - 1}};
  sched.RunAll(runner);
  EXPECT_EQ(runner.num_snapshots(), 2u);
  auto fresh = [](const std::vector<int32_t>& tokens) {
    auto e = MakeTinyNextGpuEngine(NextDummyCheckpoint());
    EXPECT_TRUE(e.ok()) << e.status();
    MiniScheduler plain(16, Range(0, 200));
    plain.Submit(1, tokens, 8);
    plain.RunAll(*(*e)->runner);
    return plain.request(1);
  };
  const MiniScheduler::Request plain = fresh(prompt);
  // The captures ran in a batch of two prefills, the fresh run alone: cuBLAS may pick other
  // kernels for other row counts, so float32 rounding apart (on the CPU these are the same bits).
  for (int id : {1, 2}) {
    EXPECT_TRUE(LogitsMatch(sched.request(id).all_logits.data(), plain.all_logits.data(),
                            plain.all_logits.size()))
        << id;
    EXPECT_EQ(sched.request(id).outputs, plain.outputs) << id;
  }

  // The prompt again, hitting 64 and 32 tokens: the first requests' KV blocks and snapshots.
  const auto& first = sched.request(1).blocks;
  sched.Submit(11, prompt, 8, MiniScheduler::Greedy(), {first.begin(), first.begin() + 4}, 64);
  sched.mutable_request(11).restore = {64, {last}};
  const auto& second = sched.request(2).blocks;
  sched.Submit(12, prompt, 8, MiniScheduler::Greedy(), {second.begin(), second.begin() + 2}, 32);
  sched.mutable_request(12).restore = {32, {last - 1}};
  sched.RunAll(runner);
  auto rows_from = [](const std::vector<float>& logits, int64_t row) {
    return std::vector<float>(logits.begin() + row * kVocab, logits.end());
  };
  for (const auto& [id, from, hit] : {std::tuple{11, 1, 64}, std::tuple{12, 2, 32}}) {
    const std::vector<float> want = rows_from(sched.request(from).all_logits, hit);
    ASSERT_EQ(sched.request(id).all_logits.size(), want.size()) << id;
    EXPECT_TRUE(LogitsMatch(sched.request(id).all_logits.data(), want.data(), want.size())) << id;
    EXPECT_EQ(sched.request(id).outputs, sched.request(from).outputs) << id;
  }
}

// The committed tiny qwen3_next checkpoint in bfloat16 against HF transformers' own bfloat16 run
// of it (tests/data/make_tiny_bf16_goldens.py --model qwen3-next), as the qwen3_moe case above: no
// further from the float32 goldens than the reference implementation at the same precision, with
// CUDA graphs and without. Measured on an H200: worst scaled error 0.46 and argmax 103-104 of 111
// here, against HF bf16's 1.04 and 93 of 111.
TEST_F(CudaModelRunnerTest, Qwen3NextBFloat16DeviatesNoMoreThanHfInBFloat16) {
  const Goldens f32 =
      LoadGoldens("tiny-qwen3-next-goldens.safetensors", "tiny-qwen3-next-goldens.json");
  const Goldens hf =
      LoadGoldens("tiny-qwen3-next-goldens-bf16.safetensors", "tiny-qwen3-next-goldens.json");
  ASSERT_EQ(hf.logits.size(), f32.logits.size());
  Deviation hf_dev;
  for (size_t i = 0; i < f32.prompts.size(); ++i) {
    AddDeviation(hf.logits[i].data(), f32.logits[i].data(),
                 static_cast<int64_t>(f32.prompts[i].size()), kVocab, &hf_dev);
  }
  for (int chunk : {1 << 20, 5}) {
    for (bool graphs : {false, true}) {
      CudaForwardOptions forward = Bf16Forward();
      forward.cuda_graphs = graphs;
      auto gpu = MakeTinyNextGpuEngine(testing::TinyQwen3NextDir(), {}, forward);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      const MiniScheduler got = RunGoldens(*(*gpu)->runner, f32, chunk);
      Deviation ours;
      for (size_t i = 0; i < f32.prompts.size(); ++i) {
        const int64_t rows = static_cast<int64_t>(f32.prompts[i].size());
        ASSERT_GE(static_cast<int64_t>(got.request(i).all_logits.size()), rows * kVocab);
        AddDeviation(got.request(i).all_logits.data(), f32.logits[i].data(), rows, kVocab, &ours);
      }
      std::cout << "tiny qwen3_next bf16 (chunk " << chunk << ", graphs " << graphs
                << "): vs float32 worst " << ours.worst_scaled_error << ", argmax "
                << ours.same_argmax << "/" << ours.positions << "; HF bf16 vs float32 worst "
                << hf_dev.worst_scaled_error << ", argmax " << hf_dev.same_argmax << "/"
                << hf_dev.positions << "\n";
      EXPECT_LE(ours.worst_scaled_error, 2 * hf_dev.worst_scaled_error + 0.02)
          << "chunk " << chunk << ", graphs " << graphs;
      EXPECT_GE(ours.agreement(), hf_dev.agreement() - 0.03)
          << "chunk " << chunk << ", graphs " << graphs;
    }
  }
}

// Decode steps of a model with recurrent state replay CUDA graphs (the states' device address and
// the per-step slot arrays are baked in); tokens equal launch-by-launch execution's.
TEST_F(CudaModelRunnerTest, Qwen3NextCudaGraphDecodeStepsMatchEagerSteps) {
  std::vector<std::vector<int32_t>> outputs[2];
  CudaGraphStats stats[2];
  for (bool graphs : {false, true}) {
    CudaForwardOptions forward = Bf16Forward();
    forward.cuda_graphs = graphs;
    forward.graph_stride_bucket_blocks = 2;
    auto engine = MakeTinyNextGpuEngine(NextDummyCheckpoint(), {}, forward);
    ASSERT_TRUE(engine.ok()) << engine.status();
    MiniScheduler sched(16, Range(0, 256), 7);
    const auto prompts = NextPrompts();
    for (size_t i = 0; i < prompts.size(); ++i) sched.Submit(i, prompts[i], 24);
    sched.RunAll(*(*engine)->runner, /*all_logits=*/false);
    for (size_t i = 0; i < prompts.size(); ++i) outputs[graphs].push_back(sched.request(i).outputs);
    stats[graphs] = DeviceModel(**engine).graph_stats();
  }
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(stats[0].replays, 0);
  EXPECT_GT(stats[1].replays, 10);
}

// The tensor-parallel sum of ranks that share one device, so the device model's sharding is
// tested without two GPUs (NCCL refuses two ranks on one device; the 2-GPU NCCL path is
// tests/agent/agent_cuda_test.cc's AgentCudaTpTest). Each call waits for the rank's stream,
// sums on the host in rank order (HostCommunicatorGroup: identical sums on every rank) and
// copies the sum back. bfloat16 elements are summed in float32 and rounded once, as NCCL's sum of
// two bfloat16 contributions.
class HostStagedAllReduce : public DeviceAllReduce {
 public:
  explicit HostStagedAllReduce(Communicator* comm) : comm_(comm) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype, cudaStream_t stream) override {
    std::vector<float> sum(count);
    std::vector<kernels::BFloat16> bf16(dtype == DType::kBFloat16 ? count : 0);
    void* host = dtype == DType::kBFloat16 ? static_cast<void*>(bf16.data()) : sum.data();
    const size_t bytes = static_cast<size_t>(count) * DTypeBytes(dtype);
    if (cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpy(host, data, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return absl::InternalError("HostStagedAllReduce: copy to the host failed");
    }
    for (int64_t i = 0; i < static_cast<int64_t>(bf16.size()); ++i) {
      sum[i] = kernels::ToFloat(bf16[i]);
    }
    VAMP_RETURN_IF_ERROR(comm_->AllReduceSum(sum.data(), count));
    for (int64_t i = 0; i < static_cast<int64_t>(bf16.size()); ++i) {
      bf16[i] = kernels::ToBFloat16(sum[i]);
    }
    if (cudaMemcpy(data, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("HostStagedAllReduce: copy to the device failed");
    }
    return absl::OkStatus();
  }
  absl::Status Check() override { return absl::OkStatus(); }

 private:
  Communicator* const comm_;
};

// Rank `rank` of 2 of the committed tiny qwen3_next checkpoint on device 0, resident.
absl::StatusOr<std::unique_ptr<Rank>> MakeTinyNextGpuRank(int rank, Communicator* comm,
                                                          DeviceAllReduce* all_reduce,
                                                          CudaForwardOptions forward) {
  const std::string dir = testing::TinyQwen3NextDir();
  VAMP_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  const GpuRankShard shard{.parallel = {rank, 2}, .comm = comm, .all_reduce = all_reduce};
  LoadOptions options;
  options.model_path = dir;
  options.parallel = shard.parallel;
  return MakeGpuEngine(config, LoadWith(options), /*kv_pages=*/2, /*ratio=*/0.0, {}, forward,
                       /*staging_buffers=*/2, shard);
}

// TP=2 (attention and Gated DeltaNet heads, the shared expert and every expert's intermediate
// split over two ranks) against TP=1 on the HF goldens' prompts: the ranks agree bit for bit at
// every step; in float32 the logits stay within the goldens' tolerance of TP=1's and the tokens
// are TP=1's; in bfloat16 the prompt positions deviate from the float32 goldens no more than the
// bfloat16 TP=1 engine does (as Qwen3NextBFloat16DeviatesNoMoreThanHfInBFloat16 bounds it).
TEST_F(CudaModelRunnerTest, Qwen3NextTensorParallelShardsEqualTp1) {
  const Goldens g =
      LoadGoldens("tiny-qwen3-next-goldens.safetensors", "tiny-qwen3-next-goldens.json");
  ASSERT_FALSE(g.prompts.empty());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const CudaForwardOptions forward = dtype == DType::kFloat32 ? F32Forward() : Bf16Forward();
    auto runner_group = HostCommunicatorGroup::Create(2);
    auto device_group = HostCommunicatorGroup::Create(2);
    ASSERT_TRUE(runner_group.ok() && device_group.ok());
    HostStagedAllReduce reduce0((*device_group)->rank(0)), reduce1((*device_group)->rank(1));
    auto rank0 = MakeTinyNextGpuRank(0, (*runner_group)->rank(0), &reduce0, forward);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    auto rank1 = MakeTinyNextGpuRank(1, (*runner_group)->rank(1), &reduce1, forward);
    ASSERT_TRUE(rank1.ok()) << rank1.status();
    auto tp1 = MakeTinyNextGpuEngine(testing::TinyQwen3NextDir(), {}, forward);
    ASSERT_TRUE(tp1.ok()) << tp1.status();
    // Each rank keeps the state of its own heads only.
    EXPECT_LT((*rank0)->host_model->RecurrentStateFloatsPerSlot(),
              (*tp1)->host_model->RecurrentStateFloatsPerSlot());

    MiniScheduler sched(16, Range(0, 256), 7), sched_tp1(16, Range(0, 256), 7);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const int32_t tokens = static_cast<int32_t>(g.continuations[i].size());
      sched.Submit(i, g.prompts[i], tokens);
      sched_tp1.Submit(i, g.prompts[i], tokens);
    }
    double max_scaled = 0;
    for (int step = 0; !sched.Done(); ++step) {
      ASSERT_LT(step, 1000);
      const StepInput in = sched.Next();
      absl::StatusOr<StepOutput> out0, out1;
      std::thread t1([&] { out1 = (*rank1)->runner->ExecuteStep(in); });
      out0 = (*rank0)->runner->ExecuteStep(in);
      t1.join();
      ASSERT_TRUE(out0.ok()) << out0.status();
      ASSERT_TRUE(out1.ok()) << out1.status();
      ASSERT_EQ(out0->logits.size(), out1->logits.size());
      for (size_t i = 0; i < out0->logits.size(); ++i) {
        ASSERT_EQ(out0->logits[i], out1->logits[i]) << "step " << step;
      }
      sched.OnOutput(in, *out0);
      if (dtype == DType::kFloat32) {
        const StepInput in1 = sched_tp1.Next();
        auto ref = (*tp1)->runner->ExecuteStep(in1);
        ASSERT_TRUE(ref.ok()) << ref.status();
        ASSERT_EQ(ref->logits.size(), out0->logits.size());
        for (size_t i = 0; i < ref->logits.size(); ++i) {
          ASSERT_EQ(ref->logits[i].size(), out0->logits[i].size());
          for (size_t v = 0; v < ref->logits[i].size(); ++v) {
            max_scaled =
                std::max(max_scaled, std::abs(double(out0->logits[i][v]) - ref->logits[i][v]) /
                                         std::max(1.0, std::abs(double(ref->logits[i][v]))));
          }
        }
        sched_tp1.OnOutput(in1, *ref);
      }
    }
    if (dtype == DType::kFloat32) {
      std::cout << "tiny qwen3_next TP=2 vs TP=1 (float32): max scaled logit difference "
                << max_scaled << "\n";
      EXPECT_LT(max_scaled, 1e-4);
      for (size_t i = 0; i < g.prompts.size(); ++i) {
        EXPECT_EQ(sched.request(i).outputs, sched_tp1.request(i).outputs) << "prompt " << i;
        EXPECT_EQ(sched.request(i).outputs, g.continuations[i]) << "prompt " << i;
      }
      continue;
    }
    const MiniScheduler want = RunGoldens(*(*tp1)->runner, g, 7);
    Deviation tp2_dev, tp1_dev;
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const int64_t rows = static_cast<int64_t>(g.prompts[i].size());
      ASSERT_GE(static_cast<int64_t>(sched.request(i).all_logits.size()), rows * kVocab);
      AddDeviation(sched.request(i).all_logits.data(), g.logits[i].data(), rows, kVocab, &tp2_dev);
      AddDeviation(want.request(i).all_logits.data(), g.logits[i].data(), rows, kVocab, &tp1_dev);
    }
    std::cout << "tiny qwen3_next bf16 vs float32 goldens: TP=2 worst "
              << tp2_dev.worst_scaled_error << ", argmax " << tp2_dev.same_argmax << "/"
              << tp2_dev.positions << "; TP=1 worst " << tp1_dev.worst_scaled_error << ", argmax "
              << tp1_dev.same_argmax << "/" << tp1_dev.positions << "\n";
    EXPECT_LE(tp2_dev.worst_scaled_error, 1.5 * tp1_dev.worst_scaled_error + 0.02);
    EXPECT_GE(tp2_dev.agreement(), tp1_dev.agreement() - 0.03);
  }
}

// Qwen3-Next's layout with float32 experts of 1.5 MiB (as kPageSizedExpertsConfig): every
// residency boundary gives bit-identical logits, with linear-attention layers between the MoE
// layers.
constexpr char kPageSizedNextConfig[] = R"({
  "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
  "vocab_size": 256, "hidden_size": 512, "num_hidden_layers": 3, "full_attention_interval": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
  "partial_rotary_factor": 0.25, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
  "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
  "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 16,
  "num_experts_per_tok": 4, "shared_expert_intermediate_size": 128, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0, "max_position_embeddings": 1024, "tie_word_embeddings": false,
  "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2
})";

TEST_F(CudaModelRunnerTest, Qwen3NextEveryResidencyBoundaryGivesBitIdenticalLogits) {
  CheckEveryResidencyBoundary(F32Forward(), kPageSizedNextConfig);
}

TEST_F(CudaModelRunnerTest, Qwen3NextRoutedStagingGivesBitIdenticalLogitsInBFloat16) {
  CudaForwardOptions forward = Bf16Forward();
  forward.routed_staging_max_tokens = 16;
  std::string config = kPageSizedNextConfig;
  const std::string from = R"("moe_intermediate_size": 256)";
  config.replace(config.find(from), from.size(), R"("moe_intermediate_size": 512)");
  CheckEveryResidencyBoundary(forward, config);
}

TEST(CudaModelRunnerNoDeviceTest, PlansOnTwoMiBPagesHaveTheShapesTheGpuTestsAssume) {
  // The GPU cases' memory layouts, checked where they can be: pure arithmetic.
  constexpr uint64_t kPage = uint64_t{2} << 20;
  auto dummy = ParseModelConfig(kPageSizedExpertsConfig);
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  auto plan = TestPlan(*dummy, kPage, 8, 0.75);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->experts.expert_bytes, uint64_t{3} << 19);
  EXPECT_EQ(plan->experts.group_experts, 4);
  EXPECT_EQ(plan->experts.max_groups, 3);
  EXPECT_EQ(plan->experts.eligible_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(plan->kv_baseline_pages, 8);
  EXPECT_GE(plan->kv_baseline_blocks, 64);  // the prompts need fewer than 20 blocks
  auto tiny = LoadModelConfig(TinyModelDir());
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto tiny_plan = TestPlan(*tiny, kPage, 2, 0.0);
  ASSERT_TRUE(tiny_plan.ok()) << tiny_plan.status();
  EXPECT_EQ(tiny_plan->kv_baseline_pages, 2);
  EXPECT_GE(tiny_plan->kv_baseline_blocks, 256);  // MiniScheduler hands out blocks [0, 256)
  EXPECT_EQ(tiny_plan->experts.max_groups, 0);
  auto bf16 = ParseModelConfig(PageSizedExpertsConfig(DType::kBFloat16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  auto bf16_plan = TestPlan(*bf16, kPage, 8, 0.75, DType::kBFloat16);
  ASSERT_TRUE(bf16_plan.ok()) << bf16_plan.status();
  EXPECT_EQ(bf16_plan->experts.expert_bytes, uint64_t{3} << 19);
  EXPECT_EQ(bf16_plan->experts.group_experts, 4);
  EXPECT_EQ(bf16_plan->experts.max_groups, 3);
  EXPECT_GE(bf16_plan->kv_baseline_blocks, 64);
}

TEST(CudaModelRunnerNoDeviceTest, CudaKvRegionViewRefusesTheHostBackend) {
  // Runs everywhere: the GPU view must not be built over host memory.
  auto config = LoadModelConfig(TinyModelDir());
  ASSERT_TRUE(config.ok()) << config.status();
  MemoryBackendOptions options;
  options.host_page_bytes = 64 << 10;
  auto backend = CreateMemoryBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto plan = TestPlan(*config, (*backend)->page_bytes(), 4, 0.0);
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
