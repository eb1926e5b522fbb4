#include "engine/staging/cuda_expert_store_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "engine/staging/expert_pointer_tables.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/copy.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<CudaExpertStoreWeights>> CudaExpertStoreWeights::Create(
    ExpertStore* store, ExpertShardLayout layout, cudaStream_t compute_stream,
    int64_t routed_max_tokens) {
  if (store == nullptr) return absl::InvalidArgumentError("CudaExpertStoreWeights needs a store");
  const ExpertGeometry& g = store->geometry();
  if (store->backend()->name() != "cuda") {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU engine reads experts through device pointers; the expert store uses "
                     "the '",
                     store->backend()->name(), "' memory backend"));
  }
  if (g.w13_bytes != static_cast<uint64_t>(layout.W13Bytes()) ||
      g.w13_bytes + g.w2_bytes != static_cast<uint64_t>(layout.Bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert store geometry (w13 ", g.w13_bytes, " B, w2 ", g.w2_bytes,
                     " B) does not match ", DTypeName(layout.dtype), " shards of hidden ",
                     layout.hidden, " and intermediate ", layout.inter));
  }
  std::unique_ptr<CudaExpertStoreWeights> w(
      new CudaExpertStoreWeights(store, layout, compute_stream, routed_max_tokens));
  VAMP_RETURN_IF_ERROR(w->Init());
  return w;
}

CudaExpertStoreWeights::CudaExpertStoreWeights(ExpertStore* store, ExpertShardLayout layout,
                                               cudaStream_t compute_stream,
                                               int64_t routed_max_tokens)
    : store_(store),
      layout_(layout),
      compute_stream_(compute_stream),
      routed_max_tokens_(routed_max_tokens) {}

absl::Status CudaExpertStoreWeights::Init() {
  VAMP_ASSIGN_OR_RETURN(copy_stream_, CudaStream::Create());
  const ExpertGeometry& g = store_->geometry();
  const size_t jobs = g.eligible_layers.size();
  copied_.assign(jobs, nullptr);
  released_.assign(jobs, nullptr);
  stall_begin_.assign(jobs, nullptr);
  stall_end_.assign(jobs, nullptr);
  timed_.assign(jobs, false);
  for (size_t i = 0; i < jobs; ++i) {
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreateWithFlags(&released_[i], cudaEventDisableTiming));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&stall_begin_[i]));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&stall_end_[i]));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreateWithFlags(&pass_start_, cudaEventDisableTiming));
  VAMP_ASSIGN_OR_RETURN(routed_bytes_, DeviceBuffer::Allocate(sizeof(uint64_t)));
  VAMP_CUDART_RETURN_IF_ERROR(cudaMemset(routed_bytes_.data(), 0, sizeof(uint64_t)));
  return absl::OkStatus();
}

