// Causal depthwise 1-D convolution with carried state, CUDA twin of kernels/cpu/causal_conv1d.h
// (same arguments plus a stream; every pointer in the args is a device pointer, including
// query_start_loc, state_slots and has_initial_state).
//
// Each output is accumulated in the CPU twin's order (bias first, then j = 0, ..., K - 1) with
// no fused multiply-adds, so without SiLU the outputs are bit-identical to the CPU twin; with SiLU
// they differ only by CUDA's expf (at most 2 ulp), i.e. a few 1e-7 relative. The updated states
// are copies of inputs: bit-identical.
#ifndef VAMP_KERNELS_CUDA_CAUSAL_CONV1D_H_
#define VAMP_KERNELS_CUDA_CAUSAL_CONV1D_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cpu/causal_conv1d.h"

namespace vamp::kernels::cuda {

// Runs the convolution over every sequence of the batch and updates their states, asynchronously
// on `stream` (two kernels: the outputs, which read the old states, then the state update).
// InvalidArgument (nothing launched) for kernel_size < 1, channels < 1, a state_slot_stride below
// (kernel_size - 1) * channels, num_seqs beyond int32, or a negative max_num_tokens (or one beyond
// the grid). The per-sequence checks of the CPU twin read device memory here and cannot fail the
// call: a sequence with a negative length or a negative slot is skipped (its outputs and state are
// not written), and rows past max_num_tokens, which the CPU twin refuses, are left unwritten (the
// caller must pass a true bound). num_seqs <= 0 or max_num_tokens 0: nothing to do.
absl::Status CausalConv1d(const cpu::CausalConv1dArgs& a, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_CAUSAL_CONV1D_H_
