#include "engine/rank/rank.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace vamp {

RankModelLoader LoadWith(LoadOptions options) {
  return [options = std::move(options)](const ModelConfig& config, const MemoryPlan&,
                                        ExpertWeightSink& sink) {
    return LoadModel(config, options, sink);
  };
}

absl::StatusOr<KvCacheView> Rank::KvView(int64_t blocks) const {
  VAMP_ASSIGN_OR_RETURN(KvCacheView view,
                        device->KvView(*memory.kv, static_cast<int>(config.num_hidden_layers)));
  if (blocks >= 0) view.num_blocks = blocks;
  return view;
}

absl::Status Rank::RefreshKv(int64_t blocks) {
  VAMP_ASSIGN_OR_RETURN(KvCacheView view, KvView(blocks));
  return runner->SetKvCache(std::move(view));
}

absl::Status Rank::ResetRunner(Communicator* comm, int64_t blocks) {
  runner.reset();
  VAMP_ASSIGN_OR_RETURN(KvCacheView view, KvView(blocks));
  VAMP_ASSIGN_OR_RETURN(
      runner, ModelRunner::Create(runner_config, &model(), &expert_weights(), comm, view));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Rank>> BuildRank(RankSpec spec) {
  if (spec.device == nullptr || spec.load == nullptr) {
    return absl::InvalidArgumentError("BuildRank: RankSpec needs a device and a model loader");
  }
  auto rank = std::make_unique<Rank>();
  rank->device = std::move(spec.device);
  rank->config = spec.config;
  rank->runner_config = spec.runner;
  Device& device = *rank->device;
  if (spec.backend != nullptr) {
    rank->backend = std::move(spec.backend);
  } else {
    absl::StatusOr<std::unique_ptr<MemoryBackend>> backend = device.CreateMemoryBackend();
    if (!backend.ok()) return WithPrefix(backend.status(), "memory backend: ");
    rank->backend = std::move(*backend);
  }

  MemoryPlanConfig plan_config = spec.plan;
  plan_config.page_bytes = rank->backend->page_bytes();
  if (plan_config.device_memory_bytes == 0) {
    plan_config.device_memory_bytes = rank->backend->device_memory_bytes();
  }
  const ModelShape shape = rank->config.ToModelShape(DTypeBytes(spec.dtype));
  VAMP_ASSIGN_OR_RETURN(rank->plan, spec.kv_pages > 0
                                        ? PlanWithKvPages(shape, plan_config, spec.kv_pages)
                                        : PlanMemory(shape, plan_config));

  rank->fence = device.CreateFence();
  absl::StatusOr<AgentMemory> memory =
      CreateAgentMemory(rank->backend.get(), rank->plan, rank->fence.get());
  if (!memory.ok()) return WithPrefix(memory.status(), "memory: ");
  rank->memory = std::move(*memory);

  VAMP_ASSIGN_OR_RETURN(ExpertShardLayout layout, ExpertLayoutFor(rank->config, spec.parallel));
  layout.dtype = spec.dtype;  // as planned: the store's shards are of the engine's dtype
  absl::StatusOr<std::unique_ptr<RankExperts>> experts =
      device.CreateExperts(rank->memory.experts.get(), layout);
  if (!experts.ok()) return WithPrefix(experts.status(), "expert store: ");
  rank->experts = std::move(*experts);
  VAMP_ASSIGN_OR_RETURN(rank->host_model,
                        spec.load(rank->config, rank->plan, rank->experts->sink()));
  VAMP_RETURN_IF_ERROR(WithPrefix(rank->memory.experts->FinalizeLoad(), "expert store: "));

  absl::StatusOr<DeviceModel> device_model = device.CreateModel(
      rank->host_model.get(), rank->runner_config, spec.dtype, spec.all_reduce, *rank->experts);
  if (!device_model.ok()) {
    return WithPrefix(device_model.status(), absl::StrCat(device.name(), " model: "));
  }
  rank->device_model = std::move(device_model->model);
  rank->other_weight_bytes = device_model->weight_bytes;
  if (rank->host_model->kv_heads_per_rank() != rank->plan.kv.kv_heads_per_rank ||
      rank->config.head_dim != rank->plan.kv.head_dim) {
    return absl::InternalError(absl::StrCat(
        "KV geometry mismatch: the model stores ", rank->host_model->kv_heads_per_rank(),
        " heads of ", rank->config.head_dim, ", the memory plan ", rank->plan.kv.kv_heads_per_rank,
        " of ", rank->plan.kv.head_dim));
  }
  // The plan reserved the recurrent state before sizing the KV pool; the model must hold what was
  // planned (float32 slots).
  const uint64_t state_bytes =
      static_cast<uint64_t>(rank->host_model->RecurrentStateFloatsPerSlot()) * sizeof(float);
  if (state_bytes != rank->plan.recurrent_state_bytes_per_seq) {
    return absl::InternalError(absl::StrCat(
        "recurrent state mismatch: the model keeps ", state_bytes, " bytes per sequence, the memory "
        "plan ", rank->plan.recurrent_state_bytes_per_seq));
  }
  VAMP_RETURN_IF_ERROR(rank->ResetRunner(spec.comm));
  return rank;
}

}  // namespace vamp
