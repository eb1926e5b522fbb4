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

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_SAMPLING_H_
