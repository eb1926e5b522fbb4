// Causal depthwise 1-D convolution with carried state, CPU reference (float32): the short
// convolution Qwen3-Next's Gated DeltaNet layers run over their q, k and v channels (HF
// Qwen3NextGatedDeltaNet.conv1d, kernel 4, no bias, then SiLU). Conventions: see
// kernels/cpu/gemm.h.
//
// Each channel c of a sequence is convolved on its own:
//   out[t, c] = act(bias[c] + sum_{j < K} weight[c, j] * x[t - (K - 1) + j, c])
// where inputs before the sequence's first token of this call come from the sequence's conv state
// (its K - 1 most recent inputs, oldest first), and are zero for a sequence that starts here. The
// sum is accumulated in the order j = 0, 1, ..., K - 1 (bias first when present), so a token's
// output depends only on its own K inputs, never on how the sequence is split into calls: a
// prefill in chunks, or token-by-token decode steps, gives the same bits as one call over the
// whole sequence. After the call the state holds the sequence's K - 1 most recent inputs.
//
// One kernel serves prefill chunks and decode steps (a decode is a sequence of one token): the
// arithmetic is identical, only the CUDA twin's launch shape differs.
//
// State layout, one slot per sequence (the runner's persistent-batch slot): slot s's state is
// [K - 1, channels] floats at conv_states + s * state_slot_stride, row 0 the oldest input and row
// K - 2 the most recent. Token-major rows (like the activations) so that a CUDA twin reads and
// writes a state row with consecutive threads over channels. K - 1 rows, not the K that HF's cache
// keeps: the K-th is the current input, never read again.
#ifndef VAMP_KERNELS_CPU_CAUSAL_CONV1D_H_
#define VAMP_KERNELS_CPU_CAUSAL_CONV1D_H_

#include <cstdint>

#include "absl/status/status.h"

namespace vamp::kernels::cpu {

struct CausalConv1dArgs {
  // [num_tokens, channels] (row stride x_stride): the packed new tokens of every sequence.
  const float* x = nullptr;
  int64_t x_stride = 0;
  // [channels, kernel_size]: HF's conv1d.weight [channels, 1, kernel_size] without the middle axis.
  const float* weight = nullptr;
  // [channels] or null (Qwen3-Next has no bias).
  const float* bias = nullptr;
  int64_t channels = 0;
  int64_t kernel_size = 0;
  // [num_seqs + 1]: sequence i owns rows [query_start_loc[i], query_start_loc[i + 1]).
  const int32_t* query_start_loc = nullptr;
  int64_t num_seqs = 0;
  // An upper bound of query_start_loc[num_seqs] (the rows of x and out), known on the host: the
  // CUDA twin, which cannot read query_start_loc before launching, spreads its grid over this many
  // rows; rows past it are not computed there, and the CPU twin refuses a batch that has them.
  int64_t max_num_tokens = 0;
  // [num_seqs]: the state slot of each sequence (distinct).
  const int32_t* state_slots = nullptr;
  // [num_seqs]: 0 = the sequence starts in this call (its state is not read, as if zero); null =
  // every sequence continues from its state.
  const uint8_t* has_initial_state = nullptr;
  // The state pool (see the header comment); read and updated in place.
  float* conv_states = nullptr;
  int64_t state_slot_stride = 0;
  // Apply SiLU (x / (1 + exp(-x))) to each output.
  bool silu = true;
  // [num_tokens, channels] (row stride out_stride); must not overlap x or the states.
  float* out = nullptr;
  int64_t out_stride = 0;
};

// Runs the convolution over every sequence of the batch and updates their states.
// InvalidArgument (nothing written) for kernel_size < 1, channels < 1, a state_slot_stride below
// (kernel_size - 1) * channels, a negative slot, query_start_loc that is not non-decreasing, or
// more rows than max_num_tokens.
absl::Status CausalConv1d(const CausalConv1dArgs& a);

}  // namespace vamp::kernels::cpu

#endif  // VAMP_KERNELS_CPU_CAUSAL_CONV1D_H_
