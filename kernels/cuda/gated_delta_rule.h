// The gated delta rule, CUDA twin of kernels/cpu/gated_delta_rule.h (same arguments plus a
// stream; every pointer in the args is a device pointer, including query_start_loc, state_slots
// and has_initial_state). The math, the state layout ([v_dim, k_dim] per value head: S
// transposed), the q/k normalisation and the chunking (chunks of chunk_size tokens from each
// sequence's first token of the call, decays exp(g_{s+1} + ... + g_t) summed from t down) are the
// CPU twin's; results differ from it by float32 rounding only (sums over k_dim and over the tokens
// of a chunk are reduced across a warp, and nvcc fuses multiply-adds), about 1e-7 absolute on
// unit-scale inputs.
//
// Launch shape: one block of 256 threads per (sequence, value head, slice of 16 value rows); the
// block keeps its 16 rows of the head's state in registers for the whole call (each warp 2 rows,
// each lane k_dim / 32 elements of a row) and writes them back at the end. Every row of S^T
// evolves on its own given the token's normalised q and k, so the slices of a head are
// independent; each recomputes the per-token (and per-chunk) quantities it needs, which buys
// parallelism when few sequences run (a single prefill). Measured on an H200 with Qwen3-Next's
// 16 / 32 heads of 128: a 4096-token prefill in chunks of 64 takes 8.7 ms, a decode step of 64
// sequences 0.11 ms (before the chunked form ran a warp's two rows side by side, which took 8 % off
// the 24-layer model's mixed step; bench/results/2026-12-03-qwen3-next-tc-attention/).
//
// No workspace: args.workspace and args.workspace_floats are ignored (the chunked form keeps a
// chunk's normalised q and k, its Gram matrices and deltas in shared memory), and nothing is
// allocated per call.
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
