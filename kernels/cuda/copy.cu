#include "kernels/cuda/copy.h"
#include "kernels/cuda/launch.h"

namespace vamp::kernels::cuda {
namespace {

constexpr int kGatherThreads = 256;

// One block per destination row. Strides in elements need not keep 16-byte alignment, so the copy
// is element by element (still coalesced across the block). T is float, or uint16_t / uint4 (8
// elements) for bfloat16: copying raw bits keeps the copy exact whatever the values (NaN payloads
// included).
template <typename T>
__global__ void GatherRowsKernel(const T* src, int64_t src_stride, const int32_t* row_index,
                                 int64_t cols, T* dst, int64_t dst_stride) {
  const int64_t r = blockIdx.x;
  const T* s = src + static_cast<int64_t>(row_index[r]) * src_stride;
  T* d = dst + r * dst_stride;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = s[j];
}

template <typename T>
absl::Status LaunchGatherRows(const T* src, int64_t src_stride, const int32_t* row_index,
                              int64_t num_rows, int64_t cols, T* dst, int64_t dst_stride,
                              cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  GatherRowsKernel<T>
      <<<num_rows, kGatherThreads, 0, stream>>>(src, src_stride, row_index, cols, dst, dst_stride);
  return internal::LaunchStatus("GatherRowsKernel");
}

}  // namespace

absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* row_index,
                        int64_t num_rows, int64_t cols, float* dst, int64_t dst_stride,
                        cudaStream_t stream) {
  return LaunchGatherRows(src, src_stride, row_index, num_rows, cols, dst, dst_stride, stream);
}

absl::Status GatherRows(const BFloat16* src, int64_t src_stride, const int32_t* row_index,
                        int64_t num_rows, int64_t cols, BFloat16* dst, int64_t dst_stride,
                        cudaStream_t stream) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  // Rows that start on 16-byte boundaries (the common case: cudaMalloc'd buffers, hidden sizes a
  // multiple of 8) move as 16-byte words, 8 elements each; the bits are the same either way.
  constexpr int64_t kPerWord = sizeof(uint4) / sizeof(BFloat16);
  const bool aligned = reinterpret_cast<uintptr_t>(src) % sizeof(uint4) == 0 &&
                       reinterpret_cast<uintptr_t>(dst) % sizeof(uint4) == 0 &&
                       src_stride % kPerWord == 0 && dst_stride % kPerWord == 0 &&
                       cols % kPerWord == 0;
  if (aligned) {
    return LaunchGatherRows(reinterpret_cast<const uint4*>(src), src_stride / kPerWord, row_index,
                            num_rows, cols / kPerWord, reinterpret_cast<uint4*>(dst),
                            dst_stride / kPerWord, stream);
  }
  return LaunchGatherRows(reinterpret_cast<const uint16_t*>(src), src_stride, row_index, num_rows,
                          cols, reinterpret_cast<uint16_t*>(dst), dst_stride, stream);
}

}  // namespace vamp::kernels::cuda
