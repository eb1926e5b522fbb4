// The GPU engine's view of the ExpertStore (CUDA VMM backend): the loader writes expert shards into
// the store (ExpertWeightSink), and the forward pass reads them through per-layer pointer tables
// (ExpertWeights) whose entries are device addresses: the resident region below the residency
// boundary b, a device staging buffer above it.
//
// Staging (shared/DESIGN.md, "Staging") follows the backend-independent plan of staging_plan.h on a
// dedicated copy stream, ordered by events only (no host waits):
//   - BeginPass records an event on the compute stream that every copy of the pass waits for (the
//     previous pass's readers are done), then enqueues the copies whose buffer has no earlier
//     reader in the pass (with two buffers: the first two staged layers).
//   - AcquireLayer(l) makes the compute stream wait for layer l's copy (a no-op on the GPU once the
//     copy is done).
//   - ReleaseLayer(l) records "buffer free" on the compute stream after layer l's expert GEMMs and
//     only then enqueues the copy that reuses that buffer, which waits for that event. So while
//     layer l computes, layer l+1's copy (already enqueued) runs on the copy stream.
// Copies read the store's pinned host copies (OffloadedHostRange), so they run at full PCIe speed.
//
// Routed staging (routed_max_tokens > 0): a pass of at most that many tokens copies, per staged
// layer, only the offloaded experts the layer's tokens route to (kernels::cuda::CopyRoutedExperts,
// on the compute stream right after the layer's MoePermute, the SMs reading the pinned copy over
// PCIe). At batch 1 a layer of Qwen3-30B-A3B routes to 8 of 128 experts, so a VAMP-25 step copies
// a quarter of its offloaded bytes at most instead of all of them; the copy is not hidden behind
// the previous layer (the routing is not known before), which is why larger passes keep the
// whole-region copy on the copy stream. Experts nobody routes to keep stale bytes in the buffer;
// no GEMM row reads them, so outputs stay bit-identical.
//
// Exposed staging time (CudaStagingStats::exposed_us): what the compute stream spent on staging
// rather than compute, measured on the device with a pair of timing events per staged layer
// around the wait for its copy (whole region) or around its routed copy (which runs on the
// compute stream, so all of it is exposed). EndPass reads them back after the pass's work is done.
//
// Contract: the caller enqueues each layer's expert reads on `compute_stream` between AcquireLayer
// and ReleaseLayer, and calls these from one thread (the forward pass). The store's boundary
// changes only between passes, after a fence on the device (the page remapper's InFlightFence);
// tables are rebuilt when the store's table_version changes.
#ifndef VAMP_ENGINE_STAGING_CUDA_EXPERT_STORE_WEIGHTS_H_
#define VAMP_ENGINE_STAGING_CUDA_EXPERT_STORE_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/experts/expert_store.h"
#include "engine/memory/cuda_buffers.h"
#include "engine/model/causal_lm.h"
#include "engine/staging/staging_plan.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp {

struct CudaStagingStats {
  int64_t passes = 0;
  int64_t copies = 0;  // host->device copies enqueued (whole-region)
  uint64_t bytes = 0;  // bytes they move
  int64_t routed_passes = 0;  // passes that staged routed experts only
  int64_t routed_layers = 0;  // layer copies of those passes
  // Of `bytes`: those routed copies moved, and the offloaded bytes of the layers they served
  // (the whole region those layers would have copied); their ratio is the routed share.
  uint64_t routed_bytes = 0;
  uint64_t routed_region_bytes = 0;
  // µs the compute stream waited for whole-region copies or ran routed copies (see above).
  double exposed_us = 0;
};

class CudaExpertStoreWeights final : public ExpertWeightSink, public ExpertWeights {
 public:
  // `store` (on the "cuda" memory backend, shards of layout.dtype matching `layout`; the loader's
  // float32 shards are rounded to bfloat16 on the way in when layout.dtype is kBFloat16) must
  // outlive this object, and so must `compute_stream`, the stream the forward pass runs on.
  // Creates the copy stream and the events; copies go to the store's staging buffers.
  // routed_max_tokens: see "Routed staging" (0 = always the whole region).
  static absl::StatusOr<std::unique_ptr<CudaExpertStoreWeights>> Create(
      ExpertStore* store, ExpertShardLayout layout, cudaStream_t compute_stream,
      int64_t routed_max_tokens = 0);
  // Waits for the copy stream, then frees the events.
  ~CudaExpertStoreWeights() override;

