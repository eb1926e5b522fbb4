// vamp_gpu_step_bench: step time of the whole GPU engine (ModelRunner driving CudaQwen3MoeModel in
// bfloat16, dummy weights, KV cache and experts in CUDA VMM pages) on one GPU, against the floors
// the hardware sets, measured in the same process (issue 7, "Benchmarks"):
//
//   1. Decode floor. A decode step must read every non-expert weight (the embedding table only for
//      the batch's rows), the experts the batch's tokens select, and the KV of every sequence:
//        floor = (non-expert bytes + expected distinct experts x expert bytes + KV bytes) / HBM
//      with HBM bandwidth from a device-to-device copy (2 x bytes / time). The batch's distinct
//      experts per MoE layer are estimated for uniform routing: each token picks k of E experts,
//      so an expert is missed by all T tokens with probability (1 - k/E)^T and the expected count
//      is E (1 - (1 - k/E)^T) (dummy weights give a near-uniform router).
//   2. Staging floor. With experts [b, E) of every eligible layer offloaded, every step copies
//      those bytes host->device once, overlapped with compute, so
//        floor = max(resident forward time, staged bytes per step / pinned H2D bandwidth)
//      with the pinned bandwidth from one large cudaMemcpyAsync (the resident point of the same
//      mode, decode or mixed, gives the compute time). Alongside: the same copies replayed alone
//      (the store's pinned ranges into a device buffer, back to back), and the bandwidth the step
//      reached, staged bytes / forward time: a lower bound on the copy stream's bandwidth (its
//      copies take at most the whole pass), close to it when copies dominate.
//   3. The TPOT overhead of each offload ratio against the fully resident step (paper: +31.1 % at
//      VAMP-15 on Qwen3-Next-80B, TP2, H100).
//
// Procedure: build the engine once with VAMP-r = the largest ratio; prefill `batch` sequences of
// `context` tokens (steps of at most max_num_batched_tokens); then for each ratio, ascending:
// offload to it (MemoryRepartitioner::Offload), and time decode-only steps (every sequence +1
// token) and mixed steps (the same decodes plus one new `prefill_tokens` prompt). Every point
// re-admits the batch as prefix-cache hits at exactly `context` tokens, so all points decode at the
// same context. Step time is wall-clock around ModelRunner::ExecuteStep (it returns with the
// stream idle), forward time the runner's own forward_us (without host-side sampling).
//
// Reported, never asserted. Prints a table and writes --json (run_gpu_step_bench.sh turns it into
// the report next to the HF transformers baseline).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "engine/model/model_loader.h"
#include "engine/model/weight_source.h"
#include "engine/rank/cuda_device.h"
#include "engine/rank/rank.h"
#include "engine/runner/model_runner.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
// The paper's decode-time cost of VAMP-15 (Table IV: TPOT 170.9 -> 224.0 ms).
constexpr double kPaperTpotOverheadPct = 31.1;

ConfigSchema Schema() {
  ConfigSchema s;
  s.String("model", "",
           "model directory with config.json; weights are dummy (seeded random) of its shapes "
           "(default: $VAMP_SOURCE_DIR/tests/data/qwen3-30b-a3b, else ./tests/data/qwen3-30b-a3b)");
  s.Int("batch", 64, 1, 4096, "decoding sequences");
  s.Int("context", 2048, 1, int64_t{1} << 20, "tokens of context of every decoding sequence");
  s.Int("prefill_tokens", 2048, 0, int64_t{1} << 20,
        "tokens of the new prompt each mixed step adds to the decode batch (0: no mixed steps)");
  s.String("ratios", "0,0.05,0.10,0.15,0.20,0.25",
           "offload ratios VAMP-r as fractions of each eligible layer's experts, comma-separated "
           "(0, the fully resident reference, is always measured first)");
  s.Int("steps", 20, 1, 100000, "timed steps per point");
  s.Int("warmup", 3, 1, 1000,
        "untimed steps before each point's timed steps (the first re-admits the batch)");
  s.Double("gpu_memory_utilization", 0.90, 0.05, 1.0,
           "fraction of device memory the memory plan may use (weights, staging, KV pool)");
  s.Int("max_num_batched_tokens", 8192, 16, int64_t{1} << 20,
        "tokens one step may compute (workspace size; the prefill runs in steps of this many)");
  s.Int("block_size", 16, 1, 1024, "tokens per KV block");
  s.Int("device_gemm_max_rows_per_expert", CudaForwardOptions{}.device_gemm_max_rows_per_expert, -1,
        int64_t{1} << 40,
        "CudaForwardOptions::device_gemm_max_rows_per_expert: MoE layers with more (token, expert) "
        "rows per expert on average use cuBLAS's grouped GEMM (-1: always the device grouped "
        "GEMM, 0: always cuBLAS)");
  s.Int("cuda_device", 0, 0, 64, "CUDA device ordinal");
  s.Int("seed", 0, 0, int64_t{1} << 62, "seed of the dummy weights and the random prompts");
  s.Int("hbm_copy_mib", 2048, 64, 65536,
        "MiB of the device-to-device copy that measures HBM bandwidth (two such buffers)");
  s.Int("h2d_copy_mib", 512, 2, 65536, "MiB of the pinned host->device copy that measures PCIe");
  s.Int("bandwidth_reps", 10, 1, 1000, "timed repetitions of each bandwidth measurement");
  s.String("json", "", "write the results as JSON to this file");
  return s;
}

struct Flags {
  std::string model_dir;
  int64_t batch = 0, context = 0, prefill_tokens = 0, steps = 0, warmup = 0;
  std::vector<double> ratios;
  double gpu_memory_utilization = 0;
  int64_t max_num_batched_tokens = 0, block_size = 0, device_gemm_max_rows_per_expert = 0;
  int cuda_device = 0;
  uint64_t seed = 0;
  uint64_t hbm_copy_bytes = 0, h2d_copy_bytes = 0;
  int bandwidth_reps = 0;
  std::string json;
};

