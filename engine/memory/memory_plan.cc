#include "engine/memory/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace vamp {
namespace {

std::string WithCommas(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  constexpr double kKiB = 1024.0;
  const double b = static_cast<double>(bytes);
  if (b >= kKiB * kKiB * kKiB) return absl::StrFormat("%.2f GiB", b / (kKiB * kKiB * kKiB));
  if (b >= kKiB * kKiB) return absl::StrFormat("%.1f MiB", b / (kKiB * kKiB));
  if (b >= kKiB) return absl::StrFormat("%.0f KiB", b / kKiB);
  return absl::StrCat(bytes, " B");
}

uint64_t EstimateActivationBytes(const ModelShape& shape, int tp_size,
                                 int64_t max_num_batched_tokens, int64_t max_num_seqs) {
  const int64_t h = shape.hidden_size;
  const int64_t q_width =
      shape.num_q_heads * shape.head_dim / tp_size * (shape.attention_output_gate ? 2 : 1);
  const int64_t kv_width = shape.KvHeadsPerRank(tp_size) * shape.head_dim;
  const int64_t inter = shape.moe_intermediate_size / tp_size;
  const int64_t k = shape.num_experts_per_token;
  // Per token, in the weights' dtype: hidden state, residual, normed input and layer output (4h);
  // q, k, v and the attention output (q + 2 kv + q); per selected expert its permuted input (h),
  // gate/up output (2 I), activated intermediate (I) and output (h).
  const int64_t per_token_elems = 4 * h + 2 * q_width + 2 * kv_width + k * (2 * h + 3 * inter);
  // Gated DeltaNet (engine/runner/cuda/cuda_gated_delta_net.h), float32 per token: the input
  // projection (conv channels, z, b and a), the conv output, the gates and the delta rule's
  // output; then its normed output in the weights' dtype.
  int64_t linear_bytes = 0;
  if (shape.linear_num_value_heads > 0) {
    const int64_t key_dim = shape.linear_num_key_heads / tp_size * shape.linear_key_head_dim;
    const int64_t v_heads = shape.linear_num_value_heads / tp_size;
    const int64_t value_dim = v_heads * shape.linear_value_head_dim;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    linear_bytes = 4 * ((conv_dim + value_dim + 2 * v_heads) + conv_dim + 2 * v_heads + value_dim) +
                   value_dim * shape.dtype_bytes;
  }
  const int64_t per_token_bytes =
      per_token_elems * shape.dtype_bytes + 4 * shape.num_experts + linear_bytes;
  const int64_t logits_bytes = max_num_seqs * shape.vocab_size * 4;
  return static_cast<uint64_t>(max_num_batched_tokens * per_token_bytes + logits_bytes);
}

uint64_t MemoryPlan::slack_bytes() const {
  const uint64_t used = expert_weight_bytes + other_weight_bytes + activation_bytes +
                        runtime_overhead_bytes + reserved_staging_bytes + recurrent_state_bytes +
                        static_cast<uint64_t>(kv_baseline_pages) * experts.page_bytes;
  return budget_bytes - used;
}

int64_t MemoryPlan::snapshot_blocks() const {
  if (recurrent_state_bytes_per_seq == 0 || kv.block_bytes == 0) return 0;
  return static_cast<int64_t>((recurrent_state_bytes_per_seq + kv.block_bytes - 1) /
                              kv.block_bytes);
}

absl::StatusOr<MemoryPlan> PlanMemory(const ModelShape& shape, const MemoryPlanConfig& config) {
  if (config.tp_size < 1 || config.tp_rank < 0 || config.tp_rank >= config.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("memory plan: tp_rank (", config.tp_rank,
                                                   ") must be in [0, tp_size = ", config.tp_size,
                                                   ")"));
  }
  if (!(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("memory plan: gpu_memory_utilization (",
                                                   config.gpu_memory_utilization,
                                                   ") must be in (0, 1]"));
  }
  if (config.device_memory_bytes == 0) {
    return absl::InvalidArgumentError("memory plan: device_memory_bytes must be positive");
  }
  if (config.max_num_batched_tokens < 1 || config.max_num_seqs < 1 || config.max_model_len < 0) {
    return absl::InvalidArgumentError(
        "memory plan: max_num_batched_tokens and max_num_seqs must be positive and max_model_len "
        "not negative");
  }

  MemoryPlan plan;
  plan.config = config;
  plan.model_name = shape.name;
  VAMP_ASSIGN_OR_RETURN(plan.experts, ComputeExpertGeometry(shape, config.tp_size,
                                                            config.page_bytes, config.offload));
  VAMP_ASSIGN_OR_RETURN(plan.kv,
                        ComputeKvBlockGeometry(shape, config.tp_size, config.kv_block_size));

