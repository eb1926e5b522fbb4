// Token sampling, CUDA twin of the greedy path of kernels/cpu/sampling.h (float32, device
// pointers, plus a stream). Temperature / top-k / top-p sampling is not implemented on the GPU
// yet; rows that need it go through cpu::SampleTokens.
#ifndef VAMP_KERNELS_CUDA_SAMPLING_H_
#define VAMP_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace vamp::kernels::cuda {

// For each row r < num_rows of logits ([num_rows, vocab], row stride logits_stride):
// out_tokens[r] = the first index of the largest logit (cpu::SampleTokens with temperature <= 0;
// identical for rows without NaN); out_logprobs[r], when out_logprobs is not null, that token's
// log probability (log_softmax of the row, summed in float32 where the CPU sums in double).
absl::Status GreedySample(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, int32_t* out_tokens, float* out_logprobs,
                          cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_SAMPLING_H_