// "0,0.05,0.1" -> {0, 0.05, 0.1}: sorted, deduplicated, 0 added when missing.
absl::StatusOr<std::vector<double>> ParseRatios(absl::string_view text) {
  std::vector<double> ratios = {0.0};
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    double r = 0;
    if (!absl::SimpleAtod(part, &r) || !(r >= 0.0 && r < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ratios: '", part, "' is not a fraction in [0, 1) (e.g. --ratios=0,0.05,0.15)"));
    }
    ratios.push_back(r);
  }
  std::sort(ratios.begin(), ratios.end());
  ratios.erase(std::unique(ratios.begin(), ratios.end(),
                           [](double a, double b) { return std::abs(a - b) < 1e-9; }),
               ratios.end());
  return ratios;
}

absl::StatusOr<Flags> ReadFlags(const Config& c) {
  Flags f;
  f.model_dir = c.GetString("model");
  if (f.model_dir.empty()) {
    const char* src = std::getenv("VAMP_SOURCE_DIR");
    f.model_dir = absl::StrCat(src != nullptr ? src : ".", "/tests/data/qwen3-30b-a3b");
  }
  f.batch = c.GetInt("batch");
  f.context = c.GetInt("context");
  f.prefill_tokens = c.GetInt("prefill_tokens");
  f.steps = c.GetInt("steps");
  f.warmup = c.GetInt("warmup");
  VAMP_ASSIGN_OR_RETURN(f.ratios, ParseRatios(c.GetString("ratios")));
  f.gpu_memory_utilization = c.GetDouble("gpu_memory_utilization");
  f.max_num_batched_tokens = c.GetInt("max_num_batched_tokens");
  f.block_size = c.GetInt("block_size");
  f.device_gemm_max_rows_per_expert = c.GetInt("device_gemm_max_rows_per_expert");
  f.cuda_device = static_cast<int>(c.GetInt("cuda_device"));
  f.seed = static_cast<uint64_t>(c.GetInt("seed"));
  f.hbm_copy_bytes = static_cast<uint64_t>(c.GetInt("hbm_copy_mib")) << 20;
  f.h2d_copy_bytes = static_cast<uint64_t>(c.GetInt("h2d_copy_mib")) << 20;
  f.bandwidth_reps = static_cast<int>(c.GetInt("bandwidth_reps"));
  f.json = c.GetString("json");
  if (f.batch > f.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--batch ", f.batch,
                                                   " exceeds --max_num_batched_tokens ",
                                                   f.max_num_batched_tokens, " (one decode step)"));
  }
  if (f.batch + f.prefill_tokens > f.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a mixed step computes --batch + --prefill_tokens = ", f.batch + f.prefill_tokens,
        " tokens, more than --max_num_batched_tokens ", f.max_num_batched_tokens));
  }
  return f;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Summary {
  double p50 = 0, p90 = 0, mean = 0, min = 0;
};

Summary Summarise(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.p50 = v[v.size() / 2];
  s.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

Json ToJson(const Summary& s) {
  return Json{{"p50", s.p50}, {"p90", s.p90}, {"mean", s.mean}, {"min", s.min}};
}

// ---------------------------------------------------------------------------------------------
// Bandwidths, measured with CUDA events on a private stream.

class CudaEventPair {
 public:
  CudaEventPair() = default;
  CudaEventPair(const CudaEventPair&) = delete;
  CudaEventPair& operator=(const CudaEventPair&) = delete;
  ~CudaEventPair() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  absl::Status Init() {
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&start_));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return absl::OkStatus();
  }
  // Milliseconds of the work `enqueue` puts on `stream`, median of `reps` after one untimed run.
  absl::StatusOr<double> TimeMs(cudaStream_t stream, int reps,
                                const std::function<absl::Status()>& enqueue) {
    std::vector<double> ms;
    for (int r = -1; r < reps; ++r) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
      VAMP_RETURN_IF_ERROR(enqueue());
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stop_, stream));
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
      float elapsed = 0;
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, start_, stop_));
      if (r >= 0) ms.push_back(elapsed);
    }
    return Summarise(ms).p50;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

struct Bandwidths {
  std::string device_name;
  uint64_t device_memory_bytes = 0;
  uint64_t hbm_copy_bytes = 0;
  double hbm_gbps = 0;  // 2 x bytes / time of a device-to-device copy (read + write)
  // Pinned host->device, by copy size.
  std::vector<std::pair<uint64_t, double>> h2d_gbps;
  double h2d_peak_gbps = 0;  // at --h2d_copy_mib
  // What host-side sampling would cost in transfers: B x vocab float32 logits to pageable host
  // memory (the runner samples on the GPU and copies only tokens).
  uint64_t logits_bytes = 0;
  double logits_d2h_ms = 0;
};