  plan.budget_bytes = static_cast<uint64_t>(
      std::floor(config.gpu_memory_utilization * static_cast<double>(config.device_memory_bytes)));
  plan.expert_weight_bytes = static_cast<uint64_t>(plan.experts.total_pages()) * config.page_bytes;
  plan.other_weight_bytes =
      static_cast<uint64_t>(shape.NonExpertWeightBytesPerRank(config.tp_size));
  plan.activation_bytes =
      config.activation_bytes > 0
          ? config.activation_bytes
          : EstimateActivationBytes(shape, config.tp_size, config.max_num_batched_tokens,
                                    config.max_num_seqs);
  plan.runtime_overhead_bytes = config.runtime_overhead_bytes;
  plan.reserved_staging_bytes =
      static_cast<uint64_t>(plan.experts.reserved_staging_pages()) * config.page_bytes;
  plan.recurrent_state_bytes_per_seq =
      static_cast<uint64_t>(shape.RecurrentStateBytesPerSeqPerRank(config.tp_size));
  plan.recurrent_state_bytes =
      plan.recurrent_state_bytes_per_seq * static_cast<uint64_t>(config.max_num_seqs);

  const uint64_t fixed = plan.expert_weight_bytes + plan.other_weight_bytes +
                         plan.activation_bytes + plan.runtime_overhead_bytes +
                         plan.reserved_staging_bytes + plan.recurrent_state_bytes;
  const std::string budget_text =
      absl::StrFormat("the budget of %s (gpu_memory_utilization %.2f x %s device memory)",
                      FormatBytes(plan.budget_bytes), config.gpu_memory_utilization,
                      FormatBytes(config.device_memory_bytes));
  const uint64_t min_kv = std::max<uint64_t>(plan.kv.block_bytes, config.page_bytes);
  if (fixed + min_kv > plan.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory plan for ", shape.name, " (TP rank ", config.tp_rank, " of ", config.tp_size,
        "): weights ", FormatBytes(plan.expert_weight_bytes + plan.other_weight_bytes),
        " (experts ", FormatBytes(plan.expert_weight_bytes), ", other ",
        FormatBytes(plan.other_weight_bytes), ") + activations ",
        FormatBytes(plan.activation_bytes), " + staging buffers ",
        FormatBytes(plan.reserved_staging_bytes),
        plan.recurrent_state_bytes > 0
            ? absl::StrCat(" + recurrent state ", FormatBytes(plan.recurrent_state_bytes))
            : std::string(),
        " + runtime overhead ",
        FormatBytes(plan.runtime_overhead_bytes), " + at least one KV page/block ",
        FormatBytes(min_kv), " = ", FormatBytes(fixed + min_kv), " do not fit in ", budget_text,
        ": short by ", FormatBytes(fixed + min_kv - plan.budget_bytes),
        ". Use more tensor-parallel ranks, raise gpu_memory_utilization, lower "
        "max_num_batched_tokens/max_num_seqs, or lower the offload cap."));
  }
  const uint64_t kv_bytes = plan.budget_bytes - fixed;
  plan.kv_baseline_pages = static_cast<int64_t>(kv_bytes / config.page_bytes);
  plan.kv_baseline_blocks =
      plan.kv.BlocksIn(static_cast<uint64_t>(plan.kv_baseline_pages) * config.page_bytes);
  plan.kv_max_pages = plan.kv_baseline_pages + plan.experts.max_kv_offload_pages();
  plan.kv_max_blocks =
      plan.kv.BlocksIn(static_cast<uint64_t>(plan.kv_max_pages) * config.page_bytes);

  if (plan.kv_baseline_blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory plan for ", shape.name, ": the KV cache gets ",
        FormatBytes(plan.kv_baseline_pages * config.page_bytes), ", less than one block of ",
        FormatBytes(plan.kv.block_bytes), "; short by ",
        FormatBytes(plan.kv.block_bytes - plan.kv_baseline_pages * config.page_bytes)));
  }
  if (config.max_model_len > 0 && plan.kv_baseline_tokens() < config.max_model_len) {
    const int64_t blocks_needed =
        (config.max_model_len + plan.kv.block_size - 1) / plan.kv.block_size;
    return absl::ResourceExhaustedError(
        absl::StrCat("memory plan for ", shape.name, ": max_model_len ",
                     WithCommas(config.max_model_len), " needs ", WithCommas(blocks_needed),
                     " KV blocks but the KV cache holds ", WithCommas(plan.kv_baseline_blocks),
                     " blocks = ", WithCommas(plan.kv_baseline_tokens()), " tokens; short by ",
                     FormatBytes((blocks_needed - plan.kv_baseline_blocks) * plan.kv.block_bytes),
                     ". Lower max_model_len or raise gpu_memory_utilization."));
  }
  return plan;
}

