#include "engine/staging/expert_store_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/staging/expert_pointer_tables.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<ExpertStoreWeights>> ExpertStoreWeights::Create(
    ExpertStore* store, ExpertShardLayout layout, StagingOptions options) {
  const ExpertGeometry& g = store->geometry();
  if (store->backend()->name() != "host") {
    return absl::FailedPreconditionError(
        absl::StrCat("the CPU engine reads experts through host pointers; the expert store uses "
                     "the '",
                     store->backend()->name(), "' memory backend"));
  }
  if (g.w13_bytes != static_cast<uint64_t>(layout.W13Elements()) * sizeof(float) ||
      g.w2_bytes != static_cast<uint64_t>(layout.W2Elements()) * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert store geometry (w13 ", g.w13_bytes, " B, w2 ", g.w2_bytes,
                     " B) does not match float32 shards of hidden ", layout.hidden,
                     " and intermediate ", layout.inter));
  }
  return std::unique_ptr<ExpertStoreWeights>(new ExpertStoreWeights(store, layout, options));
}

ExpertStoreWeights::ExpertStoreWeights(ExpertStore* store, ExpertShardLayout layout,
                                       StagingOptions options)
    : store_(store), layout_(layout), options_(options), engine_(options.record_events) {}

absl::Status ExpertStoreWeights::StoreExpertShard(int layer, int expert,
                                                  absl::Span<const float> shard) {
  if (layout_.dtype != DType::kFloat32) {
    return absl::FailedPreconditionError("the CPU expert store holds float32 shards");
  }
  if (static_cast<int64_t>(shard.size()) != layout_.Elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert shard of ", shard.size(), " elements, expected ", layout_.Elements()));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(shard.data());
  const uint64_t w13 = layout_.W13Elements() * sizeof(float);
  const uint64_t w2 = layout_.W2Elements() * sizeof(float);
  return store_->WriteExpert(layer, expert, absl::MakeConstSpan(bytes, w13),
                             absl::MakeConstSpan(bytes + w13, w2));
}

absl::Status ExpertStoreWeights::Rebuild() {
  VAMP_ASSIGN_OR_RETURN(ExpertPointerTables t, BuildExpertPointerTables(*store_));
  staged_layers_ = std::move(t.staged_layers);
  plan_ = std::move(t.plan);
  job_of_layer_ = std::move(t.job_of_layer);
  w13_ = std::move(t.w13);
  w2_ = std::move(t.w2);
  built_ = true;
  built_version_ = store_->table_version();
  return absl::OkStatus();
}

absl::Status ExpertStoreWeights::BeginPass() {
  if (!built_ || built_version_ != store_->table_version()) VAMP_RETURN_IF_ERROR(Rebuild());
  std::vector<HostStagingEngine::Job> jobs;
  jobs.reserve(plan_.size());
  for (const StagingCopy& copy : plan_) {
    const ExpertStore::HostRange range = store_->OffloadedHostRange(copy.layer);
    if (range.bytes > store_->geometry().staging_buffer_bytes()) {
      return absl::InternalError(absl::StrCat("layer ", copy.layer, " offloads ", range.bytes,
                                              " B, more than a staging buffer holds"));
    }
    // The host backend's device addresses are host pointers.
    auto* buffer =
        reinterpret_cast<void*>(static_cast<uintptr_t>(store_->StagingBufferAddress(copy.buffer)));
    jobs.push_back({copy, buffer, range.data, range.bytes});
  }
  return engine_.BeginPass(std::move(jobs));
}

absl::StatusOr<ExpertLayerTable> ExpertStoreWeights::AcquireLayer(int layer) {
  if (layer < 0 || layer >= static_cast<int>(w13_.size()) || w13_[layer].empty()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts in the store"));
  }
  if (const int job = job_of_layer_[layer]; job >= 0) VAMP_RETURN_IF_ERROR(engine_.WaitCopied(job));
  return ExpertLayerTable{w13_[layer].data(), w2_[layer].data()};
}

absl::Status ExpertStoreWeights::ReleaseLayer(int layer) {
  if (layer < 0 || layer >= static_cast<int>(job_of_layer_.size())) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts in the store"));
  }
  if (const int job = job_of_layer_[layer]; job >= 0) return engine_.Release(job);
  return absl::OkStatus();
}

absl::Status ExpertStoreWeights::EndPass() { return engine_.EndPass(); }

}  // namespace vamp
