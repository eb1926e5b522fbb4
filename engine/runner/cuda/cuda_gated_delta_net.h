// Qwen3-Next's Gated DeltaNet (linear-attention) layers on the GPU, and the per-sequence recurrent
// state they keep: the device half of engine/model/qwen3_next.h's LinearAttention, for
// CudaQwen3MoeModel (engine/runner/cuda/cuda_qwen3_moe.h), which runs the rest of the model.
//
// One layer, for the step's n tokens (x and out [n, hidden] of the model's dtype T):
//   proj = x in_proj^T (float32: q | k | v | z | b | a, rows reordered at load time as on the CPU)
//   conv = SiLU(causal depthwise conv1d over q | k | v, from each sequence's conv state)
//   g, beta = gates of a and b;  core = gated delta rule over (q, k, v, g, beta)
//   out = out_proj(RMSNormGated(core, z))  (T; a partial sum over heads when tensor parallel)
// with the kernels of kernels/cuda/ (causal_conv1d.h, gated_delta_rule.h, norm.h, gemm.h), every
// one a twin of the CPU kernel the CPU model calls at the same point, so the two agree to float32
// rounding (float32 mode) and the forms are the CPU model's: a sequence with one new token goes
// through the recurrent form, a longer one through the chunked form (chunks of
// Qwen3NextModel::kDeltaRuleChunkSize), and a sequence with a state capture runs in two parts
// split at the capture, the copy taken in between.
//
// State: [num_slots, slot_floats] float32 in one device allocation (ReserveSlots), laid out as
// the CPU model lays a slot out (per linear-attention layer at its state_offset: the conv state
// [K - 1, conv_dim] then the delta-rule state [v_heads, v_dim, k_dim]), so snapshots mean the
// same on both backends. Snapshots (StateSnapshotView chunks: KV blocks, device addresses here)
// are written and read with device-to-device copies on the stream; nothing synchronises.
//
// Per step: BeginStep checks the step's slots and captures (RecurrentStateSlots) and uploads its
// per-sequence arrays in one transfer to a fixed device area, so a step without captures launches
// only kernels whose arguments live at stable device addresses (CUDA graphs may capture it);
// EndStep records what the slots hold afterwards.
//
// Not thread-safe: one caller at a time, on one stream.
#ifndef VAMP_ENGINE_RUNNER_CUDA_CUDA_GATED_DELTA_NET_H_
#define VAMP_ENGINE_RUNNER_CUDA_CUDA_GATED_DELTA_NET_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/memory/cuda_buffers.h"
#include "engine/model/causal_lm.h"
#include "engine/model/dtype.h"
#include "engine/model/recurrent_state_slots.h"

namespace vamp {

class CudaGatedDeltaNet {
 public:
  // Rank-local sizes of the linear-attention layers.
  struct Shape {
    int64_t hidden = 0;
    int64_t k_heads = 0;  // key heads
    int64_t v_heads = 0;  // value heads, a multiple of k_heads
    int64_t k_dim = 0;
    int64_t v_dim = 0;
    int64_t conv_kernel = 0;
    float eps = 0;  // of the gated RMSNorm

    int64_t key_dim() const { return k_heads * k_dim; }
    int64_t value_dim() const { return v_heads * v_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
    // Columns of in_proj's output: q | k | v | z | b | a.
    int64_t proj_cols() const { return conv_dim() + value_dim() + 2 * v_heads; }
    int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_dim(); }
    int64_t delta_state_floats() const { return v_heads * v_dim * k_dim; }
  };
  // One layer's device weights: in_proj [proj_cols, hidden] and out_proj [hidden, value_dim] of
  // the model's dtype; conv [conv_dim, conv_kernel], a_log and dt_bias [v_heads], norm [v_dim]
  // float32. state_offset: the layer's floats within a slot.
  struct LayerWeights {
    const void* in_proj = nullptr;
    const float* conv = nullptr;
    const float* a_log = nullptr;
    const float* dt_bias = nullptr;
    const float* norm = nullptr;
    const void* out_proj = nullptr;
    int64_t state_offset = 0;
  };

  // Workspace for steps of up to max_tokens tokens and max_seqs sequences; `slot_floats` floats
  // per slot (every linear-attention layer's state). InvalidArgument for sizes the kernels do not
  // take; Unavailable without a device.
  static absl::StatusOr<std::unique_ptr<CudaGatedDeltaNet>> Create(const Shape& shape,
                                                                   int64_t slot_floats,
                                                                   int64_t max_tokens,
                                                                   int64_t max_seqs, DType dtype,
                                                                   cudaStream_t stream);

