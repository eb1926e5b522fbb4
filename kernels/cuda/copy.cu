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

// Routed expert staging: blockIdx.y picks the offloaded expert, blockIdx.x a chunk of it. Blocks
// of experts nobody routes to return at once; the others stream their chunk as 16-byte words,
// several loads in flight per thread, which keeps enough PCIe reads outstanding to approach the
// link's bandwidth when src is pinned host memory.
constexpr int kRoutedCopyThreads = 256;
constexpr int64_t kRoutedCopyChunkWords = 16384;  // 256 KiB per block

__global__ void CopyRoutedExpertsKernel(const int32_t* expert_offsets, int64_t first_expert,
                                        const uint4* src, uint4* dst, int64_t expert_words,
                                        unsigned long long* copied_bytes) {
  const int64_t e = first_expert + blockIdx.y;
  if (expert_offsets[e + 1] <= expert_offsets[e]) return;
  if (copied_bytes != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    atomicAdd(copied_bytes, static_cast<unsigned long long>(expert_words * sizeof(uint4)));
  }
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * expert_words +
                        static_cast<int64_t>(blockIdx.x) * kRoutedCopyChunkWords;
  const int64_t end =
      min(begin + kRoutedCopyChunkWords, static_cast<int64_t>(blockIdx.y + 1) * expert_words);
  constexpr int kUnroll = 4;
  for (int64_t i = begin + threadIdx.x; i < end; i += kUnroll * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * blockDim.x;
      if (j < end) v[u] = src[j];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * blockDim.x;
      if (j < end) dst[j] = v[u];
    }
  }
}

}  // namespace

absl::Status CopyRoutedExperts(const int32_t* expert_offsets, int64_t first_expert,
                               int64_t num_experts, const uint8_t* src, uint8_t* dst,
                               int64_t expert_bytes, uint64_t* copied_bytes, cudaStream_t stream) {
  static_assert(sizeof(uint64_t) == sizeof(unsigned long long));
  if (first_expert < 0 || expert_bytes <= 0 || expert_bytes % sizeof(uint4) != 0 ||
      !internal::Aligned16(src) || !internal::Aligned16(dst)) {
    return absl::InvalidArgumentError(
        "CopyRoutedExperts: needs first_expert >= 0, expert_bytes a positive multiple of 16 and "
        "16-byte aligned src and dst");
  }
  if (first_expert >= num_experts) return absl::OkStatus();
  if (num_experts - first_expert > 65535) {
    return absl::InvalidArgumentError(
        "CopyRoutedExperts: more than 65535 offloaded experts (one grid row each)");
  }
  const int64_t words = expert_bytes / static_cast<int64_t>(sizeof(uint4));
  const dim3 grid(static_cast<unsigned>(internal::CeilDiv(words, kRoutedCopyChunkWords)),
                  static_cast<unsigned>(num_experts - first_expert));
  CopyRoutedExpertsKernel<<<grid, kRoutedCopyThreads, 0, stream>>>(
      expert_offsets, first_expert, reinterpret_cast<const uint4*>(src),
      reinterpret_cast<uint4*>(dst), words, reinterpret_cast<unsigned long long*>(copied_bytes));
  return internal::LaunchStatus("CopyRoutedExpertsKernel");
}

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