// Runs before the engine exists, so the copies have the device to themselves.
absl::StatusOr<Bandwidths> MeasureBandwidths(const Flags& f, int64_t vocab) {
  Bandwidths b;
  cudaDeviceProp prop{};
  VAMP_CUDART_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, f.cuda_device));
  b.device_name = prop.name;
  b.device_memory_bytes = prop.totalGlobalMem;
  VAMP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  CudaEventPair timer;
  VAMP_RETURN_IF_ERROR(timer.Init());

  b.hbm_copy_bytes = f.hbm_copy_bytes;
  {
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Allocate(f.hbm_copy_bytes));
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(f.hbm_copy_bytes));
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), 1, src.bytes(), stream.get()));
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(dst.data(), 0, dst.bytes(), stream.get()));
    VAMP_ASSIGN_OR_RETURN(const double ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
      return CudaRuntimeStatus(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(),
                                               cudaMemcpyDeviceToDevice, stream.get()),
                               "cudaMemcpyAsync (device to device)");
    }));
    b.hbm_gbps = 2.0 * static_cast<double>(f.hbm_copy_bytes) / (ms * 1e6);
  }
  {
    VAMP_ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Allocate(f.h2d_copy_bytes));
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(f.h2d_copy_bytes));
    std::fill(host.data(), host.data() + host.bytes(), uint8_t{1});
    std::vector<uint64_t> sizes;
    for (uint64_t s : {uint64_t{2} << 20, uint64_t{18} << 20, uint64_t{64} << 20}) {
      if (s < f.h2d_copy_bytes) sizes.push_back(s);
    }
    sizes.push_back(f.h2d_copy_bytes);
    for (uint64_t size : sizes) {
      VAMP_ASSIGN_OR_RETURN(const double ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
        return CudaRuntimeStatus(
            cudaMemcpyAsync(dev.data(), host.data(), size, cudaMemcpyHostToDevice, stream.get()),
            "cudaMemcpyAsync (pinned host to device)");
      }));
      b.h2d_gbps.emplace_back(size, static_cast<double>(size) / (ms * 1e6));
    }
    b.h2d_peak_gbps = b.h2d_gbps.back().second;
  }
  {
    // Float32 logits of one row per sequence into a pageable vector (host-side sampling's copy).
    b.logits_bytes = static_cast<uint64_t>(f.batch) * static_cast<uint64_t>(vocab) * 4;
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(b.logits_bytes));
    std::vector<uint8_t> host(b.logits_bytes, 0);
    VAMP_ASSIGN_OR_RETURN(b.logits_d2h_ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
      return CudaRuntimeStatus(cudaMemcpyAsync(host.data(), dev.data(), b.logits_bytes,
                                               cudaMemcpyDeviceToHost, stream.get()),
                               "cudaMemcpyAsync (device to pageable host)");
    }));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
  return b;
}

// ---------------------------------------------------------------------------------------------
// The engine.

// Forwards expert shards to the store and logs progress every 8 MoE layers (loading the dummy
// 30B model takes a minute or two).
class ProgressSink final : public ExpertWeightSink {
 public:
  ProgressSink(ExpertWeightSink* inner, int64_t experts_per_layer, int64_t moe_layers,
               uint64_t shard_bytes)
      : inner_(inner),
        experts_per_layer_(experts_per_layer),
        moe_layers_(moe_layers),
        shard_bytes_(shard_bytes),
        start_(std::chrono::steady_clock::now()) {}

  absl::Status StoreExpertShard(int layer, int expert, absl::Span<const float> shard) override {
    VAMP_RETURN_IF_ERROR(inner_->StoreExpertShard(layer, expert, shard));
    const int64_t stored = ++stored_;
    if (stored % experts_per_layer_ != 0) return absl::OkStatus();
    const int64_t layers = stored / experts_per_layer_;
    if (layers % 8 == 0 || layers == moe_layers_) {
      VAMP_LOG(INFO) << absl::StrFormat(
          "loaded the experts of %d/%d MoE layers (%.1f GiB bf16) in %.0f s", layers, moe_layers_,
          static_cast<double>(stored) * static_cast<double>(shard_bytes_) / kGiB, Seconds(start_));
    }
    return absl::OkStatus();
  }

 private:
  ExpertWeightSink* const inner_;
  const int64_t experts_per_layer_, moe_layers_;
  const uint64_t shard_bytes_;
  const std::chrono::steady_clock::time_point start_;
  // The loader calls from one thread today; atomic so that progress stays right if it fans out.
  std::atomic<int64_t> stored_{0};
};

// The rank the bench drives (BuildRank on the CUDA device), with its CUDA parts typed.
struct GpuEngine {
  std::unique_ptr<Rank> rank;
  CudaQwen3MoeModel* model = nullptr;         // the rank's device model
  CudaExpertStoreWeights* experts = nullptr;  // the rank's expert weights
  double load_seconds = 0;
};

absl::StatusOr<std::unique_ptr<GpuEngine>> MakeEngine(const Flags& f, const ModelConfig& config) {
  auto e = std::make_unique<GpuEngine>();
  RankSpec spec;
  CudaDeviceOptions device;
  device.ordinal = f.cuda_device;
  device.forward.device_gemm_max_rows_per_expert = f.device_gemm_max_rows_per_expert;
  spec.device = CreateCudaDevice(device);
  spec.config = config;
  spec.dtype = DType::kBFloat16;

  spec.runner.block_size = f.block_size;
  spec.runner.max_num_seqs = f.batch + 1;  // the decode batch and the mixed steps' prompt
  spec.runner.max_num_batched_tokens = f.max_num_batched_tokens;
  spec.runner.max_model_len = 0;
  spec.runner.seed = f.seed;

  MemoryPlanConfig& pc = spec.plan;
  pc.gpu_memory_utilization = f.gpu_memory_utilization;
  pc.kv_block_size = f.block_size;
  pc.offload.max_offload_ratio = f.ratios.back();
  pc.max_num_batched_tokens = f.max_num_batched_tokens;
  pc.max_num_seqs = spec.runner.max_num_seqs;
  // As the agent on CUDA: the utilisation fraction leaves room for the context and cuBLAS.
  pc.runtime_overhead_bytes = 0;

  spec.load = [&f, &e](const ModelConfig& config, const MemoryPlan& plan,
                       ExpertWeightSink& sink) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    VAMP_LOG(INFO) << "memory plan:\n" << plan.Summary();
    const auto start = std::chrono::steady_clock::now();
    ProgressSink progress(&sink, config.num_experts,
                          static_cast<int64_t>(plan.experts.moe_layers.size()),
                          plan.experts.expert_bytes);
    std::unique_ptr<WeightSource> source = CreateDummyWeightSource(f.seed);
    VAMP_LOG(INFO) << "loading dummy weights of " << f.model_dir << " ("
                   << FormatBytes(plan.expert_weight_bytes) << " of experts in bfloat16)";
    absl::StatusOr<std::unique_ptr<CausalLm>> model =
        LoadModelFromSource(config, {}, *source, progress);
    e->load_seconds = Seconds(start);
    return model;
  };
  absl::StatusOr<std::unique_ptr<Rank>> rank = BuildRank(std::move(spec));
  if (!rank.ok()) {
    return absl::Status(
        rank.status().code(),
        absl::StrCat("GPU rank (--gpu_memory_utilization ", f.gpu_memory_utilization,
                     ", VAMP-r = ", f.ratios.back(), "): ", rank.status().message()));
  }
  e->rank = *std::move(rank);
  e->model = static_cast<CudaQwen3MoeModel*>(e->rank->device_model.get());
  e->experts = &static_cast<CudaRankExperts&>(*e->rank->experts).store_weights();
  VAMP_LOG(INFO) << absl::StrFormat(
      "engine ready in %.0f s: %s of non-expert weights and %s of workspace on the device, %d KV "
      "blocks",
      e->load_seconds, FormatBytes(e->model->weight_bytes()),
      FormatBytes(e->model->workspace_bytes()), e->rank->runner->kv_cache().num_blocks);
  return e;
}

