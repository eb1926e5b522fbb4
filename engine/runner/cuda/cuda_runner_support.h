// The KvCacheView of a KvRegion on the CUDA VMM backend (CUDA builds only); the owned stream and
// device / pinned allocations the GPU path shares are in engine/memory/cuda_buffers.h.
#ifndef VAMP_ENGINE_RUNNER_CUDA_CUDA_RUNNER_SUPPORT_H_
#define VAMP_ENGINE_RUNNER_CUDA_CUDA_RUNNER_SUPPORT_H_

#include "absl/status/statusor.h"
#include "engine/kv/kv_region.h"
#include "engine/memory/cuda_buffers.h"
#include "engine/model/causal_lm.h"

namespace vamp {

// The KvCacheView of a KvRegion on the CUDA memory backend: its k/v pointers are device addresses
// (for CudaQwen3MoeModel; ModelRunner only reads block_size and num_blocks), covering the
// currently mapped blocks. FailedPrecondition for another backend or a non-float32 geometry.
// Call again (and ModelRunner::SetKvCache) after every remap.
absl::StatusOr<KvCacheView> CudaKvRegionView(const KvRegion& region, int num_decoder_layers);

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_CUDA_RUNNER_SUPPORT_H_
