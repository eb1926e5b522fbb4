#include "bench/engine/gpu_step_floors.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/uniform_routing.h"

namespace vamp::gpu_step_bench {

DecodeFloor ComputeDecodeFloor(const Flags& f, const GpuEngine& e, double hbm_gbps) {
  const ModelConfig& c = e.rank->config;
  const double dtype = 2.0;  // bfloat16
  DecodeFloor d;
  d.model_type = c.model_type;
  d.tokens = f.batch;
  d.expected_experts_per_layer = static_cast<double>(c.num_experts) *
                                 UniformRoutedShare(d.tokens, c.num_experts_per_tok, c.num_experts);
  // Every non-expert weight on the device, but only the batch's rows of an untied embedding.
  const double embed = static_cast<double>(c.vocab_size * c.hidden_size) * dtype;
  d.non_expert_bytes = static_cast<double>(e.model->weight_bytes());
  if (!c.tie_word_embeddings) {
    d.non_expert_bytes += static_cast<double>(d.tokens * c.hidden_size) * dtype - embed;
  }
  d.expert_bytes = d.expected_experts_per_layer *
                   static_cast<double>(e.rank->plan.experts.expert_bytes) *
                   static_cast<double>(e.rank->plan.experts.moe_layers.size());
  // K and V of every attention layer over the mean context of the timed steps.
  const double mean_context =
      static_cast<double>(f.context + f.warmup) + static_cast<double>(f.steps + 1) / 2.0;
  d.kv_bytes = static_cast<double>(f.batch) * mean_context *
               static_cast<double>(e.rank->plan.kv.attention_layers.size()) * 2.0 *
               static_cast<double>(e.model->kv_heads_per_rank() * c.head_dim) * dtype;
  d.state_bytes = 2.0 * static_cast<double>(f.batch) *
                  static_cast<double>(e.rank->plan.recurrent_state_bytes_per_seq);
  d.total_bytes = d.non_expert_bytes + d.expert_bytes + d.kv_bytes + d.state_bytes;
  d.ms = d.total_bytes / (hbm_gbps * 1e6);
  d.estimate = absl::StrFormat(
      "uniform routing: E(1-(1-k/E)^T) = %.1f distinct experts per MoE layer for T = %d tokens, "
      "k = %d, E = %d; KV at the timed steps' mean context %.1f",
      d.expected_experts_per_layer, d.tokens, c.num_experts_per_tok, c.num_experts, mean_context);
  return d;
}

absl::Status ApplyStagingFloors(const Bandwidths& bw, std::vector<PointResult>* points_out) {
  std::vector<PointResult>& points = *points_out;
  for (PointResult& p : points) {
    const PointResult* resident = nullptr;
    for (const PointResult& q : points) {
      if (q.mode == p.mode && q.groups == 0) {
        resident = &q;
        break;
      }
    }
    if (resident == nullptr) return absl::InternalError("no resident point");
    const double copy_ms = p.staged_bytes_per_step / (bw.h2d_peak_gbps * 1e6);
    p.floor_ms = std::max(resident->forward_ms.p50, copy_ms);
    p.forward_over_floor = p.forward_ms.p50 / p.floor_ms;
    p.step_over_floor =
        p.step_ms.p50 / (p.floor_ms + (resident->step_ms.p50 - resident->forward_ms.p50));
    p.staging_gbps_lower_bound =
        p.staged_bytes_per_step > 0 ? p.staged_bytes_per_step / (p.forward_ms.p50 * 1e6) : 0;
    p.forward_overhead_pct = 100.0 * (p.forward_ms.p50 / resident->forward_ms.p50 - 1.0);
    p.step_overhead_pct = 100.0 * (p.step_ms.p50 / resident->step_ms.p50 - 1.0);
  }
  return absl::OkStatus();
}

}  // namespace vamp::gpu_step_bench
