// The CUDA Device (device.h), CUDA builds only: the CUDA VMM memory backend on one GPU, a fence
// that waits for the whole device, expert weights served and staged by CudaExpertStoreWeights on
// their own stream, and CudaQwen3MoeModel over the loaded model on that stream.
#ifndef VAMP_ENGINE_RANK_CUDA_DEVICE_H_
#define VAMP_ENGINE_RANK_CUDA_DEVICE_H_

#include <memory>
#include <utility>

#include "engine/rank/device.h"
#include "engine/runner/cuda/cuda_qwen3_moe.h"
#include "engine/runner/cuda/cuda_runner_support.h"
#include "engine/staging/cuda_expert_store_weights.h"

namespace vamp {

struct CudaDeviceOptions {
  int ordinal = 0;
  // The device model's options; its dtype and all_reduce are the rank's (RankSpec), not these.
  CudaForwardOptions forward;
};

std::unique_ptr<Device> CreateCudaDevice(CudaDeviceOptions options);

// The CUDA device's RankExperts: the forward pass's stream (created with them, destroyed after
// them) and the expert weights on it.
class CudaRankExperts final : public RankExperts {
 public:
  CudaRankExperts(CudaStream stream, std::unique_ptr<CudaExpertStoreWeights> weights)
      : stream_(std::move(stream)), weights_(std::move(weights)) {}
  ExpertWeightSink& sink() override { return *weights_; }
  ExpertWeights& weights() override { return *weights_; }
  // wait_us is the compute stream's exposed staging time (CudaStagingStats::exposed_us).
  StagingStats stats() const override;
  int64_t routed_staging_max_tokens() const override { return weights_->routed_max_tokens(); }
  CudaExpertStoreWeights& store_weights() { return *weights_; }
  cudaStream_t stream() const { return stream_.get(); }

 private:
  CudaStream stream_;
  std::unique_ptr<CudaExpertStoreWeights> weights_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RANK_CUDA_DEVICE_H_
