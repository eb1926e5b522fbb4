// The model's view of the ExpertStore on the CPU engine: the loader writes expert shards into the
// store (ExpertWeightSink), and the forward pass reads them through per-layer pointer tables
// (ExpertWeights) that point into the resident region below the residency boundary and into one
// of the store's staging buffers above it. Offloaded experts are staged by a HostStagingEngine
// following the double-buffered plan (staging_plan.h), overlapped with the layers before them.
//
// Requires the host memory backend (device addresses are host pointers) and float32 weights
// laid out as ExpertShardLayout. The store's boundary must not change during a pass (the runner
// applies remaps between steps); tables are rebuilt when the store's table_version changes.
#ifndef VAMP_ENGINE_STAGING_EXPERT_STORE_WEIGHTS_H_
#define VAMP_ENGINE_STAGING_EXPERT_STORE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/experts/expert_store.h"
#include "engine/model/causal_lm.h"
#include "engine/staging/host_staging_engine.h"

namespace vamp {

struct StagingOptions {
  // Record the copy/release schedule (tests).
  bool record_events = false;
};

class ExpertStoreWeights final : public ExpertWeightSink, public ExpertWeights {
 public:
  // `store` must outlive this object. Its geometry must match `layout` (float32 shards).
  static absl::StatusOr<std::unique_ptr<ExpertStoreWeights>> Create(ExpertStore* store,
                                                                    ExpertShardLayout layout,
                                                                    StagingOptions options = {});

  // ExpertWeightSink: writes [w13 | w2] of one expert into its region.
  absl::Status StoreExpertShard(int layer, int expert, absl::Span<const float> shard) override;

  // ExpertWeights.
  absl::Status BeginPass() override;
  absl::StatusOr<ExpertLayerTable> AcquireLayer(int layer) override;
  absl::Status ReleaseLayer(int layer) override;
  absl::Status EndPass() override;

  const HostStagingEngine& engine() const { return engine_; }
  // The decoder layers staged in the current (or last) pass, in order.
  const std::vector<int>& staged_layers() const { return staged_layers_; }

 private:
  ExpertStoreWeights(ExpertStore* store, ExpertShardLayout layout, StagingOptions options);
  // Rebuilds pointer tables and the staging plan for the store's current boundary.
  absl::Status Rebuild();

  ExpertStore* const store_;
  const ExpertShardLayout layout_;
  const StagingOptions options_;
  HostStagingEngine engine_;

  // Below: touched only by the thread running the forward pass.
  bool built_ = false;
  uint64_t built_version_ = 0;
  std::vector<int> staged_layers_;
  std::vector<StagingCopy> plan_;
  std::vector<int> job_of_layer_;              // by decoder layer: index into plan_, or -1
  std::vector<std::vector<const void*>> w13_;  // by decoder layer (empty for non-MoE layers)
  std::vector<std::vector<const void*>> w2_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_STAGING_EXPERT_STORE_WEIGHTS_H_
