#include "controller/serving/agent_reports.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/offload_cap.h"
#include "common/status_macros.h"

namespace vamp {
namespace {

absl::Status Refuse(int rank, absl::string_view field, absl::string_view message) {
  return absl::FailedPreconditionError(
      absl::StrCat("agent rank ", rank, " reported ", field, " ", message, "; refusing it"));
}

template <typename T>
absl::Status InRange(int rank, absl::string_view field, T value, T lo, T hi) {
  if (value < lo || value > hi) {
    return Refuse(rank, field, absl::StrCat("= ", value, ", outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentReportLimits> CheckInitResponses(
    const vamp::v1::InitRequest& request, const std::vector<vamp::v1::InitResponse>& responses) {
  if (responses.empty()) return absl::InternalError("no Init answers to check");
  const int64_t block_size = std::max(1, request.memory().block_size());
  // The cap the agents were asked for bounds the groups any of them may declare offloadable.
  VAMP_ASSIGN_OR_RETURN(
      const OffloadCap cap,
      OffloadCap::FromRatio(request.memory().max_offload_ratio(), "memory.max_offload_ratio"));
  AgentReportLimits limits;
  const vamp::v1::InitResponse& first = responses.front();
  for (size_t i = 0; i < responses.size(); ++i) {
    const int rank = static_cast<int>(i);
    const vamp::v1::InitResponse& r = responses[i];
    // The model's shape: bounded, and identical on every rank (they load the same checkpoint).
    absl::Status s;
    s.Update(InRange(rank, "num_layers", r.num_layers(), 1, kMaxModelLayers));
    s.Update(InRange(rank, "num_experts", r.num_experts(), 1, kMaxModelExperts));
    // A group is as many experts as fill whole pages: it may be larger than the model's layer.
    s.Update(InRange(rank, "experts_per_group", r.experts_per_group(), 1, INT32_MAX));
    s.Update(InRange(rank, "vocab_size", r.vocab_size(), 1, kMaxModelVocab));
    s.Update(InRange(rank, "eos_token_id", r.eos_token_id(), -1, r.vocab_size() - 1));
    s.Update(
        InRange(rank, "max_position_embeddings", r.max_position_embeddings(), 0, kMaxModelContext));
    if (!s.ok()) return s;
    if (r.num_layers() != first.num_layers() || r.num_experts() != first.num_experts() ||
        r.experts_per_group() != first.experts_per_group() ||
        r.vocab_size() != first.vocab_size() || r.eos_token_id() != first.eos_token_id() ||
        r.max_position_embeddings() != first.max_position_embeddings()) {
      return Refuse(rank, "a model shape",
                    "(layers, experts, groups, vocabulary, EOS or context) unlike rank 0's");
    }
    const int32_t groups = r.num_experts() / r.experts_per_group();
    limits.groups_per_layer = groups;

    // The memory split: within what the agent declared.
    const vamp::v1::RankMemory& m = r.memory();
    const uint64_t total = m.device_total_bytes();
    s.Update(InRange<uint64_t>(rank, "memory.device_total_bytes", total, 1, kMaxAgentDeviceBytes));
    if (!s.ok()) return s;
    const uint64_t parts[] = {m.resident_expert_bytes(), m.other_weight_bytes(), m.kv_pool_bytes(),
                              m.staging_bytes(),         m.activation_bytes(),   m.page_bytes()};
    const char* names[] = {"memory.resident_expert_bytes", "memory.other_weight_bytes",
                           "memory.kv_pool_bytes",         "memory.staging_bytes",
                           "memory.activation_bytes",      "memory.page_bytes"};
    for (size_t p = 0; p < std::size(parts); ++p) {
      s.Update(InRange<uint64_t>(rank, names[p], parts[p], 0, total));
    }
    s.Update(InRange<uint64_t>(rank, "memory.offloaded_expert_bytes", m.offloaded_expert_bytes(), 0,
                               kMaxAgentDeviceBytes));
    const int32_t cap_groups = static_cast<int32_t>(
        std::min<int64_t>(groups, cap.MaxExperts(r.num_experts()) / r.experts_per_group()));
    s.Update(InRange(rank, "memory.max_offload_groups", m.max_offload_groups(), 0, cap_groups));
    s.Update(InRange(rank, "memory.offloaded_groups", m.offloaded_groups(), 0,
                     std::max(0, m.max_offload_groups())));
    if (!s.ok()) return s;
    // A KV block holds block_size tokens of K and V for every layer: at least one byte each.
    const int64_t min_block_bytes = 2 * block_size * r.num_layers();
    const int64_t max_blocks = std::min<int64_t>(
        kMaxAgentKvBlocks, static_cast<int64_t>(total / static_cast<uint64_t>(min_block_bytes)));
    if (m.kv_blocks() < 1 || m.kv_blocks() > max_blocks) {
      return Refuse(
          rank, "memory.kv_blocks",
          absl::StrCat("= ", m.kv_blocks(), ", but ", total,
                       " bytes of declared device memory hold 1 to ", max_blocks, " blocks of ",
                       block_size, " tokens over ", r.num_layers(), " layers"));
    }
    limits.max_kv_blocks.push_back(max_blocks);
    limits.device_total_bytes.push_back(total);
  }
  return limits;
}

absl::Status CheckCapacityResponse(const vamp::v1::CapacityResponse& response, int rank,
                                   const AgentReportLimits& limits) {
  if (rank < 0 || rank >= static_cast<int>(limits.max_kv_blocks.size())) {
    return absl::InternalError(absl::StrCat("capacity of unknown rank ", rank));
  }
  const int64_t max_blocks = limits.max_kv_blocks[rank];
  absl::Status s;
  s.Update(InRange<int64_t>(rank, "kv_blocks_now", response.kv_blocks_now(), 1, max_blocks));
  // What a remap would leave: zero or more (a restore may take the whole offloaded tail back).
  s.Update(InRange<int64_t>(rank, "kv_blocks_after", response.kv_blocks_after(), 0, max_blocks));
  s.Update(InRange(rank, "max_offload_groups", response.max_offload_groups(), 0,
                   limits.groups_per_layer));
  s.Update(
      InRange(rank, "offloaded_groups", response.offloaded_groups(), 0, limits.groups_per_layer));
  s.Update(InRange<uint64_t>(rank, "staged_bytes_per_group", response.staged_bytes_per_group(), 0,
                             limits.device_total_bytes[rank]));
  return s;
}

absl::Status CheckStepTimings(const vamp::v1::StepTimings& t, int rank) {
  absl::Status s;
  s.Update(InRange<int64_t>(rank, "timings.total_us", t.total_us(), 0, kMaxAgentStepMicros));
  s.Update(InRange<int64_t>(rank, "timings.forward_us", t.forward_us(), 0, kMaxAgentStepMicros));
  s.Update(InRange<int64_t>(rank, "timings.remap_us", t.remap_us(), 0, kMaxAgentStepMicros));
  s.Update(InRange<int64_t>(rank, "timings.staging_stall_us", t.staging_stall_us(), 0,
                            kMaxAgentStepMicros));
  s.Update(
      InRange<uint64_t>(rank, "timings.staged_bytes", t.staged_bytes(), 0, kMaxAgentDeviceBytes));
  return s;
}

}  // namespace vamp