std::string MemoryPlan::Summary() const {
  const ExpertGeometry& e = experts;
  std::string out = absl::StrFormat("Memory plan for %s, TP rank %d of %d, page %s:\n", model_name,
                                    config.tp_rank, config.tp_size, FormatBytes(e.page_bytes));
  absl::StrAppendFormat(&out, "  budget:           %s = %.2f x %s device memory\n",
                        FormatBytes(budget_bytes), config.gpu_memory_utilization,
                        FormatBytes(config.device_memory_bytes));
  absl::StrAppendFormat(
      &out, "  expert weights:   %s (%d MoE layers x %d experts x %s; groups of %d experts = %s)\n",
      FormatBytes(expert_weight_bytes), e.moe_layers.size(), e.num_experts,
      FormatBytes(e.expert_bytes), e.group_experts, FormatBytes(e.group_bytes));
  absl::StrAppendFormat(&out, "  other weights:    %s\n", FormatBytes(other_weight_bytes));
  absl::StrAppendFormat(&out,
                        "  activations:      %s (%d batched tokens, %d sequences) + runtime %s\n",
                        FormatBytes(activation_bytes), config.max_num_batched_tokens,
                        config.max_num_seqs, FormatBytes(runtime_overhead_bytes));
  if (e.num_staging_buffers > 0 && e.staging_carved) {
    absl::StrAppendFormat(&out,
                          "  staging buffers:  %d x up to %s (%d experts each), carved out of the "
                          "offloaded expert pages: none before the first offload\n",
                          e.num_staging_buffers, FormatBytes(e.staging_buffer_bytes()),
                          e.staging_buffer_experts);
  } else if (e.num_staging_buffers > 0) {
    absl::StrAppendFormat(&out,
                          "  staging buffers:  %d x %s (%d experts each), reserved at start-up "
                          "(the model has too few MoE layers to carve them out of offloads)\n",
                          e.num_staging_buffers,
                          FormatBytes(static_cast<uint64_t>(e.staging_buffer_pages()) *
                                      e.page_bytes),
                          e.staging_buffer_experts);
  } else {
    absl::StrAppendFormat(&out, "  staging buffers:  none (no expert can be offloaded)\n");
  }
  if (recurrent_state_bytes > 0) {
    absl::StrAppendFormat(&out,
                          "  recurrent state:  %s = %d sequences x %s (conv + delta-rule state of "
                          "the linear-attention layers); a prefix-cache snapshot of one takes %d "
                          "KV blocks\n",
                          FormatBytes(recurrent_state_bytes), config.max_num_seqs,
                          FormatBytes(recurrent_state_bytes_per_seq), snapshot_blocks());
  }
  absl::StrAppendFormat(&out, "  KV cache: %s blocks = %s tokens (%s; block %d tokens x %s)\n",
                        WithCommas(kv_baseline_blocks), WithCommas(kv_baseline_tokens()),
                        FormatBytes(static_cast<uint64_t>(kv_baseline_pages) * e.page_bytes),
                        kv.block_size, FormatBytes(kv.block_bytes));
  if (e.max_groups > 0) {
    const uint64_t extra_bytes = static_cast<uint64_t>(e.max_kv_offload_pages()) * e.page_bytes;
    absl::StrAppendFormat(
        &out,
        "  VAMP-r can add %s blocks = %s tokens (%.2fx the baseline): up to %d groups = %d of %d "
        "experts in each of %d layers, %s\n",
        WithCommas(vamp_extra_blocks()), WithCommas(vamp_extra_blocks() * kv.block_size),
        static_cast<double>(kv_max_blocks) / static_cast<double>(kv_baseline_blocks), e.max_groups,
        e.max_offload_experts, e.num_experts, e.eligible_layers.size(), FormatBytes(extra_bytes));
  } else {
    absl::StrAppendFormat(&out,
                          "  VAMP-r can add 0 blocks (offloading disabled or no whole "
                          "group fits under the cap)\n");
  }
  return out;
}

absl::StatusOr<MemoryPlan> PlanWithKvPages(const ModelShape& shape, MemoryPlanConfig config,
                                           int64_t kv_pages) {
  config.gpu_memory_utilization = 1.0;
  config.device_memory_bytes = uint64_t{1} << 40;
  VAMP_ASSIGN_OR_RETURN(const MemoryPlan big, PlanMemory(shape, config));
  const uint64_t fixed =
      big.budget_bytes - big.kv_baseline_pages * config.page_bytes - big.slack_bytes();
  config.device_memory_bytes = fixed + static_cast<uint64_t>(kv_pages) * config.page_bytes;
  return PlanMemory(shape, config);
}

}  // namespace vamp
