#include "engine/runner/cuda/cuda_gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "engine/model/qwen3_next.h"
#include "engine/runner/cuda/device_carver.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gated_delta_rule.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;
using kernels::BFloat16;

// Device-to-device copies between `count` floats at `data` and floats [offset, offset + count) of
// a snapshot stored across chunks (StateSnapshotView), one copy per chunk touched.
absl::Status SnapshotCopy(const StateSnapshotView& view, int64_t offset, float* data, int64_t count,
                          bool to_snapshot, cudaStream_t stream) {
  int64_t at = offset * static_cast<int64_t>(sizeof(float));
  int64_t left = count * static_cast<int64_t>(sizeof(float));
  auto* bytes = reinterpret_cast<uint8_t*>(data);
  while (left > 0) {
    const int64_t chunk = at / view.chunk_bytes, within = at % view.chunk_bytes;
    if (chunk >= static_cast<int64_t>(view.chunks.size())) {
      return absl::InternalError("recurrent-state snapshot copy past the snapshot's end");
    }
    const int64_t n = std::min(left, view.chunk_bytes - within);
    uint8_t* snapshot = view.chunks[chunk] + within;
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(to_snapshot ? snapshot : bytes,
                                                to_snapshot ? bytes : snapshot, n,
                                                cudaMemcpyDeviceToDevice, stream));
    at += n;
    bytes += n;
    left -= n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaGatedDeltaNet>> CudaGatedDeltaNet::Create(
    const Shape& shape, int64_t slot_floats, int64_t max_tokens, int64_t max_seqs, DType dtype,
    cudaStream_t stream) {
  if (shape.hidden < 1 || shape.k_heads < 1 || shape.v_heads < 1 ||
      shape.v_heads % shape.k_heads != 0 || shape.k_dim < 1 || shape.v_dim < 1 ||
      shape.conv_kernel < 1 || max_tokens < 1 || max_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gated DeltaNet: hidden ", shape.hidden, ", ", shape.k_heads, " key heads, ",
                     shape.v_heads, " value heads (a multiple of the key heads), head dims ",
                     shape.k_dim, "/", shape.v_dim, ", conv kernel ", shape.conv_kernel, ", ",
                     max_tokens, " tokens, ", max_seqs, " sequences: every size must be >= 1"));
  }
  if (shape.k_dim > kc::kMaxDeltaRuleHeadDim || shape.v_dim > kc::kMaxDeltaRuleHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("Gated DeltaNet head dims ", shape.k_dim, "/",
                                                   shape.v_dim, " exceed the GPU kernels' ",
                                                   kc::kMaxDeltaRuleHeadDim));
  }
  if (Qwen3NextModel::kDeltaRuleChunkSize > kc::kMaxDeltaRuleChunkSize) {
    return absl::InternalError("the model's delta-rule chunk exceeds the GPU kernel's");
  }
  if (slot_floats < shape.conv_state_floats() + shape.delta_state_floats()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slot of ", slot_floats, " floats cannot hold one layer's state"));
  }
  std::unique_ptr<CudaGatedDeltaNet> net(
      new CudaGatedDeltaNet(shape, slot_floats, max_tokens, max_seqs, dtype, stream));
  VAMP_RETURN_IF_ERROR(net->Allocate());
  return net;
}

CudaGatedDeltaNet::CudaGatedDeltaNet(const Shape& shape, int64_t slot_floats, int64_t max_tokens,
                                     int64_t max_seqs, DType dtype, cudaStream_t stream)
    : shape_(shape),
      slot_floats_(slot_floats),
      max_tokens_(max_tokens),
      max_seqs_(max_seqs),
      dtype_(dtype),
      stream_(stream) {}