  // ExpertWeightSink: writes [w13 | w2] of one expert into its region.
  absl::Status StoreExpertShard(int layer, int expert, absl::Span<const float> shard) override;

  // ExpertWeights (tables of device pointers; see the contract above).
  absl::Status BeginPass() override;
  absl::StatusOr<ExpertLayerTable> AcquireLayer(int layer) override;
  absl::Status ReleaseLayer(int layer) override;
  absl::Status EndPass() override;
  bool PassStagesExperts() const override { return !plan_.empty(); }
  void PlanPass(int64_t num_tokens) override { pass_tokens_ = num_tokens; }
  bool PassStagesRouted() const override { return routed_pass_; }
  absl::Status StageRouted(int layer, const int32_t* device_expert_offsets) override;
  void set_routed_max_tokens(int64_t tokens) { routed_max_tokens_ = tokens; }
  int64_t routed_max_tokens() const { return routed_max_tokens_; }

  // The decoder layers staged in the current (or last) pass, in order.
  const std::vector<int>& staged_layers() const { return staged_layers_; }
  const CudaStagingStats& stats() const { return stats_; }
  cudaStream_t copy_stream() const { return copy_stream_.get(); }

 private:
  CudaExpertStoreWeights(ExpertStore* store, ExpertShardLayout layout,
                         cudaStream_t compute_stream, int64_t routed_max_tokens);
  absl::Status Init();
  // Rebuilds pointer tables and the staging plan for the store's current boundary.
  absl::Status Rebuild();
  // Adds the exposed time of the pass's timed jobs to stats_ (the compute stream must be done
  // with them).
  absl::Status CollectExposedTime();
  // Enqueues plan_[job]'s copy on the copy stream (after its buffer's previous reader released it).
  absl::Status EnqueueCopy(int job);

  ExpertStore* const store_;
  const ExpertShardLayout layout_;
  const cudaStream_t compute_stream_;
  int64_t routed_max_tokens_;
  CudaStream copy_stream_;
  // Per plan job (at most one per eligible layer): copy done, and buffer released by its reader.
  std::vector<cudaEvent_t> copied_, released_;
  cudaEvent_t pass_start_ = nullptr;
  // Per plan job: timing events on the compute stream around its wait or routed copy, and
  // whether the current pass recorded them.
  std::vector<cudaEvent_t> stall_begin_, stall_end_;
  std::vector<bool> timed_;

  // Below: touched only by the thread running the forward pass.
  bool built_ = false;
  uint64_t built_version_ = 0;
  std::vector<int> staged_layers_;
  std::vector<StagingCopy> plan_;
  std::vector<int> job_of_layer_;              // by decoder layer: index into plan_, or -1
  std::vector<std::vector<const void*>> w13_;  // by decoder layer (empty for non-MoE layers)
  std::vector<std::vector<const void*>> w2_;
  std::vector<bool> enqueued_;  // per job, in the current pass
  int64_t pass_tokens_ = -1;     // PlanPass's count for the next pass (-1: not told)
  bool routed_pass_ = false;     // the current pass stages routed experts
  // Per plan job: device address of its layer's pinned offloaded range; routable_ when every
  // job has one (routed passes need them all).
  std::vector<const uint8_t*> device_src_;
  bool routable_ = false;
  // Routed bytes copied, counted on the device (one int64), and its host mirror.
  DeviceBuffer routed_bytes_;
  // Device copy of the tables: layer l's w13 then w2 pointers start at element
  // device_table_index_[l] of device_tables_ (-1 for non-MoE layers).
  DeviceBuffer device_tables_;
  std::vector<int64_t> device_table_index_;
  std::vector<kernels::BFloat16> convert_;  // one expert's shard in bfloat16 (loading only)
  CudaStagingStats stats_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_STAGING_CUDA_EXPERT_STORE_WEIGHTS_H_
