#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/launch.h"

namespace vamp::kernels::cuda {
namespace {

using internal::CeilDiv;

constexpr int kConvThreads = 256;  // consecutive channels: coalesced rows of x, out and states
constexpr int64_t kMaxChannelBlocks = 65535;  // gridDim.y; wider rows loop over channels
// Rows per block of the output kernel. The grid covers the batch's rows, whatever their
// sequences: a decode batch (one row per sequence) and a long prefill mixed with it both spread
// over all multiprocessors (Qwen3-Next's 8,192 channels: 32 channel blocks x rows / 16).
constexpr int kConvRowsPerBlock = 16;

// The sequence's rows [*begin, *begin + *len) and its state; false for an empty sequence or one
// the kernels skip (negative length or slot).
__device__ __forceinline__ bool Sequence(const cpu::CausalConv1dArgs& a, int64_t i, int64_t* begin,
                                         int64_t* len, float** state, bool* from_state) {
  *begin = a.query_start_loc[i];
  *len = a.query_start_loc[i + 1] - *begin;
  const int32_t slot = a.state_slots[i];
  if (*len <= 0 || slot < 0) return false;
  *state = a.conv_states + slot * a.state_slot_stride;
  *from_state = a.has_initial_state == nullptr || a.has_initial_state[i] != 0;
  return true;
}

// Input r of channel c relative to the sequence's first token of this call (r < 0: the history,
// zero for a sequence that starts here), as the CPU twin's `input`.
__device__ __forceinline__ float Input(const cpu::CausalConv1dArgs& a, int64_t begin,
                                       const float* state, bool from_state, int64_t r, int64_t c) {
  if (r >= 0) return a.x[(begin + r) * a.x_stride + c];
  return from_state ? state[(a.kernel_size - 1 + r) * a.channels + c] : 0.0f;
}

// Grid (row blocks, channel blocks): block (b, y) computes rows 16b .. 16b + 15 (below
// max_num_tokens) of channels 256y + threadIdx.x, 256y + threadIdx.x + 256 gridDim.y, ... Each
// row's sequence is found once per block (the last sequence starting at or before it); rows past
// query_start_loc[num_seqs] and rows of skipped sequences are not written. Reads the states, never
// writes them. __fmul_rn / __fadd_rn keep nvcc from fusing into FMAs: the CPU twin's exact
// roundings.
__global__ void CausalConv1dOutKernel(cpu::CausalConv1dArgs a) {
  __shared__ int32_t row_seq[kConvRowsPerBlock];  // -1: nothing to compute
  const int64_t row0 = int64_t{blockIdx.x} * kConvRowsPerBlock;
  if (threadIdx.x < kConvRowsPerBlock) {
    const int64_t t = row0 + threadIdx.x;
    int32_t seq = -1;
    if (t < a.max_num_tokens && a.num_seqs > 0 && a.query_start_loc[0] <= t) {
      int64_t lo = 0, hi = a.num_seqs - 1;  // the last i with query_start_loc[i] <= t
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (a.query_start_loc[mid] <= t) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      if (t < a.query_start_loc[lo + 1] && a.state_slots[lo] >= 0) seq = static_cast<int32_t>(lo);
    }
    row_seq[threadIdx.x] = seq;
  }
  __syncthreads();
  const int64_t K = a.kernel_size, hist = K - 1;
  for (int r = 0; r < kConvRowsPerBlock; ++r) {
    const int32_t seq = row_seq[r];
    if (seq < 0) continue;
    int64_t begin, len;
    float* state;
    bool from_state;
    if (!Sequence(a, seq, &begin, &len, &state, &from_state)) continue;
    const int64_t t = row0 + r - begin;  // the row's position in its sequence's call
    for (int64_t c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x; c < a.channels;
         c += int64_t{gridDim.y} * blockDim.x) {
      const float* w = a.weight + c * K;
      float acc = a.bias != nullptr ? a.bias[c] : 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        acc = __fadd_rn(acc, __fmul_rn(w[j], Input(a, begin, state, from_state, t - hist + j, c)));
      }
      a.out[(begin + t) * a.out_stride + c] = a.silu ? acc / (1.0f + expf(-acc)) : acc;
    }
  }
}

// Grid (num_seqs, channel blocks): the new history of each channel, the last K - 1 inputs of (old
// history, this call's tokens). One thread writes all rows of its channel in ascending order: row
// r reads input len + r - hist, at or after row r of the old history, so in place is safe (the
// CPU twin's argument), and no other thread touches the channel.
__global__ void CausalConv1dStateKernel(cpu::CausalConv1dArgs a) {
  int64_t begin, len;
  float* state;
  bool from_state;
  if (!Sequence(a, blockIdx.x, &begin, &len, &state, &from_state)) return;
  const int64_t hist = a.kernel_size - 1;
  for (int64_t c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x; c < a.channels;
       c += int64_t{gridDim.y} * blockDim.x) {
    for (int64_t row = 0; row < hist; ++row) {
      state[row * a.channels + c] = Input(a, begin, state, from_state, len + row - hist, c);
    }
  }
}

}  // namespace

absl::Status CausalConv1d(const cpu::CausalConv1dArgs& a, cudaStream_t stream) {
  const int64_t K = a.kernel_size, C = a.channels, hist = a.kernel_size - 1;
  if (K < 1 || C < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: kernel_size ", K, " and channels ", C, " must be positive"));
  }
  if (hist > 0 && a.state_slot_stride < hist * C) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: state_slot_stride ", a.state_slot_stride,
                     " is below (kernel_size - 1) * channels = ", hist * C));
  }
  if (a.num_seqs > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: num_seqs ", a.num_seqs, " is beyond int32"));
  }
  if (a.max_num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: max_num_tokens ", a.max_num_tokens, " is negative"));
  }
  const int64_t row_blocks = CeilDiv(a.max_num_tokens, kConvRowsPerBlock);
  if (row_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: max_num_tokens ", a.max_num_tokens, " is beyond the grid"));
  }
  if (a.num_seqs <= 0 || row_blocks == 0) return absl::OkStatus();
  const int64_t channel_blocks = std::min(CeilDiv(C, kConvThreads), kMaxChannelBlocks);
  const dim3 out_grid(row_blocks, channel_blocks);
  CausalConv1dOutKernel<<<out_grid, kConvThreads, 0, stream>>>(a);
  if (absl::Status s = internal::LaunchStatus("CausalConv1dOutKernel"); !s.ok()) return s;
  if (hist == 0) return absl::OkStatus();  // no history to keep
  const dim3 state_grid(a.num_seqs, channel_blocks);
  CausalConv1dStateKernel<<<state_grid, kConvThreads, 0, stream>>>(a);
  return internal::LaunchStatus("CausalConv1dStateKernel");
}

}  // namespace vamp::kernels::cuda
