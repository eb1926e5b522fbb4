#include "engine/model/model_loader.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/qwen3_moe.h"
#include "engine/model/qwen3_next.h"

namespace vamp {

absl::StatusOr<LoadFormat> ParseLoadFormat(absl::string_view name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return absl::InvalidArgumentError(
      absl::StrCat("load format '", name, "' is not one of 'auto', 'safetensors', 'dummy'"));
}

absl::StatusOr<ExpertShardLayout> ExpertLayoutFor(const ModelConfig& config,
                                                  const ParallelConfig& parallel) {
  if (parallel.tp_size < 1 || config.moe_intermediate_size % parallel.tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'moe_intermediate_size' (", config.moe_intermediate_size,
                     ") is not divisible by the tensor parallel size ", parallel.tp_size));
  }
  return ExpertShardLayout{config.hidden_size, config.moe_intermediate_size / parallel.tp_size};
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadModelFromSource(const ModelConfig& config,
                                                              const ParallelConfig& parallel,
                                                              WeightSource& source,
                                                              ExpertWeightSink& experts) {
  switch (config.architecture) {
    case Architecture::kQwen3Moe: {
      VAMP_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3MoeModel> model,
                            Qwen3MoeModel::Load(config, parallel, source, experts));
      return std::unique_ptr<CausalLm>(std::move(model));
    }
    case Architecture::kQwen3Next: {
      VAMP_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3NextModel> model,
                            Qwen3NextModel::Load(config, parallel, source, experts));
      return std::unique_ptr<CausalLm>(std::move(model));
    }
  }
  return absl::UnimplementedError(
      absl::StrCat("architecture ", config.architecture_name, " has no model definition"));
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(const ModelConfig& config,
                                                    const LoadOptions& options,
                                                    ExpertWeightSink& experts) {
  std::unique_ptr<WeightSource> source;
  if (options.format == LoadFormat::kDummy) {
    source = CreateDummyWeightSource(options.dummy_seed);
  } else {
    VAMP_ASSIGN_OR_RETURN(source, OpenSafetensorsCheckpoint(options.model_path));
  }
  return LoadModelFromSource(config, options.parallel, *source, experts);
}

HostExpertBuffers::HostExpertBuffers(int num_layers, int num_experts, ExpertShardLayout layout)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      layout_(layout),
      shards_(static_cast<size_t>(num_layers) * num_experts),
      w13_(shards_.size(), nullptr),
      w2_(shards_.size(), nullptr) {}

absl::Status HostExpertBuffers::StoreExpertShard(int layer, int expert,
                                                 absl::Span<const float> shard) {
  if (layer < 0 || layer >= num_layers_ || expert < 0 || expert >= num_experts_) {
    return absl::OutOfRangeError(absl::StrCat("expert ", expert, " of layer ", layer,
                                              " is outside ", num_layers_, " layers x ",
                                              num_experts_, " experts"));
  }
  if (layout_.dtype != DType::kFloat32) {
    return absl::FailedPreconditionError("host expert buffers hold float32 shards");
  }
  if (static_cast<int64_t>(shard.size()) != layout_.Elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert shard of ", shard.size(), " elements, expected ", layout_.Elements()));
  }
  const size_t i = static_cast<size_t>(layer) * num_experts_ + expert;
  shards_[i].assign(shard.begin(), shard.end());
  w13_[i] = shards_[i].data();
  w2_[i] = shards_[i].data() + layout_.W13Elements();
  return absl::OkStatus();
}

absl::StatusOr<ExpertLayerTable> HostExpertBuffers::AcquireLayer(int layer) {
  if (layer < 0 || layer >= num_layers_) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts"));
  }
  const size_t first = static_cast<size_t>(layer) * num_experts_;
  ExpertLayerTable table{w13_.data() + first, w2_.data() + first};
  for (int e = 0; e < num_experts_; ++e) {
    if (table.w13[e] == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert ", e, " of layer ", layer, " was never loaded"));
    }
  }
  return table;
}

const float* HostExpertBuffers::shard(int layer, int expert) const {
  return static_cast<const float*>(w13_[static_cast<size_t>(layer) * num_experts_ + expert]);
}

}  // namespace vamp
