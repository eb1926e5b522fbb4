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
// The host does not know the sequences' lengths (query_start_loc is on the device), so the
// tokens of a sequence are spread over gridDim.z blocks chosen to give about kConvTargetBlocks
// blocks in all: a decode batch gets one slice per sequence, a single long prefill up to
// kMaxTokenSlices.
constexpr int64_t kConvTargetBlocks = 1024;
constexpr int64_t kMaxTokenSlices = 64;

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

// Grid (num_seqs, channel blocks, token slices): thread (c, slice) of sequence i computes the
// outputs of channel c for tokens slice, slice + gridDim.z, ... Reads the states, never writes
// them. __fmul_rn / __fadd_rn keep nvcc from fusing into FMAs: the CPU twin's exact roundings.
__global__ void CausalConv1dOutKernel(cpu::CausalConv1dArgs a) {
  int64_t begin, len;
  float* state;
  bool from_state;
  if (!Sequence(a, blockIdx.x, &begin, &len, &state, &from_state)) return;
  const int64_t K = a.kernel_size, hist = K - 1;
  for (int64_t c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x; c < a.channels;
       c += int64_t{gridDim.y} * blockDim.x) {
    const float* w = a.weight + c * K;
    const float bias = a.bias != nullptr ? a.bias[c] : 0.0f;
    for (int64_t t = blockIdx.z; t < len; t += gridDim.z) {
      float acc = bias;
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
  if (a.num_seqs <= 0) return absl::OkStatus();
  const int64_t channel_blocks = std::min(CeilDiv(C, kConvThreads), kMaxChannelBlocks);
  const int64_t slices = std::clamp(CeilDiv(kConvTargetBlocks, a.num_seqs * channel_blocks),
                                    int64_t{1}, kMaxTokenSlices);
  const dim3 out_grid(a.num_seqs, channel_blocks, slices);
  CausalConv1dOutKernel<<<out_grid, kConvThreads, 0, stream>>>(a);
  if (absl::Status s = internal::LaunchStatus("CausalConv1dOutKernel"); !s.ok()) return s;
  if (hist == 0) return absl::OkStatus();  // no history to keep
  const dim3 state_grid(a.num_seqs, channel_blocks);
  CausalConv1dStateKernel<<<state_grid, kConvThreads, 0, stream>>>(a);
  return internal::LaunchStatus("CausalConv1dStateKernel");
}

}  // namespace vamp::kernels::cuda
