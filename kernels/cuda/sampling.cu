#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sampling.h"

namespace vamp::kernels::cuda {
namespace {

using internal::kFullMask;

constexpr int kSampleThreads = 1024;

__device__ __forceinline__ void WarpArgMax(float& v, int64_t& i) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int64_t oi = __shfl_xor_sync(kFullMask, i, offset);
    // A larger value, or an equal one at a lower index; -1 is "no candidate".
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

// One block per row.
__global__ void GreedySampleKernel(const float* logits, int64_t logits_stride, int64_t vocab,
                                   int32_t* out_tokens, float* out_logprobs) {
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  __shared__ float scratch[32];
  const float* row = logits + blockIdx.x * logits_stride;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  // Each thread walks its indices in increasing order, so a strict > keeps its first maximum.
  float v = 0.0f;
  int64_t i = -1;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (i < 0 || row[j] > v) {
      v = row[j];
      i = j;
    }
  }
  WarpArgMax(v, i);
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
  }
  __syncthreads();
  v = lane < num_warps ? warp_v[lane] : 0.0f;
  i = lane < num_warps ? warp_i[lane] : -1;
  WarpArgMax(v, i);  // every warp reduces the same 32 candidates: all threads get the winner
  if (threadIdx.x == 0) out_tokens[blockIdx.x] = static_cast<int32_t>(i);
  if (out_logprobs == nullptr) return;  // uniform across the block
  const float max_value = v;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(row[j] - max_value);
  sum = internal::BlockSum(sum, scratch);
  // log_softmax at the argmax: (max - max) - log(sum).
  if (threadIdx.x == 0) out_logprobs[blockIdx.x] = -logf(sum);
}

}  // namespace

absl::Status GreedySample(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, int32_t* out_tokens, float* out_logprobs,
                          cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  GreedySampleKernel<<<num_rows, kSampleThreads, 0, stream>>>(logits, logits_stride, vocab,
                                                              out_tokens, out_logprobs);
  return internal::LaunchStatus("GreedySampleKernel");
}

}  // namespace vamp::kernels::cuda
