#include "engine/runner/cuda/cuda_runner_support.h"

#include "engine/runner/model_runner.h"

namespace vamp {

absl::StatusOr<KvCacheView> CudaKvRegionView(const KvRegion& region, int num_decoder_layers) {
  return KvRegionView(region, num_decoder_layers, "cuda", "GPU");
}

}  // namespace vamp