absl::Status CudaGatedDeltaNet::Allocate() {
  const int64_t T = max_tokens_, S = max_seqs_;
  DeviceCarver carver(nullptr);
  auto take = [&carver](int64_t bytes) { return carver.TakeOffset(bytes); };
  layout_.query_start_loc = take((S + 1) * 4);
  layout_.slots = take(S * 4);
  layout_.recurrent_slots = take(S * 4);
  layout_.chunked_slots = take(S * 4);
  layout_.capture_ranges = take(4 * S * 4);
  layout_.capture_slots = take(S * 4);
  layout_.has_initial = take(S);
  layout_.capture_initial = take(2 * S);
  layout_.bytes = carver.used();

  const uint64_t proj = take(T * shape_.proj_cols() * 4);
  const uint64_t conv = take(T * shape_.conv_dim() * 4);
  const uint64_t g = take(T * shape_.v_heads * 4);
  const uint64_t beta = take(T * shape_.v_heads * 4);
  const uint64_t core = take(T * shape_.value_dim() * 4);
  const uint64_t normed = take(T * shape_.value_dim() * DTypeBytes(dtype_));
  const uint64_t history = take(S * shape_.conv_state_floats() * 4);
  const uint64_t zero = take(shape_.conv_dim() * 4);
  VAMP_ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(carver.used()));
  VAMP_ASSIGN_OR_RETURN(step_host_, PinnedBuffer::Allocate(layout_.bytes));
  uint8_t* base = workspace_.data();
  step_dev_ = base;
  proj_ = reinterpret_cast<float*>(base + proj);
  conv_out_ = reinterpret_cast<float*>(base + conv);
  g_ = reinterpret_cast<float*>(base + g);
  beta_ = reinterpret_cast<float*>(base + beta);
  core_ = reinterpret_cast<float*>(base + core);
  normed_ = base + normed;
  history_ = reinterpret_cast<float*>(base + history);
  zero_row_ = reinterpret_cast<float*>(base + zero);
  VAMP_CUDART_RETURN_IF_ERROR(
      cudaMemsetAsync(zero_row_, 0, shape_.conv_dim() * sizeof(float), stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaGatedDeltaNet::ReserveSlots(int64_t num_slots) {
  VAMP_RETURN_IF_ERROR(
      slots_.Reserve(num_slots, slot_floats_ * static_cast<int64_t>(sizeof(float))));
  states_ = DeviceBuffer();  // free the old slots before allocating the new ones
  if (num_slots == 0) return absl::OkStatus();
  const uint64_t bytes = static_cast<uint64_t>(num_slots * slot_floats_) * sizeof(float);
  VAMP_ASSIGN_OR_RETURN(states_, DeviceBuffer::Allocate(bytes));
  VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(states_.data(), 0, bytes, stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaGatedDeltaNet::Restore(int32_t slot, const StateSnapshotView& from,
                                        int64_t num_tokens) {
  VAMP_RETURN_IF_ERROR(slots_.CheckRestore(slot, from, num_tokens));
  auto* to = reinterpret_cast<float*>(states_.data()) + static_cast<int64_t>(slot) * slot_floats_;
  VAMP_RETURN_IF_ERROR(SnapshotCopy(from, 0, to, slot_floats_, /*to_snapshot=*/false, stream_));
  slots_.MarkRestored(slot, num_tokens);
  return absl::OkStatus();
}

absl::Status CudaGatedDeltaNet::BeginStep(const ForwardBatch& batch) {
  const int64_t num_seqs = batch.num_seqs();
  if (num_seqs > max_seqs_ || batch.num_tokens() > max_tokens_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Gated DeltaNet step of ", batch.num_tokens(), " tokens, ", num_seqs,
                     " sequences exceeds the workspace (", max_tokens_, ", ", max_seqs_, ")"));
  }
  VAMP_RETURN_IF_ERROR(slots_.PrepareStep(batch, plan_));
  uint8_t* h = step_host_.data();
  auto ints = [h](uint64_t offset) { return reinterpret_cast<int32_t*>(h + offset); };
  std::memcpy(ints(layout_.query_start_loc), batch.query_start_loc.data(),
              (num_seqs + 1) * sizeof(int32_t));
  std::memcpy(ints(layout_.slots), batch.state_slots.data(), num_seqs * sizeof(int32_t));
  std::memcpy(h + layout_.has_initial, plan_.has_initial_state.data(), num_seqs);
  num_recurrent_ = num_chunked_ = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t len = batch.query_start_loc[i + 1] - batch.query_start_loc[i];
    const bool own_run = plan_.capture_of_seq[i] < 0 && len > 0;
    const bool recurrent = own_run && len == 1, chunked = own_run && len > 1;
    ints(layout_.recurrent_slots)[i] = recurrent ? batch.state_slots[i] : -1;
    ints(layout_.chunked_slots)[i] = chunked ? batch.state_slots[i] : -1;
    num_recurrent_ += recurrent;
    num_chunked_ += chunked;
  }
  num_captures_ = static_cast<int64_t>(batch.state_captures.size());
  for (int64_t c = 0; c < num_captures_; ++c) {
    const StateCapture& capture = batch.state_captures[c];
    const int32_t begin = batch.query_start_loc[capture.seq];
    const int32_t end = batch.query_start_loc[capture.seq + 1];
    const int32_t split = begin + capture.after_tokens;
    int32_t* range = ints(layout_.capture_ranges) + 4 * c;
    range[0] = begin;
    range[1] = split;
    range[2] = split;
    range[3] = end;
    ints(layout_.capture_slots)[c] = batch.state_slots[capture.seq];
    h[layout_.capture_initial + 2 * c] = plan_.has_initial_state[capture.seq];
    h[layout_.capture_initial + 2 * c + 1] = 1;
  }
  // The pinned area is rewritten only by the next BeginStep, after the model has synchronised
  // the stream at the end of this step.
  VAMP_CUDART_RETURN_IF_ERROR(
      cudaMemcpyAsync(step_dev_, h, layout_.bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaGatedDeltaNet::DeltaRule(bool recurrent, const int32_t* query_start_loc,
                                          int64_t num_seqs, const int32_t* state_slots,
                                          const uint8_t* has_initial, float* layer_states) {
  const int64_t key_dim = shape_.key_dim(), conv_dim = shape_.conv_dim();
  kernels::cpu::GatedDeltaRuleArgs args{
      .q = conv_out_,
      .q_stride = conv_dim,
      .k = conv_out_ + key_dim,
      .k_stride = conv_dim,
      .v = conv_out_ + 2 * key_dim,
      .v_stride = conv_dim,
      .g = g_,
      .g_stride = shape_.v_heads,
      .beta = beta_,
      .beta_stride = shape_.v_heads,
      .num_k_heads = shape_.k_heads,
      .num_v_heads = shape_.v_heads,
      .k_dim = shape_.k_dim,
      .v_dim = shape_.v_dim,
      .l2norm_qk = true,
      .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape_.k_dim))),
      .query_start_loc = query_start_loc,
      .num_seqs = num_seqs,
      .state_slots = state_slots,
      .has_initial_state = has_initial,
      .states = layer_states,
      .state_slot_stride = slot_floats_,
      .out = core_,
      .out_stride = shape_.value_dim()};
  return recurrent ? kc::GatedDeltaRuleRecurrent(args, stream_)
                   : kc::GatedDeltaRuleChunked(args, Qwen3NextModel::kDeltaRuleChunkSize, stream_);
}

absl::Status CudaGatedDeltaNet::CaptureConvState(const LayerWeights& w, const ForwardBatch& batch,
                                                 int64_t c, const float* proj) {
  const StateCapture& capture = batch.state_captures[c];
  const int64_t hist = shape_.conv_kernel - 1, conv_dim = shape_.conv_dim();
  const int64_t W = shape_.proj_cols();
  const int64_t begin = batch.query_start_loc[capture.seq];
  for (int64_t row = 0; row < hist; ++row) {
    // Input `r` of the step (r < 0: before it), as the conv numbers them.
    const int64_t r = capture.after_tokens - hist + row;
    const float* src;
    if (r >= 0) {
      src = proj + (begin + r) * W;
    } else if (plan_.has_initial_state[capture.seq] != 0) {
      src = history_ + c * shape_.conv_state_floats() + (hist + r) * conv_dim;
    } else {
      src = zero_row_;
    }
    VAMP_RETURN_IF_ERROR(SnapshotCopy(capture.to, w.state_offset + row * conv_dim,
                                      const_cast<float*>(src), conv_dim, /*to_snapshot=*/true,
                                      stream_));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaGatedDeltaNet::RunLayer(const LayerWeights& w, const ForwardBatch& batch,
                                         const T* x, T* out) {
  const int64_t n = batch.num_tokens(), H = shape_.hidden, num_seqs = batch.num_seqs();
  const int64_t W = shape_.proj_cols(), conv_dim = shape_.conv_dim();
  const int64_t value_dim = shape_.value_dim(), hist = shape_.conv_kernel - 1;
  if (n == 0) return absl::OkStatus();
  if (states_.data() == nullptr) {
    return absl::FailedPreconditionError("Gated DeltaNet without state slots (ReserveSlots)");
  }
  VAMP_RETURN_IF_ERROR(
      kc::Gemm(x, H, static_cast<const T*>(w.in_proj), H, proj_, W, n, W, H, stream_));
  float* const layer_states = reinterpret_cast<float*>(states_.data()) + w.state_offset;
  // A capture within a sequence's first K - 1 tokens reads conv inputs from before the step,
  // which the conv is about to overwrite in the slot.
  for (int64_t c = 0; c < num_captures_; ++c) {
    const StateCapture& capture = batch.state_captures[c];
    if (capture.after_tokens < hist && plan_.has_initial_state[capture.seq] != 0) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(
          history_ + c * shape_.conv_state_floats(),
          layer_states + static_cast<int64_t>(batch.state_slots[capture.seq]) * slot_floats_,
          shape_.conv_state_floats() * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  const auto* qsl = Device<const int32_t>(layout_.query_start_loc);
  VAMP_RETURN_IF_ERROR(
      kc::CausalConv1d({.x = proj_,
                        .x_stride = W,
                        .weight = w.conv,
                        .channels = conv_dim,
                        .kernel_size = shape_.conv_kernel,
                        .query_start_loc = qsl,
                        .num_seqs = num_seqs,
                        .max_num_tokens = n,
                        .state_slots = Device<const int32_t>(layout_.slots),
                        .has_initial_state = Device<const uint8_t>(layout_.has_initial),
                        .conv_states = layer_states,
                        .state_slot_stride = slot_floats_,
                        .silu = true,
                        .out = conv_out_,
                        .out_stride = conv_dim},
                       stream_));
  for (int64_t c = 0; c < num_captures_; ++c) {
    VAMP_RETURN_IF_ERROR(CaptureConvState(w, batch, c, proj_));
  }
  const float* b_proj = proj_ + conv_dim + value_dim;
  VAMP_RETURN_IF_ERROR(kc::GatedDeltaGates(b_proj + shape_.v_heads, W, b_proj, W, w.a_log,
                                           w.dt_bias, n, shape_.v_heads, g_, shape_.v_heads, beta_,
                                           shape_.v_heads, stream_));
  // Sequences without a capture: one launch per form, each skipping the other form's sequences
  // (slot -1).
  const auto* has_initial = Device<const uint8_t>(layout_.has_initial);
  if (num_recurrent_ > 0) {
    VAMP_RETURN_IF_ERROR(DeltaRule(/*recurrent=*/true, qsl, num_seqs,
                                   Device<const int32_t>(layout_.recurrent_slots), has_initial,
                                   layer_states + hist * conv_dim));
  }
  if (num_chunked_ > 0) {
    VAMP_RETURN_IF_ERROR(DeltaRule(/*recurrent=*/false, qsl, num_seqs,
                                   Device<const int32_t>(layout_.chunked_slots), has_initial,
                                   layer_states + hist * conv_dim));
  }
  // A sequence with a capture in two runs split at it, the delta-rule state copied in between.
  const int64_t delta_offset = hist * conv_dim;
  for (int64_t c = 0; c < num_captures_; ++c) {
    const StateCapture& capture = batch.state_captures[c];
    const int32_t len = batch.query_start_loc[capture.seq + 1] - batch.query_start_loc[capture.seq];
    const int32_t* ranges = Device<const int32_t>(layout_.capture_ranges) + 4 * c;
    const int32_t* slot = Device<const int32_t>(layout_.capture_slots) + c;
    const uint8_t* initial = Device<const uint8_t>(layout_.capture_initial) + 2 * c;
    VAMP_RETURN_IF_ERROR(DeltaRule(capture.after_tokens == 1, ranges, 1, slot, initial,
                                   layer_states + delta_offset));
    float* state = layer_states +
                   static_cast<int64_t>(batch.state_slots[capture.seq]) * slot_floats_ +
                   delta_offset;
    VAMP_RETURN_IF_ERROR(SnapshotCopy(capture.to, w.state_offset + delta_offset, state,
                                      shape_.delta_state_floats(), /*to_snapshot=*/true, stream_));
    const int32_t rest = len - capture.after_tokens;
    if (rest > 0) {
      VAMP_RETURN_IF_ERROR(
          DeltaRule(rest == 1, ranges + 2, 1, slot, initial + 1, layer_states + delta_offset));
    }
  }
  // The gated norm per value head (z follows the conv channels in proj), then out_proj of this
  // rank's value heads.
  T* normed = static_cast<T*>(normed_);
  VAMP_RETURN_IF_ERROR(kc::RmsNormGated(core_, value_dim, proj_ + conv_dim, W, w.norm, shape_.eps,
                                        n, shape_.v_heads, shape_.v_dim, normed, value_dim,
                                        stream_));
  return kc::Gemm(normed, value_dim, static_cast<const T*>(w.out_proj), value_dim, out, H, n, H,
                  value_dim, stream_);
}

template absl::Status CudaGatedDeltaNet::RunLayer<float>(const LayerWeights&, const ForwardBatch&,
                                                         const float*, float*);
template absl::Status CudaGatedDeltaNet::RunLayer<BFloat16>(const LayerWeights&,
                                                            const ForwardBatch&, const BFloat16*,
                                                            BFloat16*);

}  // namespace vamp
