#include "kernels/cuda/copy.h"
#include "kernels/cuda/launch.h"

namespace vamp::kernels::cuda {
namespace {

constexpr int kGatherThreads = 256;

// One block per destination row. Strides in elements need not keep 16-byte alignment, so the copy
// is by single floats (still coalesced across the block).
__global__ void GatherRowsKernel(const float* src, int64_t src_stride, const int32_t* row_index,
                                 int64_t cols, float* dst, int64_t dst_stride) {
  const int64_t r = blockIdx.x;
  const float* s = src + static_cast<int64_t>(row_index[r]) * src_stride;
  float* d = dst + r * dst_stride;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = s[j];
}

}  // namespace

absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* row_index,
                        int64_t num_rows, int64_t cols, float* dst, int64_t dst_stride,
                        cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  GatherRowsKernel<<<num_rows, kGatherThreads, 0, stream>>>(src, src_stride, row_index, cols, dst,
                                                            dst_stride);
  return internal::LaunchStatus("GatherRowsKernel");
}

}  // namespace vamp::kernels::cuda