// Groups to offload for VAMP-r: floor(r E) experts per eligible layer, whole groups.
int64_t GroupsFor(double ratio, const ExpertGeometry& g) {
  if (g.group_experts <= 0) return 0;
  const int64_t experts = static_cast<int64_t>(std::floor(ratio * g.num_experts + 1e-9));
  return std::min(experts / g.group_experts, g.max_groups);
}

// ---------------------------------------------------------------------------------------------
// The workload.

struct StepSample {
  double step_ms = 0;     // wall clock around ExecuteStep
  double forward_ms = 0;  // StepOutput::forward_us
  double sample_ms = 0;   // StepOutput::sample_us
  uint64_t staged_bytes = 0;
  int64_t staged_copies = 0;
};

struct PointResult {
  std::string mode;  // "decode" or "mixed"
  double ratio = 0;
  int64_t groups = 0;
  int64_t offloaded_experts_per_layer = 0;
  int64_t staged_layers = 0;
  uint64_t offloaded_bytes_per_layer = 0;
  int64_t tokens_per_step = 0;
  Summary step_ms, forward_ms, sample_ms;
  double staged_bytes_per_step = 0;
  double copies_per_step = 0;
  double copies_alone_ms = 0;  // the step's staging copies replayed alone
  int64_t graph_replays = 0;   // steps of the point (warm-up included) replayed from CUDA graphs
  // Filled in once the resident reference of the mode is known.
  double floor_ms = 0;
  double forward_over_floor = 0;
  double step_over_floor = 0;
  double staging_gbps_lower_bound = 0;
  double forward_overhead_pct = 0;
  double step_overhead_pct = 0;
};

class Workload {
 public:
  Workload(const Flags& f, GpuEngine* e) : f_(f), e_(e), rng_(f.seed + 1) {}

