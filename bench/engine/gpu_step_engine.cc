#include "bench/engine/gpu_step_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/engine/gpu_step_common.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/model_loader.h"
#include "engine/model/weight_source.h"

namespace vamp::gpu_step_bench {

namespace {

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

}  // namespace

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

int64_t GroupsFor(double ratio, const ExpertGeometry& g) {
  if (g.group_experts <= 0) return 0;
  const int64_t experts = static_cast<int64_t>(std::floor(ratio * g.num_experts + 1e-9));
  return std::min(experts / g.group_experts, g.max_groups);
}

}  // namespace vamp::gpu_step_bench
