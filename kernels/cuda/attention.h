// Paged causal attention, CUDA twins of kernels/cpu/attention.h (float32 and bfloat16, device
// pointers, same arguments plus a stream) over the KV cache kv_cache_write.h fills. KV cache
// addressing, block tables and causal semantics are exactly the CPU twin's.
#ifndef VAMP_KERNELS_CUDA_ATTENTION_H_
#define VAMP_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/kv_cache_write.h"

namespace vamp::kernels::cuda {

using cpu::PagedAttentionArgs;

// Largest head_dim PagedAttention supports (each lane of a warp holds head_dim / 32 elements).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// As cpu::PagedAttention, for decode and prefill alike: sequence i's query row r attends to
// cached positions [0, seq_lens[i] - q_len + r]. Each (query row, head) is one work item of a
// persistent grid; a block's four warps split the keys and each keeps an online (running max)
// softmax, merged at the end, so no score buffer is needed: `workspace` is not read (it is
// accepted so that the runner calls both twins alike, and may be null). The number of query rows
// is read on the device (query_start_loc[num_seqs]), so the launch needs no host copy.
// head_dim <= kMaxAttentionHeadDim; num_q_heads a multiple of num_kv_heads.
// Results agree with the CPU twin to float32 rounding (exp and sums in a different order).
absl::Status PagedAttention(const PagedAttentionArgs<float>& a, cudaStream_t stream);

// ---- bfloat16 (the engine's storage type) ----

// Float32 elements of `workspace` PagedAttention(bfloat16) needs for any step of at most
// max_num_tokens query rows, max_num_seqs sequences and max_seq_len tokens of context with these
// heads (a host function: no device is touched). Only split-KV launches use scratch (one partial
// (max, sum, output) per query vector and KV split), a fixed number of partial slots of 16 query
// vectors (2048), so the result is 2048 * 16 * (head_dim + 2) floats (16.3 MiB for head_dim 128),
// or 0 when nothing can split (max_seq_len at most 256 tokens, or no sequences). Split-KV decode
// spreads a few long sequences over the GPU; split-KV prefill does the same for chunks whose query
// tiles leave CTA slots idle (a short chunk after a long prefix).
int64_t PagedAttentionWorkspaceFloats(int64_t max_num_tokens, int64_t max_num_seqs,
                                      int64_t num_q_heads, int64_t head_dim, int64_t max_seq_len);

// bfloat16 paged attention, the semantics of cpu::PagedAttention (causal, GQA, block tables):
// sequence i's query row r attends to cached positions [0, seq_lens[i] - q_len + r]; a sequence
// with no query rows is skipped. max_query_len and max_seq_len are host upper bounds of the
// batch's query lengths and seq_lens (the exact values are read on the device, so a launch needs
// no host sync); a sequence exceeding them is not (fully) computed. Routing (see
// PlanPagedAttention): head_dim 64, 128 or 256 with 16-byte aligned q, out, caches and strides use
// tensor cores (mma.sync bf16, float32 softmax and accumulation): a split-KV decode kernel when
// max_query_len == 1 or max_query_len * group <= 32 (each CTA handles all query heads of one KV
// head, so each K/V byte is read once; partials merged by a second kernel), otherwise a
// FlashAttention-2 style prefill kernel, its keys split like the decode kernel's when its tiles
// do not fill the GPU (up to head_dim 128: 128 query vectors per CTA, two 16-row
// tiles per warp sharing every K/V fragment, 64-key tiles gathered through the block table; at
// head_dim 256: 64 query vectors, one 16-row tile per warp, 32-key tiles; on Hopper at head_dim
// 128 and 256 the same tiles on warpgroup MMAs, see PagedAttentionPrefillUsesWgmma). Other shapes
// use a simple bf16 kernel (one warp-split work item per (row, head)). Output agrees with the CPU
// twin to bf16 rounding of the probabilities (about 1e-2 of max(1, |out|)).
//
// Errors (InvalidArgument, nothing launched): head_dim outside [1, kMaxAttentionHeadDim], heads
// not a positive multiple, block_size < 1, negative counts, sizes beyond 32-bit indexing, or
// workspace_floats below what this launch needs (never more than PagedAttentionWorkspaceFloats
// of the same or larger bounds).
absl::Status PagedAttention(const PagedAttentionArgs<BFloat16>& a, cudaStream_t stream);

// The launch PagedAttention(bfloat16) makes, exposed for tests and the benchmark (host only).
enum class AttentionKernel { kSimple, kDecode, kPrefill };
struct PagedAttentionPlan {
  AttentionKernel kernel = AttentionKernel::kSimple;
  int64_t query_tiles = 0;       // tiles of query vectors per (sequence, KV head)
  int64_t splits = 1;            // KV splits per tile (decode kernel; > 1 adds the merge kernel)
  int64_t ctas = 0;              // thread blocks of the main kernel
  int64_t workspace_floats = 0;  // scratch this launch needs
};

// Plans a launch for arguments PagedAttention has validated. `tensor_core_layout`: pointers and
// strides 16-byte aligned (see PagedAttention). sm_count and decode_ctas_per_sm (resident decode
// CTAs per multiprocessor) describe the device. The number of splits minimises the estimated time
// waves(splits) * (keys per split + fixed overhead) over the decode CTAs, so short batches with
// long contexts spread over the whole GPU while full batches do not pay for merging.
PagedAttentionPlan PlanPagedAttention(int64_t num_seqs, int64_t max_query_len, int64_t max_seq_len,
                                      int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                      bool tensor_core_layout, int64_t sm_count,
                                      int64_t decode_ctas_per_sm);

const char* AttentionKernelName(AttentionKernel kernel);

// Whether kPrefill launches of this head_dim run the Hopper wgmma kernel on the current device
// (head_dim 128 or 256, an sm_90a build on a compute capability 9.0 device, and not
// SetPagedAttentionMmaSyncOnly); otherwise they run the mma.sync kernel. Same tiles, same plan.
bool PagedAttentionPrefillUsesWgmma(int64_t head_dim);

// true: prefill launches run the mma.sync kernel even where wgmma is available (tests check that
// kernel on Hopper; the benchmark times it as the baseline). Process-wide; set it between
// launches, not while another thread launches. Default false.
void SetPagedAttentionMmaSyncOnly(bool mma_sync);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_ATTENTION_H_