  // num_slots zeroed slots (the previous ones and what they held are gone).
  absl::Status ReserveSlots(int64_t num_slots);
  int64_t num_slots() const { return slots_.num_slots(); }
  // Copies `from` (device addresses) into `slot`, stream-ordered before the next step; errors as
  // RecurrentStateSlots::CheckRestore.
  absl::Status Restore(int32_t slot, const StateSnapshotView& from, int64_t num_tokens);

  // Checks the step (errors as Qwen3NextModel::Forward's) and uploads its per-sequence arrays on
  // the stream. Call before the layers, outside any CUDA graph capture.
  absl::Status BeginStep(const ForwardBatch& batch);
  // One layer over the step BeginStep prepared: `x` is the normalised input, `out` receives the
  // layer's output; they may be the same buffer (x is read only by the first GEMM, which the
  // stream finishes before the last writes out). T is float or kernels::BFloat16, the model's
  // dtype.
  template <typename T>
  absl::Status RunLayer(const LayerWeights& w, const ForwardBatch& batch, const T* x, T* out);
  // After the step's layers (also after a failure: `ok` false leaves its slots unusable).
  void EndStep(const ForwardBatch& batch, bool ok) { slots_.FinishStep(batch, ok); }

  // Whether the prepared step takes state captures (its launches then depend on the step's host
  // data: not capturable in a CUDA graph).
  bool step_has_captures() const { return num_captures_ > 0; }
  // The device address of the slots: a CUDA graph bakes it in.
  const void* states_address() const { return states_.data(); }
  uint64_t state_bytes() const { return states_.bytes(); }
  uint64_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  // Byte offsets of the per-step arrays, the same in pinned host memory and on the device.
  struct StepLayout {
    uint64_t query_start_loc = 0;  // int32 [max_seqs + 1]
    uint64_t slots = 0;            // int32 [max_seqs]: every sequence's slot (the conv)
    uint64_t recurrent_slots = 0;  // int32 [max_seqs]: slot of one-token sequences, else -1
    uint64_t chunked_slots = 0;    // int32 [max_seqs]: slot of longer sequences, else -1
    uint64_t capture_ranges = 0;   // int32 [max_seqs, 4]: begin, split, split, end per capture
    uint64_t capture_slots = 0;    // int32 [max_seqs]
    uint64_t has_initial = 0;      // uint8 [max_seqs]
    uint64_t capture_initial = 0;  // uint8 [max_seqs, 2]: the first part's, then 1
    uint64_t bytes = 0;
  };

  CudaGatedDeltaNet(const Shape& shape, int64_t slot_floats, int64_t max_tokens, int64_t max_seqs,
                    DType dtype, cudaStream_t stream);
  absl::Status Allocate();
  // The delta rule over `num_seqs` sequences of the given device arrays, recurrent or chunked.
  absl::Status DeltaRule(bool recurrent, const int32_t* query_start_loc, int64_t num_seqs,
                         const int32_t* state_slots, const uint8_t* has_initial,
                         float* layer_states);
  // Writes layer `w`'s conv state after capture `c`'s split into its snapshot.
  absl::Status CaptureConvState(const LayerWeights& w, const ForwardBatch& batch, int64_t c,
                                const float* proj);

  template <typename T>
  T* Device(uint64_t offset) const {
    return reinterpret_cast<T*>(step_dev_ + offset);
  }

  const Shape shape_;
  const int64_t slot_floats_;
  const int64_t max_tokens_, max_seqs_;
  const DType dtype_;
  const cudaStream_t stream_;

  RecurrentStateSlots slots_;
  DeviceBuffer states_;  // [num_slots, slot_floats_] float32
  RecurrentStepPlan plan_;
  int64_t num_recurrent_ = 0, num_chunked_ = 0, num_captures_ = 0;

  StepLayout layout_;
  PinnedBuffer step_host_;
  DeviceBuffer workspace_;
  uint8_t* step_dev_ = nullptr;
  float *proj_ = nullptr, *conv_out_ = nullptr, *g_ = nullptr, *beta_ = nullptr, *core_ = nullptr;
  void* normed_ = nullptr;    // [max_tokens, value_dim] of the model's dtype
  float* history_ = nullptr;  // [max_seqs, conv_state_floats]: captures' conv state before the step
  float* zero_row_ = nullptr;  // [conv_dim] zeros: conv inputs before a sequence's start
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_CUDA_GATED_DELTA_NET_H_
