// Grouped expert GEMM in bfloat16 driven entirely by device memory: CUDA twin of
// kernels/cpu/grouped_gemm.h (same arguments plus a stream).
//
// Why: cuBLAS takes every expert's row count on the host, so an MoE layer through it copies
// MoePermute's offsets back and synchronises the stream once per layer, which also keeps the layer
// out of CUDA graphs. These kernels read the per-layer expert pointer table and the row offsets
// from DEVICE memory; the launch is sized from a host upper bound on the rows (T * top_k), and
// CTAs that find no work exit. Nothing here synchronises or allocates, so the calls can be
// captured into a CUDA graph.
//
// Arithmetic: bf16 x bf16 products accumulated in float32 on tensor cores (mma.sync
// m16n8k16, or wgmma m64n128k16 on Hopper), rounded to bf16 once. Results agree with the CPU twin
// to float32 rounding of a differently ordered sum followed by the same bf16 rounding: mostly
// bit-identical, otherwise one bf16 ulp apart. Per output element the order of accumulation depends
// only on k, never on the number of rows or where they sit, so a row gives the same result in any
// batch.
//
// Paths (chosen on the host from the arguments; same results up to summation order):
//   - tensor cores, when k, n (inter for the fused variant), lda, ldw and weight_offset are
//     multiples of 8 elements, ldc (ldo) is even, and a / c are 16- / 4-byte aligned. Partial
//     tiles in rows, columns and k are predicated, so shapes such as the tiny test model's
//     (n 48, k 24) run here too. Tile height (32, 64 or 128 rows) follows the average rows per
//     expert, max_rows / min(num_experts, max_rows): decode-sized groups stream each expert's
//     weights with wide cp.async loads through small tiles, prefill-sized ones use 128x128 tiles.
//     On an sm_90 device with sm_90a code (the default build), groups above 32 rows per expert
//     run Hopper warpgroup MMAs (wgmma) instead, on 128 x 128 tiles, two CTAs per SM.
//     Each expert's weight pointer (expert_weights[e] + weight_offset) must be 16-byte aligned to
//     be read this way; the kernel checks it per expert and computes a misaligned expert's tiles
//     with plain loads instead (correct, slow).
//   - a plain float32 kernel for every other shape.
//
// Device-side contract (not checkable from the host without a synchronisation):
//   - expert_offsets is non-decreasing from expert_offsets[0] >= 0, and
//     expert_offsets[num_experts] <= max_rows; rows beyond the tile bound that max_rows implies
//     are not computed.
//   - an expert with rows but a null pointer is SKIPPED: its rows of `c` are left as they were
//     (the kernel cannot report it; the CPU twin returns InvalidArgument).
//   - rows owned by no expert are not written.
#ifndef VAMP_KERNELS_CUDA_GROUPED_GEMM_H_
#define VAMP_KERNELS_CUDA_GROUPED_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

// For every expert e: c[rows of e] = a[rows of e] x W_e^T, W_e = expert_weights[e] +
// weight_offset ([n, k] row-major, row stride ldw); the rows of e are [expert_offsets[e],
// expert_offsets[e+1]). `a` ([max_rows, k], row stride lda) and `c` ([max_rows, n], row stride
// ldc) are device pointers; `expert_weights` (num_experts device pointers) and `expert_offsets`
// (num_experts + 1) are DEVICE arrays; `max_rows` is a host upper bound on
// expert_offsets[num_experts]. InvalidArgument for negative sizes, strides shorter than rows
// (lda, ldw < k; ldc < n), null arrays when there is work, or max_rows beyond int32.
absl::Status GroupedExpertGemm(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               int64_t max_rows, BFloat16* c, int64_t ldc, int64_t n, int64_t k,
                               cudaStream_t stream);

// The w13 GEMM with SiLU-and-mul in its epilogue: W_e is [2 * inter, k] (gate rows, then up rows)
// and out[r, j] = silu(a[r] . W_e[j]) * (a[r] . W_e[inter + j]) for j < inter, both dot products
// kept in float32 and the product rounded to bf16 once (as cpu::GroupedExpertGemmSiluMul). `out`
// is [max_rows, inter], row stride ldo >= inter. Same contract and errors as GroupedExpertGemm.
absl::Status GroupedExpertGemmSiluMul(const BFloat16* a, int64_t lda,
                                      const BFloat16* const* expert_weights, int64_t weight_offset,
                                      int64_t ldw, const int32_t* expert_offsets,
                                      int64_t num_experts, int64_t max_rows, BFloat16* out,
                                      int64_t ldo, int64_t inter, int64_t k, cudaStream_t stream);

// true: groups above 32 rows per expert run the mma.sync tiles even where wgmma is available, as
// before Hopper's kernel (tests check that path on Hopper; benchmarks time it as the baseline).
// Process-wide; set it between launches, not while another thread launches. Default false.
void SetGroupedGemmMmaSyncOnly(bool mma_sync);

// false: groups of up to 16 rows per expert run the 32 x 128 tiles (SmallTile) instead of the
// 16 x 64 decode tiles, as before those existed (benchmarks time it as the baseline; rows are
// bit-identical either way). Process-wide, like SetGroupedGemmMmaSyncOnly. Default true.
void SetGroupedGemmDecodeTile(bool enabled);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_GROUPED_GEMM_H_
