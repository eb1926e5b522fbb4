// Token sampling, CPU reference (float32). Conventions: see kernels/cpu/gemm.h.
//
// Randomness is counter-based: the uniform number used for row r is a pure function of
// (seeds[r], draw_indices[r]) (a splitmix64 hash), so a request that carries its own seed and uses
// the index of the token being generated as the draw index samples the same tokens however it is
// batched, preempted or replayed, and the CUDA twin can reproduce the CPU's draws exactly.
// The CUDA twin, kernels/cuda/sampling.h (cuda::SampleTokens), implements these semantics on device
// memory; tests/kernels/cuda/sampling_cuda_test.cc holds the two against each other.
#ifndef VAMP_KERNELS_CPU_SAMPLING_H_
#define VAMP_KERNELS_CPU_SAMPLING_H_

#include <cstdint>

namespace vamp::kernels::cpu {

// The uniform number in [0, 1) (24 random bits) that SampleTokens draws for (seed, draw_index).
float UniformFromCounter(uint64_t seed, uint64_t draw_index);

// For each row r < num_rows of logits ([num_rows, vocab], row stride logits_stride):
//   temperatures[r] <= 0: greedy, the first index of the largest logit;
//   otherwise logits / temperature, restricted to the top_ks[r] largest (all when top_ks[r] <= 0
//   or >= vocab; ties broken towards the lower token id), then to the smallest prefix of those,
//   in descending order, whose probability mass reaches top_ps[r] (1 keeps all), renormalised;
//   the token is the first whose cumulative probability exceeds
//   UniformFromCounter(seeds[r], draw_indices[r]) times the total.
// out_tokens[r] receives the token; out_logprobs[r], when out_logprobs is not null, its log
// probability under the unmodified logits (log_softmax of the row).
// Workspace: index_workspace and value_workspace hold num_rows * vocab elements each.
void SampleTokens(const float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                  const float* temperatures, const int32_t* top_ks, const float* top_ps,
                  const uint64_t* seeds, const int64_t* draw_indices, int32_t* index_workspace,
                  float* value_workspace, int32_t* out_tokens, float* out_logprobs);

// The most alternatives TopLogprobs returns per row (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// For each row r < num_rows of logits ([num_rows, vocab], row stride logits_stride): the
// top_counts[r] (0..max_k) most likely tokens under log_softmax(row), the raw logits (before
// penalties and temperature), in descending order, ties broken towards the lower token id.
// out_ids[r * max_k + j] and out_logprobs[r * max_k + j] ([num_rows, max_k]) receive the j-th
// token id and its log probability for j < top_counts[r]; later entries of the row are set to -1
// and 0. 0 <= max_k <= kMaxTopLogprobs; top_counts[r] <= min(max_k, vocab); with max_k 0,
// top_counts, out_ids and out_logprobs are not read and may be null.
// When `tokens` is not null (then out_token_logprobs is not either), out_token_logprobs[r]
// receives log_softmax(row)[tokens[r]] (tokens[r] in [0, vocab)): the log probability of a token
// sampled from a processed copy of the row, reported against the raw row (vLLM's default
// "raw_logprobs"). All log probabilities are computed as SampleTokens computes out_logprobs
// (bit-identical for the same token and row). The CUDA twin is cuda::TopLogprobs.
void TopLogprobs(const float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                 const int32_t* top_counts, int32_t max_k, int32_t* out_ids, float* out_logprobs,
                 const int32_t* tokens, float* out_token_logprobs);

// Per-request logits processing that runs before SampleTokens (vLLM's order: penalties and
// min_tokens bans on the logits, then temperature, then min_p, then top-k / top-p). Arrays are
// host memory here and device memory for the CUDA twin (cuda::ProcessLogits).
//
// Row r's entries e in [entry_offsets[r], entry_offsets[r + 1]) name distinct token ids
// entry_tokens[e] in [0, vocab), each with entry_counts[e] >= 0 (times the request has generated
// it) and entry_flags[e] (kLogitInPrompt: the token occurs in the prompt; kLogitBanned: the
// request may not sample it yet, min_tokens). Tokens without an entry are neither.
inline constexpr uint8_t kLogitInPrompt = 1;
inline constexpr uint8_t kLogitBanned = 2;
struct LogitsProcessing {
  const int32_t* entry_offsets = nullptr;  // [num_rows + 1], entry_offsets[0] = 0
  const int32_t* entry_tokens = nullptr;
  const int32_t* entry_counts = nullptr;
  const uint8_t* entry_flags = nullptr;
  const float* repetition_penalties = nullptr;  // [num_rows]; 1 = off
  const float* frequency_penalties = nullptr;   // [num_rows]; 0 = off
  const float* presence_penalties = nullptr;    // [num_rows]; 0 = off
  const float* min_ps = nullptr;                // [num_rows]; 0 = off
  const float* temperatures = nullptr;          // [num_rows], as SampleTokens takes them
};

// Rewrites logits rows r < num_rows ([num_rows, vocab], row stride logits_stride) in place:
// 1. each entry's logit l: -inf when banned; otherwise, when the token is in the prompt or was
//    generated, l = l > 0 ? l / repetition : l * repetition, then
//    l -= frequency * count + presence * (count > 0 ? 1 : 0)   (all in float32);
// 2. rows with min_p > 0 and temperature > 0: every logit whose probability relative to the
//    row's largest, expf((l - max) * (1 / temperature)) in float32 as SampleTokens computes it,
//    is below min_p becomes -inf (greedy rows are left alone: the argmax cannot change).
// The CUDA twin computes the same bits except where CUDA's expf (2 ulp) and glibc's differ at
// the min_p boundary.
void ProcessLogits(float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                   const LogitsProcessing& p);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_SAMPLING_H_
