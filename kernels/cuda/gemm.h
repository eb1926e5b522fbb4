// Dense and per-expert matrix multiplication through cuBLAS, CUDA twins of kernels/cpu/gemm.h and
// cpu::ExpertGemm (float32, same arguments plus a stream).
//
// cuBLAS runs in pedantic float32 mode (no TF32, no reduced-precision shortcuts), so results
// agree with the CPU twins to float32 rounding of a differently ordered sum. Each thread uses its
// own cuBLAS handle per device, created on first use; the handle is bound to `stream` per call.
// Row strides must be at least the row length (lda, ldw >= k; ldc >= n), as cuBLAS requires.
#ifndef VAMP_KERNELS_CUDA_GEMM_H_
#define VAMP_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace vamp::kernels::cuda {

// c[i, j] = sum_p a[i, p] * w[j, p]: a [m, k], w [n, k], c [m, n], all device pointers.
absl::Status Gemm(const float* a, int64_t lda, const float* w, int64_t ldw, float* c, int64_t ldc,
                  int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// As cpu::ExpertGemm: for every expert e with rows, c[rows of e] = a[rows of e] x W_e^T with
// W_e = expert_weights[e] + weight_offset ([n, k], row stride ldw). `a` and `c` are device
// pointers; `expert_weights` is a HOST array of device pointers (the per-layer pointer table) and
// `expert_offsets` a HOST array of num_experts + 1 row offsets (cuBLAS takes its sizes on the
// host; the GPU runner copies MoePermute's offsets back). One cuBLAS call per expert with rows.
absl::Status ExpertGemm(const float* a, int64_t lda, const float* const* expert_weights,
                        int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                        int64_t num_experts, float* c, int64_t ldc, int64_t n, int64_t k,
                        cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_GEMM_H_
