#include "kernels/cpu/causal_conv1d.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace vamp::kernels::cpu {

absl::Status CausalConv1d(const CausalConv1dArgs& a) {
  const int64_t K = a.kernel_size, C = a.channels, hist = a.kernel_size - 1;
  if (K < 1 || C < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal conv1d: kernel_size ", K, " and channels ", C, " must be positive"));
  }
  if (hist > 0 && a.state_slot_stride < hist * C) {
    return absl::InvalidArgumentError(absl::StrCat("causal conv1d: state_slot_stride ",
                                                   a.state_slot_stride,
                                                   " is below (kernel_size - "
                                                   "1) * channels = ",
                                                   hist * C));
  }
  for (int64_t i = 0; i < a.num_seqs; ++i) {
    if (a.query_start_loc[i + 1] < a.query_start_loc[i] || a.state_slots[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("causal conv1d: sequence ", i,
                                                     " has a negative length or state slot ",
                                                     a.state_slots[i]));
    }
  }
  if (a.num_seqs > 0 && a.query_start_loc[a.num_seqs] > a.max_num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("causal conv1d: ", a.query_start_loc[a.num_seqs],
                                                   " rows exceed max_num_tokens ",
                                                   a.max_num_tokens));
  }
  for (int64_t i = 0; i < a.num_seqs; ++i) {
    const int64_t begin = a.query_start_loc[i];
    const int64_t len = a.query_start_loc[i + 1] - begin;
    if (len == 0) continue;
    float* state = a.conv_states + a.state_slots[i] * a.state_slot_stride;
    const bool from_state = a.has_initial_state == nullptr || a.has_initial_state[i] != 0;
    // Input r of the sequence relative to this call's first token (r < 0: the history).
    auto input = [&](int64_t r, int64_t c) -> float {
      if (r >= 0) return a.x[(begin + r) * a.x_stride + c];
      return from_state ? state[(hist + r) * C + c] : 0.0f;
    };
    for (int64_t t = 0; t < len; ++t) {
      float* o = a.out + (begin + t) * a.out_stride;
      for (int64_t c = 0; c < C; ++c) {
        const float* w = a.weight + c * K;
        float acc = a.bias != nullptr ? a.bias[c] : 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += w[j] * input(t - hist + j, c);
        o[c] = a.silu ? acc / (1.0f + std::exp(-acc)) : acc;
      }
    }
    // The new history: the last K - 1 inputs of (old history, this call's tokens). Row i reads
    // input len + i - hist >= i - hist, never a row already overwritten, so in place is safe.
    for (int64_t row = 0; row < hist; ++row) {
      for (int64_t c = 0; c < C; ++c) state[row * C + c] = input(len + row - hist, c);
    }
  }
  return absl::OkStatus();
}

}  // namespace vamp::kernels::cpu