CudaExpertStoreWeights::~CudaExpertStoreWeights() {
  if (copy_stream_.get() != nullptr) cudaStreamSynchronize(copy_stream_.get());
  for (cudaEvent_t e : copied_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : released_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (const std::vector<cudaEvent_t>* events : {&stall_begin_, &stall_end_}) {
    for (cudaEvent_t e : *events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  if (pass_start_ != nullptr) cudaEventDestroy(pass_start_);
}

absl::Status CudaExpertStoreWeights::StoreExpertShard(int layer, int expert,
                                                      absl::Span<const float> shard) {
  if (static_cast<int64_t>(shard.size()) != layout_.Elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert shard of ", shard.size(), " elements, expected ", layout_.Elements()));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(shard.data());
  if (layout_.dtype == DType::kBFloat16) {
    // Round once on the host; the loader hands over one expert at a time, so this buffer is one
    // expert's shard (a few MiB), reused across calls.
    convert_.resize(shard.size());
    kernels::ToBFloat16(shard, convert_.data());
    bytes = reinterpret_cast<const uint8_t*>(convert_.data());
  }
  const uint64_t w13 = layout_.W13Bytes();
  const uint64_t w2 = layout_.Bytes() - w13;
  return store_->WriteExpert(layer, expert, absl::MakeConstSpan(bytes, w13),
                             absl::MakeConstSpan(bytes + w13, w2));
}

absl::Status CudaExpertStoreWeights::Rebuild() {
  // The store writes weights (loading, Restore) with synchronous cudaMemcpy on the legacy default
  // stream, whose DMA from pageable memory may still be in flight when the call returns and which
  // does not order our non-blocking streams: wait for the whole device once per table change.
  VAMP_CUDART_RETURN_IF_ERROR(cudaDeviceSynchronize());
  VAMP_ASSIGN_OR_RETURN(ExpertPointerTables t, BuildExpertPointerTables(*store_));
  if (t.plan.size() > copied_.size()) {
    return absl::InternalError(absl::StrCat(t.plan.size(), " staged layers but only ",
                                            copied_.size(), " eligible layers"));
  }
  staged_layers_ = std::move(t.staged_layers);
  plan_ = std::move(t.plan);
  job_of_layer_ = std::move(t.job_of_layer);
  w13_ = std::move(t.w13);
  w2_ = std::move(t.w2);
  // The same tables on the device, every MoE layer's [w13 | w2] rows of num_experts pointers, for
  // kernels that read the table there (no host round trip per layer). Nothing reads the old
  // tables now: the device was synchronised above.
  std::vector<const void*> flat;
  device_table_index_.assign(w13_.size(), -1);
  for (size_t layer = 0; layer < w13_.size(); ++layer) {
    if (w13_[layer].empty()) continue;
    device_table_index_[layer] = static_cast<int64_t>(flat.size());
    flat.insert(flat.end(), w13_[layer].begin(), w13_[layer].end());
    flat.insert(flat.end(), w2_[layer].begin(), w2_[layer].end());
  }
  // Routed staging reads the pinned copies from kernels: their device addresses (the same as the
  // host ones under unified addressing, but asked for, not assumed). A copy that cannot be
  // mapped leaves the layer to whole-region staging.
  device_src_.assign(plan_.size(), nullptr);
  routable_ = true;
  for (size_t job = 0; job < plan_.size(); ++job) {
    const ExpertStore::HostRange range = store_->OffloadedHostRange(plan_[job].layer);
    void* device = nullptr;
    if (range.bytes > 0 &&
        cudaHostGetDevicePointer(&device, const_cast<uint8_t*>(range.data), 0) == cudaSuccess) {
      device_src_[job] = static_cast<const uint8_t*>(device);
    } else {
      cudaGetLastError();  // clear the error of a range that cannot be mapped
      routable_ = false;
    }
  }
  const uint64_t table_bytes = flat.size() * sizeof(void*);
  if (device_tables_.bytes() < table_bytes) {
    VAMP_ASSIGN_OR_RETURN(device_tables_, DeviceBuffer::Allocate(table_bytes));
  }
  if (table_bytes > 0) {
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemcpy(device_tables_.data(), flat.data(), table_bytes, cudaMemcpyHostToDevice));
  }
  built_ = true;
  built_version_ = store_->table_version();
  return absl::OkStatus();
}

absl::Status CudaExpertStoreWeights::EnqueueCopy(int job) {
  const StagingCopy& copy = plan_[job];
  const ExpertStore::HostRange range = store_->OffloadedHostRange(copy.layer);
  if (range.bytes > store_->geometry().staging_buffer_bytes()) {
    return absl::InternalError(absl::StrCat("layer ", copy.layer, " offloads ", range.bytes,
                                            " B, more than a staging buffer holds"));
  }
  cudaStream_t s = copy_stream_.get();
  if (copy.after_release_of >= 0) {
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamWaitEvent(s, released_[copy.after_release_of], 0));
  }
  void* buffer =
      reinterpret_cast<void*>(static_cast<uintptr_t>(store_->StagingBufferAddress(copy.buffer)));
  VAMP_CUDART_RETURN_IF_ERROR(
      cudaMemcpyAsync(buffer, range.data, range.bytes, cudaMemcpyHostToDevice, s));
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(copied_[job], s));
  enqueued_[job] = true;
  ++stats_.copies;
  stats_.bytes += range.bytes;
  return absl::OkStatus();
}

absl::Status CudaExpertStoreWeights::BeginPass() {
  if (!built_ || built_version_ != store_->table_version()) VAMP_RETURN_IF_ERROR(Rebuild());
  ++stats_.passes;
  enqueued_.assign(plan_.size(), false);
  timed_.assign(plan_.size(), false);
  const int64_t tokens = pass_tokens_;
  pass_tokens_ = -1;
  routed_pass_ = !plan_.empty() && routable_ && routed_max_tokens_ > 0 && tokens >= 0 &&
                 tokens <= routed_max_tokens_;
  if (plan_.empty()) return absl::OkStatus();
  if (routed_pass_) {
    // The copies run on the compute stream itself (StageRouted), after the previous pass's reads
    // of the staging buffers; only a whole-region copy still running on the copy stream (one a
    // stopped pass never waited for) could write them meanwhile, so wait for those first.
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(pass_start_, copy_stream_.get()));
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, pass_start_, 0));
    ++stats_.routed_passes;
    return absl::OkStatus();
  }
  // Every copy of this pass comes after everything already on the compute stream (in particular
  // the previous pass's reads of the staging buffers).
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(pass_start_, compute_stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_.get(), pass_start_, 0));
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (plan_[i].after_release_of < 0) VAMP_RETURN_IF_ERROR(EnqueueCopy(static_cast<int>(i)));
  }
  return absl::OkStatus();
}

