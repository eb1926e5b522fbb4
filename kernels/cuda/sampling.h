// Token sampling, CUDA twin of kernels/cpu/sampling.h (float32 logits, device pointers, plus a
// stream): GreedySample for all-greedy batches, SampleTokens for the full sampler (greedy,
// temperature, top-k, top-p, counter-based randomness, log-probabilities), ProcessLogits and
// TopLogprobs (the most likely alternatives and their log-probabilities).
#ifndef VAMP_KERNELS_CUDA_SAMPLING_H_
#define VAMP_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/sampling.h"

namespace vamp::kernels::cuda {

// For each row r < num_rows of logits ([num_rows, vocab], row stride logits_stride):
// out_tokens[r] = the first index of the largest logit (cpu::SampleTokens with temperature <= 0;
// identical for rows without NaN); out_logprobs[r], when out_logprobs is not null, that token's
// log probability (log_softmax of the row, summed in float32 where the CPU sums in double).
absl::Status GreedySample(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, int32_t* out_tokens, float* out_logprobs,
                          cudaStream_t stream);

// Scratch bytes SampleTokens needs for up to max_rows rows of `vocab` logits (host function; 0
// when either is <= 0): two int32 index arrays of `vocab` per row (8 bytes per logit, as the CPU
// twin's index and value workspaces), used only by rows whose candidates are radix sorted (below).
int64_t SampleTokensWorkspaceBytes(int64_t max_rows, int64_t vocab);

// cpu::SampleTokens for every row r < num_rows; every array is DEVICE memory: logits
// [num_rows, vocab] with row stride logits_stride (>= vocab); temperatures, top_ks, top_ps,
// seeds, draw_indices [num_rows]; out_tokens [num_rows]; out_logprobs [num_rows] or null.
// `workspace` holds workspace_bytes >= SampleTokensWorkspaceBytes(num_rows, vocab) bytes, 4-byte
// aligned, and must not be used by anything else while the kernel runs. Enqueued on `stream`;
// an InvalidArgument error (nothing enqueued) for bad sizes, null pointers or a short workspace.
//
// Semantics are exactly the CPU's (kernels/cpu/sampling.h): temperature <= 0 is greedy (first
// index of the maximum); otherwise p_i = expf((logit_i - max) * (1 / T)) in float32 as on the CPU,
// restricted to the top_k largest logits (ties: lower token id first), then to the shortest
// descending prefix whose mass reaches top_p, and the token is the first whose cumulative
// probability exceeds UniformFromCounter(seed, draw_index) * total (the same splitmix64 draw, bit
// for bit). Candidates are in descending-logit order when top-k or top-p applies and in token-id
// order otherwise, as on the CPU. The logprob is that of the token under log_softmax(logits).
//
// Precision: probabilities are float32 expf values (CUDA's expf, within 2 ulp, against glibc's
// within 1), accumulated in double like the CPU, but in a different order (block-wide scans).
// Tokens therefore equal the CPU's except when the uniform draw or the top-p target lands within
// that rounding (~1e-7 relative) of a cumulative boundary. Logprobs sum float32 expf terms in
// double (the CPU: double exp), ~1e-7 apart. -inf logits (masked tokens) have probability 0; rows
// holding NaN or +inf are undefined, as on the CPU.
//
// Cost: one 1024-thread block per row. Greedy and pure temperature rows read the row twice
// (argmax; then the sums) and scan one 1/32 segment of it in token order. With top-k / top-p, the
// second read also builds a histogram of (max - logit) in 1/32-logit bins, which bounds the
// candidates: the bins holding the top-k, or, for top-p alone, those whose lower bound of mass
// reaches top_p * total. Up to 4096 candidates are gathered and sorted in shared memory (the
// usual case for LLM logits); more (a large top_k, or top-p over a flat distribution) are radix
// sorted (stable, 4 passes of 8 bits) in the workspace, the whole row at worst.
absl::Status SampleTokens(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, const float* temperatures, const int32_t* top_ks,
                          const float* top_ps, const uint64_t* seeds, const int64_t* draw_indices,
                          void* workspace, int64_t workspace_bytes, int32_t* out_tokens,
                          float* out_logprobs, cudaStream_t stream);

// cpu::TopLogprobs on device memory (logits, top_counts, out_ids, out_logprobs, tokens and
// out_token_logprobs), enqueued on `stream`: per row, the top_counts[r] most likely tokens of
// log_softmax(row) in descending order (ties: lower token id first), the rest of the row's max_k
// entries -1 and 0; with `tokens`, out_token_logprobs[r] = log_softmax(row)[tokens[r]]. Token ids
// equal the CPU's; log probabilities sum double exp terms as the CPU does, in a different order
// (~1e-15 relative apart), and are within ~1e-7 of SampleTokens' out_logprobs (float32 expf
// terms). InvalidArgument (nothing enqueued) for bad sizes, max_k outside
// [0, cpu::kMaxTopLogprobs], null pointers the call needs, or only one of tokens and
// out_token_logprobs. One 256-thread block per row; it reads the row max(top_counts[r], 1) + 1
// times (once when it has nothing to compute).
absl::Status TopLogprobs(const float* logits, int64_t logits_stride, int64_t num_rows,
                         int64_t vocab, const int32_t* top_counts, int32_t max_k, int32_t* out_ids,
                         float* out_logprobs, const int32_t* tokens, float* out_token_logprobs,
                         cudaStream_t stream);

// cpu::ProcessLogits on device memory (logits and every array of `p`), enqueued on `stream`:
// penalties and min_tokens bans on each row's entries, then the min_p mask. Identical results
// except where CUDA's expf and glibc's differ at the min_p boundary (kernels/cpu/sampling.h).
// InvalidArgument (nothing enqueued) for bad sizes or null pointers. One 256-thread block per row.
absl::Status ProcessLogits(float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                           const cpu::LogitsProcessing& p, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_SAMPLING_H_