  // Lays out prompts and blocks, checks they fit the KV pool, and prefills the batch.
  absl::Status Fill() {
    const int64_t bs = f_.block_size;
    const int64_t vocab = e_->rank->config.vocab_size;
    // A decoding sequence grows by warmup + steps tokens per point from context + 1 known tokens.
    const int64_t blocks_per_seq = (f_.context + 1 + f_.warmup + f_.steps + bs - 1) / bs;
    const int64_t prefill_blocks = (f_.prefill_tokens + bs - 1) / bs;
    const int64_t needed = f_.batch * blocks_per_seq + prefill_blocks;
    const int64_t have = e_->rank->runner->kv_cache().num_blocks;
    if (needed > have) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the workload needs ", needed, " KV blocks (", f_.batch, " sequences x ", blocks_per_seq,
          " + ", prefill_blocks, " for the mixed steps' prompt); the pool has ", have,
          ": lower --batch or --context, or raise --gpu_memory_utilization"));
    }
    const int64_t max_len = e_->rank->runner->config().max_model_len;
    if (f_.context + 1 + f_.warmup + f_.steps > max_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("--context ", f_.context, " + ", f_.warmup + f_.steps + 1,
                       " decoded tokens exceed max_model_len ", max_len));
    }
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
    int32_t next_block = 0;
    prompts_.resize(f_.batch);
    blocks_.resize(f_.batch);
    for (int64_t i = 0; i < f_.batch; ++i) {
      prompts_[i].resize(f_.context + 1);
      for (int32_t& t : prompts_[i]) t = token(rng_);
      for (int64_t k = 0; k < blocks_per_seq; ++k) blocks_[i].push_back(next_block++);
    }
    prefill_prompt_.resize(f_.prefill_tokens);
    for (int32_t& t : prefill_prompt_) t = token(rng_);
    for (int64_t k = 0; k < prefill_blocks; ++k) prefill_block_ids_.push_back(next_block++);

    // Prefill the first `context` tokens of every prompt (each sequence samples one token when
    // its prompt is done; the points below re-admit it with its own last prompt token instead).
    const auto start = std::chrono::steady_clock::now();
    std::vector<int64_t> done(f_.batch, 0);
    std::vector<RunnerRequestId> ids(f_.batch, 0);
    int64_t steps = 0, finished = 0;
    while (finished < f_.batch) {
      StepInput in;
      int64_t budget = f_.max_num_batched_tokens;
      for (int64_t i = 0; i < f_.batch && budget > 0; ++i) {
        if (done[i] == f_.context) continue;
        const int64_t n = std::min(f_.context - done[i], budget);
        if (ids[i] == 0) {
          ids[i] = next_id_++;
          NewRequestData nr;
          nr.id = ids[i];
          nr.prompt_token_ids.assign(prompts_[i].begin(), prompts_[i].begin() + f_.context);
          nr.block_ids = blocks_[i];
          nr.sampling.temperature = 0;
          in.new_requests.push_back(std::move(nr));
          live_.push_back(ids[i]);
        } else {
          in.cached_requests.push_back({ids[i], {}, static_cast<int32_t>(done[i]), false});
        }
        in.scheduled.push_back({ids[i], static_cast<int32_t>(n)});
        budget -= n;
      }
      absl::StatusOr<StepOutput> out = e_->rank->runner->ExecuteStep(in);
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat("prefill step ", steps, ": ", out.status().message()));
      }
      for (const ScheduledRequest& s : in.scheduled) {
        const int64_t i =
            static_cast<int64_t>(std::find(ids.begin(), ids.end(), s.id) - ids.begin());
        done[i] += s.num_tokens;
        if (done[i] == f_.context) ++finished;
      }
      ++steps;
    }
    VAMP_LOG(INFO) << absl::StrFormat(
        "prefilled %d sequences x %d tokens in %d steps, %.1f s (%.0f tokens/s)", f_.batch,
        f_.context, steps, Seconds(start),
        static_cast<double>(f_.batch * f_.context) / Seconds(start));
    return absl::OkStatus();
  }

  // warmup + steps steps of the batch decoding from `context`, plus (mixed) one new prompt of
  // prefill_tokens per step. Returns the timed steps.
  absl::StatusOr<std::vector<StepSample>> Run(bool mixed) {
    std::vector<RunnerRequestId> ids(f_.batch);
    for (RunnerRequestId& id : ids) id = next_id_++;
    std::vector<StepSample> samples;
    const int64_t total = f_.warmup + f_.steps;
    for (int64_t s = 0; s < total; ++s) {
      StepInput in;
      if (s == 0) {
        // Re-admit the batch as prefix-cache hits at exactly `context` tokens.
        in.finished_ids = std::move(live_);
        live_.clear();
        for (int64_t i = 0; i < f_.batch; ++i) {
          NewRequestData nr;
          nr.id = ids[i];
          nr.prompt_token_ids = prompts_[i];
          nr.block_ids = blocks_[i];
          nr.num_computed_tokens = static_cast<int32_t>(f_.context);
          nr.sampling.temperature = 0;
          in.new_requests.push_back(std::move(nr));
          live_.push_back(ids[i]);
        }
      } else {
        for (RunnerRequestId id : ids) {
          in.cached_requests.push_back({id, {}, static_cast<int32_t>(f_.context + s), false});
        }
      }
      for (RunnerRequestId id : ids) in.scheduled.push_back({id, 1});
      if (mixed) {
        // The previous step's prompt is done; a new one arrives.
        if (prefill_id_ != 0) in.finished_ids.push_back(prefill_id_);
        prefill_id_ = next_id_++;
        NewRequestData nr;
        nr.id = prefill_id_;
        nr.prompt_token_ids = prefill_prompt_;
        nr.block_ids = prefill_block_ids_;
        nr.sampling.temperature = 0;
        in.new_requests.push_back(std::move(nr));
        in.scheduled.push_back({prefill_id_, static_cast<int32_t>(f_.prefill_tokens)});
      }
      const CudaStagingStats before = e_->experts->stats();
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<StepOutput> out = e_->rank->runner->ExecuteStep(in);
      const double step_ms = Seconds(start) * 1e3;
      if (!out.ok()) {
        return absl::Status(out.status().code(), absl::StrCat(mixed ? "mixed" : "decode", " step ",
                                                              s, ": ", out.status().message()));
      }
      const int64_t want_tokens = f_.batch + (mixed ? f_.prefill_tokens : 0);
      const size_t want_sampled = static_cast<size_t>(f_.batch + (mixed ? 1 : 0));
      if (out->num_tokens != want_tokens || out->sampled.size() != want_sampled) {
        return absl::InternalError(absl::StrCat(mixed ? "mixed" : "decode", " step ", s,
                                                " computed ", out->num_tokens,
                                                " tokens and sampled ", out->sampled.size(),
                                                "; expected ", want_tokens, " and ", want_sampled));
      }
      if (s < f_.warmup) continue;
      const CudaStagingStats& after = e_->experts->stats();
      StepSample sample;
      sample.step_ms = step_ms;
      sample.forward_ms = out->forward_us / 1e3;
      sample.sample_ms = out->sample_us / 1e3;
      sample.staged_bytes = after.bytes - before.bytes;
      sample.staged_copies = after.copies - before.copies;
      samples.push_back(sample);
    }
    if (mixed) {
      // Leave the last prompt for the next point's first step to finish.
      live_.push_back(prefill_id_);
      prefill_id_ = 0;
    }
    return samples;
  }

 private:
  const Flags& f_;
  GpuEngine* const e_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> prompts_;  // context + 1 tokens each
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<int32_t> prefill_prompt_;
  std::vector<int32_t> prefill_block_ids_;
  std::vector<RunnerRequestId> live_;  // requests the runner holds, finished by the next point
  RunnerRequestId next_id_ = 1;
  RunnerRequestId prefill_id_ = 0;
};

