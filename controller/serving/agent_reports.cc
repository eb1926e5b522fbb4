#include "controller/serving/agent_reports.h"

#include <algorithm>
#include <climits>
#include <cmath>

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

absl::Status CheckInitResponses(const vamp::v1::InitRequest& request,
                                const std::vector<vamp::v1::InitResponse>& responses) {
  if (responses.empty()) return absl::InternalError("no Init answers to check");
  const int64_t block_size = std::max(1, request.memory().block_size());
  // The cap the agents were asked for bounds the groups any of them may declare offloadable.
  VAMP_ASSIGN_OR_RETURN(
      const OffloadCap cap,
      OffloadCap::FromRatio(request.memory().max_offload_ratio(), "memory.max_offload_ratio"));
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
        r.max_position_embeddings() != first.max_position_embeddings() ||
        (r.recurrent_state_bytes() > 0) != (first.recurrent_state_bytes() > 0) ||
        r.prefix_caching_unsupported() != first.prefix_caching_unsupported()) {
      return Refuse(rank, "a model shape",
                    "(layers, experts, groups, vocabulary, EOS, context or recurrent state) "
                    "unlike rank 0's");
    }
    const int32_t groups = r.num_experts() / r.experts_per_group();

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
    // The offload geometry: every pool it can reach fits in the device and in the block table.
    const vamp::v1::OffloadGeometry& g = r.offload();
    s.Update(InRange<uint64_t>(rank, "memory.page_bytes", m.page_bytes(), 1, total));
    s.Update(InRange<uint64_t>(rank, "offload.kv_block_bytes", g.kv_block_bytes(), 1, total));
    s.Update(InRange<uint64_t>(rank, "offload.staged_bytes_per_group", g.staged_bytes_per_group(),
                               0, total));
    s.Update(InRange<uint64_t>(rank, "recurrent_state_bytes", r.recurrent_state_bytes(), 0, total));
    if (!s.ok()) return s;
    s.Update(InRange<int64_t>(rank, "offload.kv_pages_per_group", g.kv_pages_per_group(), 0,
                              static_cast<int64_t>(total / m.page_bytes())));
    s.Update(InRange<int64_t>(rank, "memory.kv_blocks", m.kv_blocks(), 1,
                              static_cast<int64_t>(m.kv_pool_bytes() / g.kv_block_bytes())));
    if (!s.ok()) return s;
    const uint64_t group_bytes = static_cast<uint64_t>(g.kv_pages_per_group()) * m.page_bytes();
    const uint64_t remaining = static_cast<uint64_t>(m.max_offload_groups() - m.offloaded_groups());
    if (group_bytes > 0 && remaining > (total - m.kv_pool_bytes()) / group_bytes) {
      return Refuse(rank, "offload.kv_pages_per_group",
                    absl::StrCat("= ", g.kv_pages_per_group(), ": ", remaining,
                                 " more offloaded groups would map more KV than the ", total,
                                 " bytes of declared device memory"));
    }
    const uint64_t reachable = (m.kv_pool_bytes() + remaining * group_bytes) / g.kv_block_bytes();
    if (reachable > static_cast<uint64_t>(max_blocks)) {
      return Refuse(rank, "offload.kv_block_bytes",
                    absl::StrCat("= ", g.kv_block_bytes(), ": the pool would reach ", reachable,
                                 " blocks, more than the ", max_blocks, " its memory can hold"));
    }
  }
  return absl::OkStatus();
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
  // NaN passes every comparison: refused by name first.
  if (!std::isfinite(t.staged_share())) {
    s.Update(Refuse(rank, "timings.staged_share", "is not a finite number"));
  } else {
    s.Update(InRange<double>(rank, "timings.staged_share", t.staged_share(), 0.0, 1.0));
  }
  return s;
}

}  // namespace vamp
