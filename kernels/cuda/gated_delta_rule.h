// The gated delta rule, CUDA twin of kernels/cpu/gated_delta_rule.h (same arguments plus a
// stream; every pointer in the args is a device pointer, including query_start_loc, state_slots
// and has_initial_state). The math, the state layout ([v_dim, k_dim] per value head: S
// transposed), the q/k normalisation and the chunking (chunks of chunk_size tokens from each
// sequence's first token of the call, decays exp(g_{s+1} + ... + g_t) summed from t down) are the
// CPU twin's, and every sum over the tokens of a chunk runs in the CPU's ascending order; results
// differ from it by float32 rounding only (sums over k_dim are grouped differently, and nvcc fuses
// multiply-adds): below 5e-7 on unit-scale inputs (measured, tests/kernels/cuda/).
//
// Launch shapes:
//   - recurrent: one block of 256 threads per (sequence, value head, slice of 16 value rows); each
//     warp keeps 2 rows of the head's state in registers (each lane k_dim / 32 elements of a row)
//     and works token by token with warp reductions over k_dim;
//   - chunked: one block of 256 threads per (sequence, value head, slice of 32 value rows), which
//     keeps its rows of the state in shared memory for the whole call and, per chunk, computes
//     the WY form as block-wide products of 4 x 4 register tiles on shared memory: the Gram
//     matrices k.k and q.k (lower triangles) and K S_0^T, the decays folded into them, a forward
//     substitution for the deltas U (one lane per value row, panels of 16 deltas of the row in
//     registers), then the outputs exp(G) Q S_0^T + (decayed q.k) U and the state update
//     exp(G_last) S_0 + (W U)^T K. The slices of a head are independent (every row of S^T evolves
//     on its own), so each recomputes the chunk's Gram matrices: with Qwen3-Next's 128 value rows
//     that is 4 blocks per head, 128 for one prefill on the H200's 132 multiprocessors. The next
//     chunk's inputs are loaded into registers while the current one finishes.
// Measured on an H200 with Qwen3-Next's 16 / 32 heads of 128, chunks of 64
// (bench/results/2026-12-03-delta-rule-kernel/, vamp_delta_rule_bench): one prefill of 2048 /
// 4096 / 8192 tokens takes 1.08 / 2.14 / 4.26 ms, 8.0 TFLOP/s of the chunked form's useful work
// (with the whole chunk's substitution unrolled: 1.30 / 2.58 / 5.14 ms; the kernel before, serial
// warp reductions per token in 16-row slices: 3.88 / 7.71 / 15.39 ms; HF's torch fallback 8.1 /
// 14.9 / 29.1 ms); the runner's mixed step of 64 decodes and a 2048-token prompt 1.23 ms for both
// launches; a decode step of 64 sequences 0.10 ms. Not profiled: 2.14 ms is 33 us per chunk and
// slice block, where a count of the chunk's instructions gives about 14 us of issue.
//
// No workspace: args.workspace and args.workspace_floats are ignored (the chunked form keeps a
// chunk's normalised q and k, its Gram matrices, deltas and the state slice in shared memory:
// 144.5 KiB at k_dim 128, 224.5 KiB at 256), and nothing is allocated per call.
#ifndef VAMP_KERNELS_CUDA_GATED_DELTA_RULE_H_
#define VAMP_KERNELS_CUDA_GATED_DELTA_RULE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/gated_delta_rule.h"

namespace vamp::kernels::cuda {

// The largest k_dim and v_dim supported (Qwen3-Next: 128 each).
inline constexpr int64_t kMaxDeltaRuleHeadDim = 256;
// The largest chunk_size of GatedDeltaRuleChunked (its shared memory grows with chunk_size *
// k_dim; Qwen3-Next runs chunks of 64, as HF and FLA).
inline constexpr int64_t kMaxDeltaRuleChunkSize = 64;

// Asynchronous on `stream`. InvalidArgument (nothing launched) as the CPU twin for non-positive
// sizes, num_v_heads not a multiple of num_k_heads, chunk_size < 1 and a state_slot_stride below
// num_v_heads * v_dim * k_dim; also for k_dim or v_dim above kMaxDeltaRuleHeadDim, chunk_size
// above kMaxDeltaRuleChunkSize, and num_v_heads or num_seqs beyond what a grid holds (65535,
// int32). The workspace is not checked (not used). The CPU twin's per-sequence checks read device
// memory here and cannot fail the call: a sequence with a negative length or a negative slot is
// skipped (its outputs and state are not written). num_seqs <= 0: nothing to do.
absl::Status GatedDeltaRuleRecurrent(const cpu::GatedDeltaRuleArgs& a, cudaStream_t stream);
absl::Status GatedDeltaRuleChunked(const cpu::GatedDeltaRuleArgs& a, int64_t chunk_size,
                                   cudaStream_t stream);

// cpu::GatedDeltaGates on the device (same formulas; CUDA's expf and log1pf are within 2 ulp of
// the CPU's, so results agree to a few 1e-7 relative). InvalidArgument for negative sizes; no
// launch for zero tokens or heads.
absl::Status GatedDeltaGates(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                             const float* a_log, const float* dt_bias, int64_t num_tokens,
                             int64_t num_heads, float* g, int64_t g_stride, float* beta,
                             int64_t beta_stride, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_GATED_DELTA_RULE_H_
