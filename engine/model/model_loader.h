// Loads a model for one tensor-parallel rank: its config, weights from a checkpoint or dummy
// values, non-expert weights into the model's own buffers and experts into an ExpertWeightSink.
#ifndef VAMP_ENGINE_MODEL_MODEL_LOADER_H_
#define VAMP_ENGINE_MODEL_MODEL_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/causal_lm.h"
#include "engine/model/model_config.h"
#include "engine/model/parallel.h"
#include "engine/model/weight_source.h"

namespace vamp {

// `--load-format`: "auto" and "safetensors" read the checkpoint; "dummy" fills seeded random
// weights of the real shapes (benchmarks at full scale without a checkpoint).
enum class LoadFormat { kAuto, kSafetensors, kDummy };
absl::StatusOr<LoadFormat> ParseLoadFormat(absl::string_view name);

struct LoadOptions {
  // Checkpoint directory (config.json + *.safetensors). With kDummy only config.json is read.
  std::string model_path;
  LoadFormat format = LoadFormat::kAuto;
  // Seed of the dummy weights.
  uint64_t dummy_seed = 0;
  ParallelConfig parallel;
};

// The rank-local expert shard layout of `config` under `parallel`; errors when the intermediate
// size does not split evenly.
absl::StatusOr<ExpertShardLayout> ExpertLayoutFor(const ModelConfig& config,
                                                  const ParallelConfig& parallel);

// Builds the model of `config`'s architecture from `source`; expert shards go to `experts`.
absl::StatusOr<std::unique_ptr<CausalLm>> LoadModelFromSource(const ModelConfig& config,
                                                              const ParallelConfig& parallel,
                                                              WeightSource& source,
                                                              ExpertWeightSink& experts);

// Reads `config` from options.model_path unless given, opens the weight source of
// options.format and loads.
absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(const ModelConfig& config,
                                                    const LoadOptions& options,
                                                    ExpertWeightSink& experts);

// Expert shards in plain host memory, all resident: the simplest ExpertWeightSink and
// ExpertWeights (tests, tools, and the reference the ExpertStore is compared with).
class HostExpertBuffers : public ExpertWeightSink, public ExpertWeights {
 public:
  HostExpertBuffers(int num_layers, int num_experts, ExpertShardLayout layout);

  absl::Status StoreExpertShard(int layer, int expert, absl::Span<const float> shard) override;

  absl::Status BeginPass() override { return absl::OkStatus(); }
  // Errors when an expert of the layer was never stored.
  absl::StatusOr<ExpertLayerTable> AcquireLayer(int layer) override;
  absl::Status ReleaseLayer(int layer) override { return absl::OkStatus(); }
  absl::Status EndPass() override { return absl::OkStatus(); }

  // Null until stored.
  const float* shard(int layer, int expert) const;
  ExpertShardLayout layout() const { return layout_; }

 private:
  int num_layers_;
  int num_experts_;
  ExpertShardLayout layout_;
  std::vector<std::vector<float>> shards_;  // [layer * num_experts + expert]
  std::vector<const void*> w13_;            // same indexing; null until stored
  std::vector<const void*> w2_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_MODEL_LOADER_H_
