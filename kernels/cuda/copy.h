// Data movement, CUDA twin of kernels/cpu/copy.h (device pointers, same arguments plus a stream).
#ifndef VAMP_KERNELS_CUDA_COPY_H_
#define VAMP_KERNELS_CUDA_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// dst[r, :] = src[row_index[r], :] for r < num_rows, `cols` elements per row (embedding lookup,
// MoE gather). Bit-exact copy, for float32 and bfloat16 rows.
absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* row_index,
                        int64_t num_rows, int64_t cols, float* dst, int64_t dst_stride,
                        cudaStream_t stream);
absl::Status GatherRows(const BFloat16* src, int64_t src_stride, const int32_t* row_index,
                        int64_t num_rows, int64_t cols, BFloat16* dst, int64_t dst_stride,
                        cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_COPY_H_
