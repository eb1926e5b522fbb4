#include "engine/rank/cuda_device.h"

#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_backend.h"

namespace vamp {
namespace {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(CudaDeviceOptions options) : options_(std::move(options)) {}

  std::string name() const override { return absl::StrCat("cuda:", options_.ordinal); }
  bool is_cuda() const override { return true; }

  absl::Status Activate(bool synchronize) override {
    cudaError_t err = cudaSetDevice(options_.ordinal);
    if (err == cudaSuccess && synchronize) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat(name(), ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateMemoryBackend() override {
    return CreateCudaMemoryBackend(options_.ordinal);
  }

  // Remaps run between steps, and a step returns with its stream idle; the fence still waits for
  // the whole device (staging copies run on their own stream) before a page is unmapped.
  std::unique_ptr<InFlightFence> CreateFence() override {
    return CreateCudaStreamFence(options_.ordinal, {});
  }

  absl::StatusOr<KvCacheView> KvView(const KvRegion& region, int num_decoder_layers) override {
    return CudaKvRegionView(region, num_decoder_layers);
  }

  absl::StatusOr<std::unique_ptr<RankExperts>> CreateExperts(
      ExpertStore* store, const ExpertShardLayout& layout) override {
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    if (!stream.ok()) {
      return absl::Status(stream.status().code(),
                          absl::StrCat("CUDA stream: ", stream.status().message()));
    }
    VAMP_ASSIGN_OR_RETURN(
        std::unique_ptr<CudaExpertStoreWeights> weights,
        CudaExpertStoreWeights::Create(store, layout, stream->get(),
                                       options_.forward.routed_staging_max_tokens));
    return std::unique_ptr<RankExperts>(
        std::make_unique<CudaRankExperts>(*std::move(stream), std::move(weights)));
  }

  absl::StatusOr<DeviceModel> CreateModel(CausalLm* host_model, const RunnerConfig& runner,
                                          DType dtype, DeviceAllReduce* all_reduce,
                                          RankExperts& experts) override {
    CudaForwardOptions forward = options_.forward;
    forward.dtype = dtype;
    forward.all_reduce = all_reduce;
    VAMP_ASSIGN_OR_RETURN(
        std::unique_ptr<CudaQwen3MoeModel> model,
        CudaQwen3MoeModel::Create(host_model, runner,
                                  static_cast<CudaRankExperts&>(experts).stream(), forward));
    DeviceModel out;
    // What the non-expert weights occupy on the device (matrices in the engine's dtype).
    out.weight_bytes = model->weight_bytes();
    out.model = std::move(model);
    return out;
  }

 private:
  const CudaDeviceOptions options_;
};

}  // namespace

StagingStats CudaRankExperts::stats() const {
  const CudaStagingStats& c = weights_->stats();
  StagingStats s;
  s.passes = c.passes;
  s.copies = c.copies + c.routed_layers;
  s.bytes = c.bytes;
  s.wait_us = c.exposed_us;
  s.routed_passes = c.routed_passes;
  s.routed_bytes = c.routed_bytes;
  s.routed_region_bytes = c.routed_region_bytes;
  return s;
}

std::unique_ptr<Device> CreateCudaDevice(CudaDeviceOptions options) {
  return std::make_unique<CudaDevice>(std::move(options));
}

}  // namespace vamp
