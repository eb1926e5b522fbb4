// Internal to kernels/cuda: the sm_80+ PTX building blocks the tensor-core kernels share
// (attention_mma.cuh, grouped_gemm.cu): asynchronous global -> shared copies, ldmatrix and
// mma.sync m16n8k16 with bfloat16 inputs and float32 accumulation. Fragment layouts are described
// where they are relied on (attention_mma.cuh, grouped_gemm.cu).
#ifndef VAMP_KERNELS_CUDA_MMA_CUH_
#define VAMP_KERNELS_CUDA_MMA_CUH_

#include <cstdint>

namespace vamp::kernels::cuda::internal {

// The shared-state-space address of a pointer into shared memory (what cp.async and ldmatrix
// take).
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// PTX ISA "Data Movement and Conversion Instructions: cp.async": copies 16 bytes global -> shared
// asynchronously (.cg: through L2 only); `src_bytes` < 16 reads that many and zero-fills the rest,
// so 0 writes a zero chunk without touching global memory (keys or rows past the end never bring
// garbage into the MMAs).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's most recent cp.async groups are in flight (groups
// complete in commit order). Other threads' copies need a barrier afterwards to become visible.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// PTX ISA "Warp-level matrix load instruction: ldmatrix": .x4 loads four 8x8 b16 matrices; lanes
// 8i..8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i, and register i of lane l
// receives elements (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1) of matrix i.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// As LdMatrixX4, each matrix transposed: register i of lane l receives (rows 2 (l % 4) and
// 2 (l % 4) + 1, column l / 4) of matrix i.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += A * B for one m16n8k16 tile (bf16 inputs, float32 accumulation).
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace vamp::kernels::cuda::internal

#endif  // VAMP_KERNELS_CUDA_MMA_CUH_
