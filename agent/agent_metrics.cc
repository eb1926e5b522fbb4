#include "agent/agent_metrics.h"

#include "common/metrics.h"
#include "common/version.h"

namespace vamp {
namespace {

prometheus::Gauge& Gauge(prometheus::Registry& registry, const std::string& name,
                         const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter& Counter(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

AgentMetrics::AgentMetrics(prometheus::Registry& registry, const std::string& device)
    : initialized_(Gauge(registry, "vamp_agent_initialized",
                         "1 when the agent holds an initialised model (Init succeeded)")),
      resident_expert_bytes_(Gauge(registry, "vamp_agent_resident_expert_bytes",
                                   "Expert weight bytes mapped in the expert regions")),
      offloaded_expert_bytes_(
          Gauge(registry, "vamp_agent_offloaded_expert_bytes",
                "Expert weight bytes offloaded to pinned host memory (their pages serve KV)")),
      offloaded_groups_(Gauge(registry, "vamp_agent_offloaded_groups",
                              "Expert groups offloaded in every eligible layer")),
      max_offload_groups_(Gauge(registry, "vamp_agent_max_offload_groups",
                                "Most expert groups that may be offloaded (the VAMP-r cap)")),
      other_weight_bytes_(Gauge(registry, "vamp_agent_other_weight_bytes",
                                "Non-expert weight bytes (attention, embeddings, norms, LM head)")),
      kv_pool_bytes_(Gauge(registry, "vamp_agent_kv_pool_bytes", "Mapped bytes of the KV region")),
      kv_pool_blocks_(Gauge(registry, "vamp_agent_kv_pool_blocks",
                            "KV blocks the controller's pool uses on this rank")),
      staging_buffer_bytes_(Gauge(registry, "vamp_agent_staging_buffer_bytes",
                                  "Bytes of the expert staging buffers")),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("vamp_agent_step_duration_seconds")
                        .Help("Time to apply one StepRequest: remaps, diffs, forward pass and "
                              "sampling")
                        .Register(registry)
                        .Add({}, LatencyBucketsSeconds())),
      stall_seconds_(prometheus::BuildHistogram()
                         .Name("vamp_agent_staging_stall_seconds")
                         .Help("Per step: time the forward pass waited for offloaded experts to "
                               "be staged (copy time not hidden behind compute)")
                         .Register(registry)
                         .Add({}, LatencyBucketsSeconds())),
      staged_bytes_(Counter(registry, "vamp_agent_staged_bytes_total",
                            "Offloaded expert bytes copied into staging buffers")),
      steps_(Counter(registry, "vamp_agent_steps_total", "StepRequests processed")),
      step_errors_(Counter(registry, "vamp_agent_step_errors_total",
                           "StepRequests answered with an error_message")),
      sampled_tokens_(Counter(registry, "vamp_agent_sampled_tokens_total", "Tokens sampled")),
      remap_seconds_(prometheus::BuildHistogram()
                         .Name("vamp_agent_remap_duration_seconds")
                         .Help("Time of one expert <-> KV remap on this rank")
                         .Register(registry)),
      remaps_(prometheus::BuildCounter()
                  .Name("vamp_agent_remaps_total")
                  .Help("Remaps by action and result (ok, error, rollback)")
                  .Register(registry)) {
  prometheus::BuildGauge()
      .Name("vamp_agent_info")
      .Help("Build and device of this agent")
      .Register(registry)
      .Add({{"version", kVersion}, {"device", device}})
      .Set(1);
  // Every remap series exists from the start at zero: increase() (the remap-failure alert) sees
  // the first failure, and the families are in the exposition before any remap.
  for (const char* action : {"offload", "restore"}) {
    remap_seconds_.Add({{"action", action}}, LatencyBucketsSeconds());
    for (const char* result : {"ok", "error", "rollback"}) {
      remaps_.Add({{"action", action}, {"result", result}});
    }
  }
}

void AgentMetrics::SetInitialized(bool initialized) { initialized_.Set(initialized ? 1 : 0); }

void AgentMetrics::SetMemory(const vamp::v1::RankMemory& m) {
  resident_expert_bytes_.Set(static_cast<double>(m.resident_expert_bytes()));
  offloaded_expert_bytes_.Set(static_cast<double>(m.offloaded_expert_bytes()));
  offloaded_groups_.Set(m.offloaded_groups());
  max_offload_groups_.Set(m.max_offload_groups());
  other_weight_bytes_.Set(static_cast<double>(m.other_weight_bytes()));
  kv_pool_bytes_.Set(static_cast<double>(m.kv_pool_bytes()));
  kv_pool_blocks_.Set(static_cast<double>(m.kv_blocks()));
  staging_buffer_bytes_.Set(static_cast<double>(m.staging_bytes()));
}

void AgentMetrics::ObserveStep(double seconds, double staging_stall_seconds, uint64_t staged_bytes,
                               int64_t sampled_tokens, bool failed) {
  steps_.Increment();
  if (failed) step_errors_.Increment();
  step_seconds_.Observe(seconds);
  stall_seconds_.Observe(staging_stall_seconds);
  staged_bytes_.Increment(static_cast<double>(staged_bytes));
  sampled_tokens_.Increment(static_cast<double>(sampled_tokens));
}

void AgentMetrics::ObserveRemap(const std::string& action, const std::string& result,
                                double seconds) {
  remaps_.Add({{"action", action}, {"result", result}}).Increment();
  if (result == "ok")
    remap_seconds_.Add({{"action", action}}, LatencyBucketsSeconds()).Observe(seconds);
}

}  // namespace vamp
