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

// Twin of cpu::CopyRoutedExperts (expert_offsets and dst on the device; src device-accessible:
// pinned host memory, read over PCIe by the SMs, or device memory). Enqueued on `stream` after the
// layer's MoePermute, so the routing it reads is the step's own and no host round trip is needed
// (the copy stream cannot know which experts a layer will use before its router has run). A
// bit-exact copy; `copied_bytes` (a device counter, or null) grows by the bytes copied. Refuses
// (InvalidArgument) a negative first_expert, more than 65535 experts from it, expert_bytes that
// is not a positive multiple of 16, or pointers that are not 16-byte aligned.
absl::Status CopyRoutedExperts(const int32_t* expert_offsets, int64_t first_expert,
                               int64_t num_experts, const uint8_t* src, uint8_t* dst,
                               int64_t expert_bytes, uint64_t* copied_bytes,
                               cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_COPY_H_
