#include "sim/step_time_model.h"

#include <algorithm>
#include <cmath>

#include "common/uniform_routing.h"

namespace vamp::sim {

double StepTimeModel::RoutedShare(int64_t tokens) const {
  return UniformRoutedShare(tokens, c_.model.top_k, c_.model.num_experts);
}

double StepTimeModel::MoeLayerMicros(int64_t tokens) const {
  if (tokens <= 0) return 0;
  const SimModelShape& m = c_.model;
  const double active = m.num_experts * RoutedShare(tokens);
  const double bytes = active * static_cast<double>(m.ExpertBytes());
  const double flops = 2.0 * static_cast<double>(tokens) * m.top_k * 3.0 * m.hidden *
                       (m.moe_intermediate / m.tp_size);
  // Whichever bound dominates: weight streaming for small batches, tensor cores for large ones.
  return 1e6 *
         std::max(bytes / c_.hardware.weight_read_bytes_per_s, flops / c_.hardware.moe_flops_per_s);
}

double StepTimeModel::DeltaRuleLayerMicros(int64_t prefill_tokens, int64_t decode_seqs) const {
  const SimModelShape& m = c_.model;
  if (m.linear_value_heads == 0) return 0;
  const HardwareCalibration& h = c_.hardware;
  return m.LinearValueHeadsPerRank() *
         (static_cast<double>(prefill_tokens) * h.delta_rule_prefill_us_per_token_head +
          static_cast<double>(decode_seqs) * h.delta_rule_decode_us_per_seq_head);
}

StepTime StepTimeModel::Estimate(const std::vector<SequenceWork>& batch,
                                 int32_t offloaded_experts_per_layer) const {
  const SimModelShape& m = c_.model;
  const HardwareCalibration& h = c_.hardware;
  StepTime t;
  int64_t tokens = 0;
  // Per KV layer, this rank. Decode rows (one new token) and prefill rows run in separate kernels
  // (split-KV decode, tensor-core prefill), one after the other, each bound by its own FLOPs or
  // KV reads; a mixed step pays both.
  double prefill_flops = 0, prefill_kv_bytes = 0, decode_flops = 0, decode_kv_bytes = 0;
  // The Gated DeltaNet layers run decode rows and prefill rows in separate kernels too.
  int64_t prefill_tokens = 0, decode_seqs = 0;
  const double q_width = static_cast<double>(m.QHeadsPerRank()) * m.head_dim;
  const double kv_bytes_per_token_layer = 2.0 * m.KvHeadsPerRank() * m.head_dim * m.dtype_bytes;
  for (const SequenceWork& s : batch) {
    tokens += s.new_tokens;
    // QK^T and PV over the cached context plus the causal half of the new tokens.
    const double keys = static_cast<double>(s.context_tokens) + 0.5 * (s.new_tokens + 1);
    const double flops = 4.0 * s.new_tokens * keys * q_width;
    const double kv =
        (static_cast<double>(s.context_tokens) + s.new_tokens) * kv_bytes_per_token_layer;
    (s.new_tokens > 1 ? prefill_flops : decode_flops) += flops;
    (s.new_tokens > 1 ? prefill_kv_bytes : decode_kv_bytes) += kv;
    if (s.new_tokens > 1) {
      prefill_tokens += s.new_tokens;
    } else if (s.new_tokens == 1) {
      ++decode_seqs;
    }
  }
  if (tokens == 0) return t;
  auto kernel_us = [&](double flops, double kv_bytes) {
    return 1e6 * std::max(flops / h.attention_flops_per_s, kv_bytes / h.kv_read_bytes_per_s);
  };
  const double attention_us =
      kernel_us(prefill_flops, prefill_kv_bytes) + kernel_us(decode_flops, decode_kv_bytes);
  // Weight streaming for small batches, tensor cores for large ones.
  auto dense_us = [&](int64_t bytes) {
    const double b = static_cast<double>(bytes);
    return 1e6 * std::max(b / h.weight_read_bytes_per_s,
                          2.0 * tokens * (b / m.dtype_bytes) / h.dense_flops_per_s);
  };
  const double kv_layer_dense_us = dense_us(m.KvLayerDenseBytes());
  const double linear_layer_dense_us = dense_us(m.LinearLayerDenseBytes());
  const double delta_rule_us = DeltaRuleLayerMicros(prefill_tokens, decode_seqs);
  const double moe_us = MoeLayerMicros(tokens);
  // Two all-reduces of the layer's activations per layer (after attention and after the MoE).
  const double allreduce_volume_us =
      h.allreduce_bytes_per_s > 0
          ? 1e6 * static_cast<double>(tokens) * m.hidden * m.dtype_bytes / h.allreduce_bytes_per_s
          : 0;
  const double tp_us = m.tp_size > 1 ? 2 * (h.allreduce_us + allreduce_volume_us) : 0;
  t.routed = staging_ == StagingMode::kRouted && tokens <= routed_max_tokens_;
  t.copy_share = t.routed || staging_ == StagingMode::kRoutedPrefetch ? RoutedShare(tokens) : 1.0;
  const double copy_per_layer_us =
      1e6 * t.copy_share * static_cast<double>(offloaded_experts_per_layer) * m.ExpertBytes() /
      (t.routed ? h.routed_h2d_bytes_per_s : h.h2d_bytes_per_s);

  double layers_us = 0;
  for (int32_t l = 0; l < m.num_layers; ++l) {
    const bool kv_layer =
        m.num_kv_layers == m.num_layers || (l % std::max(1, m.num_layers / m.num_kv_layers)) ==
                                               std::max(1, m.num_layers / m.num_kv_layers) - 1;
    // A Gated DeltaNet layer's cost does not grow with the context: its state is O(1).
    const double compute =
        h.layer_overhead_us + moe_us + tp_us +
        (kv_layer ? kv_layer_dense_us + attention_us : linear_layer_dense_us + delta_rule_us);
    t.compute_us += compute;
    if (t.routed) {
      // Layer l's routed experts are copied after its router, before its expert GEMMs; layer 0
      // (the first MoE layer) stays resident.
      const double copy = l > 0 ? copy_per_layer_us : 0;
      t.copy_us += copy;
      layers_us += compute + copy;
      continue;
    }
    // Layer l+1's offloaded experts are copied while layer l runs; layer 0 (the first MoE layer)
    // stays resident, so the copy under the last layer belongs to no one.
    const double copy_next = l + 1 < m.num_layers ? copy_per_layer_us : 0;
    t.copy_us += copy_next;
    layers_us += std::max(compute, copy_next);
  }
  const double lm_head_bytes = static_cast<double>(m.vocab / m.tp_size) * m.hidden * m.dtype_bytes;
  const double lm_head_us = 1e6 * lm_head_bytes / h.weight_read_bytes_per_s;
  t.exposed_copy_us = layers_us - t.compute_us;
  t.compute_us += lm_head_us + h.step_overhead_us;
  t.total_us = h.step_overhead_us + layers_us + lm_head_us;
  return t;
}

}  // namespace vamp::sim