absl::Status CudaExpertStoreWeights::StageRouted(int layer, const int32_t* device_expert_offsets) {
  if (!routed_pass_) {
    return absl::FailedPreconditionError("StageRouted outside a routed staging pass");
  }
  if (layer < 0 || layer >= static_cast<int>(job_of_layer_.size())) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts in the store"));
  }
  const int job = job_of_layer_[layer];
  if (job < 0) return absl::OkStatus();  // fully resident layer
  const ExpertStore::HostRange range = store_->OffloadedHostRange(layer);
  auto* buffer = reinterpret_cast<uint8_t*>(
      static_cast<uintptr_t>(store_->StagingBufferAddress(plan_[job].buffer)));
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stall_begin_[job], compute_stream_));
  VAMP_RETURN_IF_ERROR(kernels::cuda::CopyRoutedExperts(
      device_expert_offsets, range.first_expert, range.first_expert + range.num_experts,
      device_src_[job], buffer, static_cast<int64_t>(store_->geometry().expert_bytes),
      reinterpret_cast<uint64_t*>(routed_bytes_.data()), compute_stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stall_end_[job], compute_stream_));
  enqueued_[job] = true;
  timed_[job] = true;
  ++stats_.routed_layers;
  stats_.routed_region_bytes += range.bytes;
  return absl::OkStatus();
}

absl::StatusOr<ExpertLayerTable> CudaExpertStoreWeights::AcquireLayer(int layer) {
  if (layer < 0 || layer >= static_cast<int>(w13_.size()) || w13_[layer].empty()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts in the store"));
  }
  if (const int job = job_of_layer_[layer]; job >= 0 && routed_pass_) {
    if (!enqueued_[job]) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " was acquired before StageRouted in a routed pass"));
    }
  } else if (job >= 0) {
    if (!enqueued_[job]) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, "'s staging copy was not enqueued: layers out of order"));
    }
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stall_begin_[job], compute_stream_));
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, copied_[job], 0));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stall_end_[job], compute_stream_));
    timed_[job] = true;
  }
  const auto* device =
      reinterpret_cast<const void* const*>(device_tables_.data()) + device_table_index_[layer];
  return ExpertLayerTable{w13_[layer].data(), w2_[layer].data(), device,
                          device + w13_[layer].size()};
}

absl::Status CudaExpertStoreWeights::ReleaseLayer(int layer) {
  if (layer < 0 || layer >= static_cast<int>(job_of_layer_.size())) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " has no experts in the store"));
  }
  const int job = job_of_layer_[layer];
  if (job < 0 || routed_pass_) return absl::OkStatus();
  VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(released_[job], compute_stream_));
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (plan_[i].after_release_of == job && !enqueued_[i]) {
      VAMP_RETURN_IF_ERROR(EnqueueCopy(static_cast<int>(i)));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaExpertStoreWeights::CollectExposedTime() {
  double exposed_ms = 0;
  for (size_t job = 0; job < timed_.size(); ++job) {
    if (!timed_[job]) continue;
    float ms = 0;
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, stall_begin_[job], stall_end_[job]));
    exposed_ms += ms;
  }
  timed_.assign(timed_.size(), false);
  stats_.exposed_us += 1e3 * exposed_ms;
  return absl::OkStatus();
}

absl::Status CudaExpertStoreWeights::EndPass() {
  // Copies not enqueued (a pass that stopped early) never run, and the next pass orders its
  // copies after this pass's compute through pass_start_. The forward pass synchronises the
  // compute stream right after this call (its outputs are read already), so waiting for it here
  // costs nothing: then the timing events and a routed pass's byte count (8 bytes) are read back
  // for the staging statistics.
  const bool routed_pass = routed_pass_;
  routed_pass_ = false;
  if (plan_.empty()) return absl::OkStatus();
  uint64_t routed = 0;
  if (routed_pass) {
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(&routed, routed_bytes_.data(), sizeof(routed),
                                                cudaMemcpyDeviceToHost, compute_stream_));
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemsetAsync(routed_bytes_.data(), 0, sizeof(uint64_t), compute_stream_));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_));
  if (routed_pass) {
    stats_.bytes += routed;
    stats_.routed_bytes += routed;
  }
  return CollectExposedTime();
}

}  // namespace vamp
