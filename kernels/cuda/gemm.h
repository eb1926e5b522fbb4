// Dense and per-expert matrix multiplication through cuBLAS, CUDA twins of kernels/cpu/gemm.h and
// cpu::ExpertGemm (same arguments plus a stream).
//
// float32: cuBLAS runs in pedantic float32 mode (no TF32, no reduced-precision shortcuts), so
// results agree with the CPU twins to float32 rounding of a differently ordered sum.
// bfloat16: cublasGemmEx / cublasGemmGroupedBatchedEx with bf16 inputs, CUBLAS_COMPUTE_32F
// (tensor cores: products of bf16 are exact in float32, sums accumulate in float32) and bf16 or
// float32 output. These calls run in CUBLAS_DEFAULT_MATH (pedantic math would keep the tensor
// cores out) plus CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, so split-k partial sums are
// combined in float32, never in the bf16 output type: like the CPU twins, float accumulation and
// one rounding. Results agree with the CPU twins to float32 rounding of a differently ordered sum,
// then within one bf16 ulp for bf16 outputs.
//
// Each thread uses its own cuBLAS handle per device, created on first use; every call binds it to
// `stream` and sets the math mode of its precision (a host-side setting of the handle: one handle
// and one workspace serve both precisions). Row strides must be at least the row length
// (lda, ldw >= k; ldc >= n), as cuBLAS requires.
#ifndef VAMP_KERNELS_CUDA_GEMM_H_
#define VAMP_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

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

// bfloat16 a and w (device pointers), float32 accumulation; c in bfloat16 (projections) or
// float32 (router logits, LM-head logits).
absl::Status Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, BFloat16* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
absl::Status Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, float* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// As the float32 ExpertGemm, in bfloat16 (expert_weights and expert_offsets are HOST arrays; one
// cublasGemmEx per expert with rows).
absl::Status ExpertGemm(const BFloat16* a, int64_t lda, const BFloat16* const* expert_weights,
                        int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                        int64_t num_experts, BFloat16* c, int64_t ldc, int64_t n, int64_t k,
                        cudaStream_t stream);

// Same arguments and results as the bf16 ExpertGemm, in ONE cuBLAS call for all experts with rows
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5 or later; Unimplemented when built against an older
// one). Experts with equal row counts share a group (in decode most experts have one or two rows),
// so the grouped call sees few distinct shapes. cuBLAS reads the per-problem matrix pointers from
// DEVICE memory: this thread keeps, per device, a small ring of pinned host + device pointer
// arrays; a call fills the next slot, copies it on `stream`, and records an event after the GEMM.
// A slot is refilled only after the host has waited for that event (recorded four calls earlier,
// so the wait is normally already satisfied), which keeps the arrays intact for any stream without
// ordering the streams against each other.
absl::Status ExpertGemmGrouped(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               BFloat16* c, int64_t ldc, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_GEMM_H_