// The staging copies of one pass (every staged layer's pinned range [b, E)) replayed back to back
// on `stream` into `scratch`: what the copies cost with nothing else running. Milliseconds.
absl::StatusOr<double> ReplayStagingCopies(const ExpertStore& store, const DeviceBuffer& scratch,
                                           cudaStream_t stream, int reps) {
  std::vector<ExpertStore::HostRange> ranges;
  for (int layer : store.geometry().eligible_layers) {
    const ExpertStore::HostRange r = store.OffloadedHostRange(layer);
    if (r.bytes == 0) continue;
    if (r.bytes > scratch.bytes()) {
      return absl::InternalError(absl::StrCat("layer ", layer, " stages ", r.bytes,
                                              " bytes, more than the ", scratch.bytes(),
                                              "-byte scratch buffer"));
    }
    ranges.push_back(r);
  }
  if (ranges.empty()) return 0.0;
  CudaEventPair timer;
  VAMP_RETURN_IF_ERROR(timer.Init());
  return timer.TimeMs(stream, reps, [&]() -> absl::Status {
    for (const ExpertStore::HostRange& r : ranges) {
      VAMP_CUDART_RETURN_IF_ERROR(
          cudaMemcpyAsync(scratch.data(), r.data, r.bytes, cudaMemcpyHostToDevice, stream));
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// The decode floor.

struct DecodeFloor {
  int64_t tokens = 0;
  double expected_experts_per_layer = 0;
  double non_expert_bytes = 0;
  double expert_bytes = 0;
  double kv_bytes = 0;
  double total_bytes = 0;
  double ms = 0;
  std::string estimate;
};

DecodeFloor ComputeDecodeFloor(const Flags& f, const GpuEngine& e, double hbm_gbps) {
  const ModelConfig& c = e.rank->config;
  const double dtype = 2.0;  // bfloat16
  DecodeFloor d;
  d.tokens = f.batch;
  const double E = static_cast<double>(c.num_experts);
  const double k = static_cast<double>(c.num_experts_per_tok);
  d.expected_experts_per_layer = E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(d.tokens)));
  // Every non-expert weight on the device, but only the batch's rows of an untied embedding.
  const double embed = static_cast<double>(c.vocab_size * c.hidden_size) * dtype;
  d.non_expert_bytes = static_cast<double>(e.model->weight_bytes());
  if (!c.tie_word_embeddings) {
    d.non_expert_bytes += static_cast<double>(d.tokens * c.hidden_size) * dtype - embed;
  }
  d.expert_bytes = d.expected_experts_per_layer *
                   static_cast<double>(e.rank->plan.experts.expert_bytes) *
                   static_cast<double>(e.rank->plan.experts.moe_layers.size());
  // K and V of every attention layer over the mean context of the timed steps.
  const double mean_context =
      static_cast<double>(f.context + f.warmup) + static_cast<double>(f.steps + 1) / 2.0;
  d.kv_bytes = static_cast<double>(f.batch) * mean_context *
               static_cast<double>(e.rank->plan.kv.attention_layers.size()) * 2.0 *
               static_cast<double>(e.model->kv_heads_per_rank() * c.head_dim) * dtype;
  d.total_bytes = d.non_expert_bytes + d.expert_bytes + d.kv_bytes;
  d.ms = d.total_bytes / (hbm_gbps * 1e6);
  d.estimate = absl::StrFormat(
      "uniform routing: E(1-(1-k/E)^T) = %.1f distinct experts per MoE layer for T = %d tokens, "
      "k = %d, E = %d; KV at the timed steps' mean context %.1f",
      d.expected_experts_per_layer, d.tokens, c.num_experts_per_tok, c.num_experts, mean_context);
  return d;
}

// ---------------------------------------------------------------------------------------------

absl::Status Main(int argc, char** argv) {
  const ConfigSchema schema = Schema();
  VAMP_ASSIGN_OR_RETURN(CommandLine cli, ParseCommandLine(schema, argc, argv));
  if (cli.help_requested) {
    std::printf("%s", schema
                          .HelpText("vamp_gpu_step_bench",
                                    "Step time of the bf16 GPU engine (dummy weights) against the "
                                    "HBM decode floor and the expert-staging floor, per offload "
                                    "ratio (issue 7 benchmarks).")
                          .c_str());
    return absl::OkStatus();
  }
  if (!cli.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", cli.positional.front(), "' (see --help)"));
  }
  VAMP_ASSIGN_OR_RETURN(const Flags f, ReadFlags(cli.config));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(f.model_dir);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("--model '", f.model_dir, "': ", config.status().message()));
  }
  VAMP_LOG(INFO) << absl::StrFormat(
      "%s: %d layers, hidden %d, %d experts top-%d, vocab %d; batch %d @ %d tokens, mixed "
      "+%d-token prompt, ratios %s",
      f.model_dir, config->num_hidden_layers, config->hidden_size, config->num_experts,
      config->num_experts_per_tok, config->vocab_size, f.batch, f.context, f.prefill_tokens,
      absl::StrJoin(f.ratios, ","));

  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  if (count_err != cudaSuccess || devices == 0) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device (", cudaGetErrorName(count_err), ", ", devices,
                     " devices): vamp_gpu_step_bench runs on a GPU host"));
  }
  if (f.cuda_device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device ", f.cuda_device, ": the host has ", devices, " devices"));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(f.cuda_device));

  VAMP_ASSIGN_OR_RETURN(const Bandwidths bw, MeasureBandwidths(f, config->vocab_size));
  VAMP_LOG(INFO) << absl::StrFormat(
      "%s: HBM %.0f GB/s (device copy of %s), pinned H2D %.1f GB/s (%s), logits D2H %.2f ms",
      bw.device_name, bw.hbm_gbps, FormatBytes(bw.hbm_copy_bytes), bw.h2d_peak_gbps,
      FormatBytes(f.h2d_copy_bytes), bw.logits_d2h_ms);

  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> engine, MakeEngine(f, *config));
  GpuEngine& e = *engine;
  const ExpertGeometry& g = e.rank->plan.experts;
  Workload workload(f, &e);
  VAMP_RETURN_IF_ERROR(workload.Fill());

  // The largest per-layer copy, for the replay.
  DeviceBuffer scratch;
  if (g.max_groups > 0) {
    VAMP_ASSIGN_OR_RETURN(
        scratch, DeviceBuffer::Allocate(static_cast<uint64_t>(g.max_groups) * g.group_bytes));
  }
  VAMP_ASSIGN_OR_RETURN(CudaStream replay_stream, CudaStream::Create());

  std::vector<PointResult> points;
  for (double ratio : f.ratios) {
    const int64_t groups = GroupsFor(ratio, g);
    const int64_t more = groups - e.rank->memory.repartitioner->offloaded_groups();
    if (more < 0) return absl::InternalError("ratios must ascend");
    if (more > 0) {
      absl::StatusOr<RemapResult> r = e.rank->memory.repartitioner->Offload(more);
      if (!r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat("offloading ", more, " groups for VAMP-r ", ratio, ": ",
                                         r.status().message()));
      }
      VAMP_RETURN_IF_ERROR(e.rank->RefreshKv());
      VAMP_LOG(INFO) << absl::StrFormat(
          "VAMP-r %.2f: offloaded %d more groups in %.1f ms; boundary %d/%d, KV %d -> %d blocks",
          ratio, more, r->total_us / 1e3, r->boundary, g.num_experts, r->kv_blocks_before,
          r->kv_blocks_after);
    }
    const int64_t offloaded = g.num_experts - e.rank->memory.experts->boundary();
    double replay_ms = 0;
    if (offloaded > 0) {
      VAMP_ASSIGN_OR_RETURN(
          replay_ms, ReplayStagingCopies(*e.rank->memory.experts, scratch, replay_stream.get(), 3));
    }
    // Decode points run as CUDA graphs when nothing is staged; the resident point is measured
    // launch by launch as well, to show what the graphs save.
    struct Variant {
      bool mixed;
      bool graphs;
    };
    std::vector<Variant> variants = {{false, true}, {true, true}};
    if (offloaded == 0) variants.insert(variants.begin(), Variant{false, false});
    for (const Variant& v : variants) {
      const bool mixed = v.mixed;
      if (mixed && f.prefill_tokens == 0) continue;
      e.model->set_cuda_graphs(v.graphs);
      const CudaGraphStats graphs_before = e.model->graph_stats();
      absl::StatusOr<std::vector<StepSample>> samples = workload.Run(mixed);
      e.model->set_cuda_graphs(true);
      if (!samples.ok()) {
        return absl::Status(samples.status().code(),
                            absl::StrCat("VAMP-r ", ratio, ": ", samples.status().message()));
      }
      PointResult p;
      p.mode = mixed ? "mixed" : (v.graphs ? "decode" : "decode, CUDA graphs off");
      p.graph_replays = e.model->graph_stats().replays - graphs_before.replays;
      p.ratio = ratio;
      p.groups = groups;
      p.offloaded_experts_per_layer = offloaded;
      p.staged_layers = static_cast<int64_t>(e.experts->staged_layers().size());
      p.offloaded_bytes_per_layer = static_cast<uint64_t>(offloaded) * g.expert_bytes;
      p.tokens_per_step = f.batch + (mixed ? f.prefill_tokens : 0);
      std::vector<double> step, fwd, smp;
      double bytes = 0, copies = 0;
      for (const StepSample& s : *samples) {
        step.push_back(s.step_ms);
        fwd.push_back(s.forward_ms);
        smp.push_back(s.sample_ms);
        bytes += static_cast<double>(s.staged_bytes);
        copies += static_cast<double>(s.staged_copies);
      }
      p.step_ms = Summarise(step);
      p.forward_ms = Summarise(fwd);
      p.sample_ms = Summarise(smp);
      p.staged_bytes_per_step = bytes / static_cast<double>(samples->size());
      p.copies_per_step = copies / static_cast<double>(samples->size());
      p.copies_alone_ms = replay_ms;
      VAMP_LOG(INFO) << absl::StrFormat(
          "VAMP-r %.2f %s: step p50 %.2f ms (forward %.2f, sampling %.2f), %.1f MiB staged per "
          "step in %.1f copies",
          ratio, p.mode, p.step_ms.p50, p.forward_ms.p50, p.sample_ms.p50,
          p.staged_bytes_per_step / kMiB, p.copies_per_step);
      points.push_back(p);
    }
  }

  // Floors and overheads against the resident point of the same mode.
  for (PointResult& p : points) {
    const PointResult* resident = nullptr;
    for (const PointResult& q : points) {
      if (q.mode == p.mode && q.groups == 0) {
        resident = &q;
        break;
      }
    }
    if (resident == nullptr) return absl::InternalError("no resident point");
    const double copy_ms = p.staged_bytes_per_step / (bw.h2d_peak_gbps * 1e6);
    p.floor_ms = std::max(resident->forward_ms.p50, copy_ms);
    p.forward_over_floor = p.forward_ms.p50 / p.floor_ms;
    p.step_over_floor =
        p.step_ms.p50 / (p.floor_ms + (resident->step_ms.p50 - resident->forward_ms.p50));
    p.staging_gbps_lower_bound =
        p.staged_bytes_per_step > 0 ? p.staged_bytes_per_step / (p.forward_ms.p50 * 1e6) : 0;
    p.forward_overhead_pct = 100.0 * (p.forward_ms.p50 / resident->forward_ms.p50 - 1.0);
    p.step_overhead_pct = 100.0 * (p.step_ms.p50 / resident->step_ms.p50 - 1.0);
  }
  const DecodeFloor floor = ComputeDecodeFloor(f, e, bw.hbm_gbps);
  const PointResult& resident_decode = points.front();

  // Human table.
  std::string out = absl::StrFormat(
      "\n%s, %s; Qwen3-MoE %s (dummy weights, bfloat16), batch %d @ %d tokens\n"
      "HBM %.0f GB/s, pinned H2D %.1f GB/s (%s copy), logits D2H %.2f ms per step\n\n"
      "decode floor: %.2f ms = (%.2f GiB non-expert + %.2f GiB experts + %.2f GiB KV) / HBM\n"
      "  (%s)\n"
      "resident decode: forward %.2f ms = %.2fx the floor; step (with sampling) %.2f ms\n\n",
      bw.device_name, FormatBytes(bw.device_memory_bytes), f.model_dir, f.batch, f.context,
      bw.hbm_gbps, bw.h2d_peak_gbps, FormatBytes(f.h2d_copy_bytes), bw.logits_d2h_ms, floor.ms,
      floor.non_expert_bytes / kGiB, floor.expert_bytes / kGiB, floor.kv_bytes / kGiB,
      floor.estimate, resident_decode.forward_ms.p50, resident_decode.forward_ms.p50 / floor.ms,
      resident_decode.step_ms.p50);
  absl::StrAppend(
      &out,
      "| mode | VAMP-r | offloaded/layer | staged MiB/step | copies alone ms | "
      "forward p50 ms | step p50 ms | floor ms | forward/floor | H2D GB/s (>=) | "
      "TPOT overhead (forward / step) |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const PointResult& p : points) {
    absl::StrAppendFormat(&out,
                          "| %s | %.2f | %d/%d (%.1f%%) | %.1f | %.2f | %.2f | %.2f | %.2f | "
                          "%.3f | %.1f | %+.1f%% / %+.1f%% |\n",
                          p.mode, p.ratio, p.offloaded_experts_per_layer, g.num_experts,
                          100.0 * p.offloaded_experts_per_layer / g.num_experts,
                          p.staged_bytes_per_step / kMiB, p.copies_alone_ms, p.forward_ms.p50,
                          p.step_ms.p50, p.floor_ms, p.forward_over_floor,
                          p.staging_gbps_lower_bound, p.forward_overhead_pct, p.step_overhead_pct);
  }
  absl::StrAppendFormat(&out,
                        "\nfloor = max(resident forward, staged bytes / pinned H2D); paper: TPOT "
                        "%+.1f%% at VAMP-15 (Qwen3-Next-80B, TP2, H100)\n",
                        kPaperTpotOverheadPct);
  std::printf("%s", out.c_str());

  if (!f.json.empty()) {
    Json j;
    j["bench"] = "vamp_gpu_step_bench";
    j["device"] = {{"name", bw.device_name},
                   {"memory_bytes", bw.device_memory_bytes},
                   {"hbm_gbps", bw.hbm_gbps},
                   {"hbm_copy_bytes", bw.hbm_copy_bytes},
                   {"h2d_peak_gbps", bw.h2d_peak_gbps},
                   {"logits_d2h_bytes", bw.logits_bytes},
                   {"logits_d2h_ms", bw.logits_d2h_ms}};
    Json h2d = Json::array();
    for (const auto& [bytes, gbps] : bw.h2d_gbps) h2d.push_back({{"bytes", bytes}, {"gbps", gbps}});
    j["device"]["h2d_pinned"] = h2d;
    j["model"] = {{"dir", f.model_dir},
                  {"layers", e.rank->config.num_hidden_layers},
                  {"hidden", e.rank->config.hidden_size},
                  {"experts", e.rank->config.num_experts},
                  {"top_k", e.rank->config.num_experts_per_tok},
                  {"vocab", e.rank->config.vocab_size},
                  {"dtype", "bfloat16"},
                  {"non_expert_weight_bytes", e.model->weight_bytes()},
                  {"workspace_bytes", e.model->workspace_bytes()},
                  {"expert_bytes", g.expert_bytes},
                  {"group_experts", g.group_experts},
                  {"moe_layers", g.moe_layers.size()},
                  {"eligible_layers", g.eligible_layers.size()},
                  {"load_seconds", e.load_seconds}};
    j["plan"] = {{"gpu_memory_utilization", f.gpu_memory_utilization},
                 {"max_offload_ratio", f.ratios.back()},
                 {"max_groups", g.max_groups},
                 {"kv_baseline_blocks", e.rank->plan.kv_baseline_blocks},
                 {"kv_max_blocks", e.rank->plan.kv_max_blocks},
                 {"page_bytes", g.page_bytes}};
    j["workload"] = {{"batch", f.batch},
                     {"context", f.context},
                     {"prefill_tokens", f.prefill_tokens},
                     {"steps", f.steps},
                     {"warmup", f.warmup},
                     {"max_num_batched_tokens", f.max_num_batched_tokens},
                     {"device_gemm_max_rows_per_expert", f.device_gemm_max_rows_per_expert}};
    j["decode_floor"] = {{"tokens", floor.tokens},
                         {"expected_experts_per_layer", floor.expected_experts_per_layer},
                         {"non_expert_bytes", floor.non_expert_bytes},
                         {"expert_bytes", floor.expert_bytes},
                         {"kv_bytes", floor.kv_bytes},
                         {"total_bytes", floor.total_bytes},
                         {"ms", floor.ms},
                         {"estimate", floor.estimate}};
    Json pts = Json::array();
    for (const PointResult& p : points) {
      pts.push_back({{"mode", p.mode},
                     {"ratio", p.ratio},
                     {"groups", p.groups},
                     {"offloaded_experts_per_layer", p.offloaded_experts_per_layer},
                     {"offloaded_fraction", static_cast<double>(p.offloaded_experts_per_layer) /
                                                static_cast<double>(g.num_experts)},
                     {"staged_layers", p.staged_layers},
                     {"offloaded_bytes_per_layer", p.offloaded_bytes_per_layer},
                     {"tokens_per_step", p.tokens_per_step},
                     {"step_ms", ToJson(p.step_ms)},
                     {"forward_ms", ToJson(p.forward_ms)},
                     {"sample_ms", ToJson(p.sample_ms)},
                     {"staged_bytes_per_step", p.staged_bytes_per_step},
                     {"copies_per_step", p.copies_per_step},
                     {"graph_replays", p.graph_replays},
                     {"copies_alone_ms", p.copies_alone_ms},
                     {"floor_ms", p.floor_ms},
                     {"forward_over_floor", p.forward_over_floor},
                     {"step_over_floor", p.step_over_floor},
                     {"staging_gbps_lower_bound", p.staging_gbps_lower_bound},
                     {"forward_overhead_pct", p.forward_overhead_pct},
                     {"step_overhead_pct", p.step_overhead_pct}});
    }
    j["points"] = pts;
    j["paper_tpot_overhead_pct_vamp15"] = kPaperTpotOverheadPct;
    std::ofstream file(f.json);
    file << j.dump(2) << "\n";
    if (!file) return absl::InternalError(absl::StrCat("--json: cannot write '", f.json, "'"));
    VAMP_LOG(INFO) << "wrote " << f.json;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) {
  const absl::Status s = vamp::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "vamp_gpu_step_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
