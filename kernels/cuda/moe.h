// Mixture-of-Experts kernels, CUDA twins of kernels/cpu/moe.h (device pointers, same arguments
// plus a stream). The expert GEMMs are in kernels/cuda/gemm.h (cuBLAS).
//
// Agreement with the CPU twins: topk_ids, expert_offsets, row_token and pair_row are identical
// (integer outputs; the selection compares the same float32 logits); weights and activations agree
// to float32 rounding (reductions run in a different order, and nvcc may fuse multiply-adds), so
// bfloat16 activations agree within one bf16 ulp.
#ifndef VAMP_KERNELS_CUDA_MOE_H_
#define VAMP_KERNELS_CUDA_MOE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// As cpu::RouterTopK: softmax over each row, the top_k largest in descending order (ties: lower
// expert id first), renormalised when `renormalize`. 0 <= top_k <= num_experts.
absl::Status RouterTopK(const float* router_logits, int64_t logits_stride, int64_t num_tokens,
                        int64_t num_experts, int64_t top_k, bool renormalize, int32_t* topk_ids,
                        float* topk_weights, cudaStream_t stream);

// As cpu::MoePermute: stable counting sort of the (token, choice) pairs by expert. Ids outside
// [0, num_experts) cannot be reported from the device (the CPU twin aborts): such pairs get
// pair_row -1 and no row, and expert_offsets[num_experts] counts only the valid pairs.
// One thread block per expert, each placing its own expert's pairs in pair order (moe.cu), so a
// prefill chunk's tens of thousands of pairs are sorted across the GPU; no host synchronisation.
absl::Status MoePermute(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts, int32_t* expert_offsets, int32_t* row_token,
                        int32_t* pair_row, cudaStream_t stream);

// out[r, j] = silu(x[r, j]) * x[r, inter + j] for j < inter.
absl::Status SiluAndMul(const float* x, int64_t x_stride, int64_t num_rows, int64_t inter,
                        float* out, int64_t out_stride, cudaStream_t stream);

// out[t, :] = sum_{j < top_k} topk_weights[t*top_k + j] * expert_out[pair_row[t*top_k + j], :],
// accumulated in choice order.
absl::Status MoeUnpermute(const float* expert_out, int64_t expert_out_stride,
                          const int32_t* pair_row, const float* topk_weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, float* out, int64_t out_stride,
                          cudaStream_t stream);

// bfloat16 activations (float32 arithmetic, one rounding per output), as the bf16 CPU twins.
absl::Status SiluAndMul(const BFloat16* x, int64_t x_stride, int64_t num_rows, int64_t inter,
                        BFloat16* out, int64_t out_stride, cudaStream_t stream);
absl::Status MoeUnpermute(const BFloat16* expert_out, int64_t expert_out_stride,
                          const int32_t* pair_row, const float* topk_weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, BFloat16* out, int64_t out_stride,
                          cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_MOE_H_
