// The agent's Prometheus metrics (names vamp_agent_<name>_<unit>, base units):
//
//   vamp_agent_info{version,device}              1
//   vamp_agent_initialized                       1 after a successful Init
//   vamp_agent_resident_expert_bytes             expert weights mapped in the expert regions
//   vamp_agent_offloaded_expert_bytes            expert weights living only in pinned host copies
//   vamp_agent_offloaded_groups                  expert groups offloaded per eligible layer
//   vamp_agent_max_offload_groups                the cap (VAMP-r)
//   vamp_agent_other_weight_bytes                attention, embeddings, norms, LM head
//   vamp_agent_kv_pool_bytes                     mapped KV region
//   vamp_agent_kv_pool_blocks                    KV blocks in use by the controller's pool
//   vamp_agent_staging_buffer_bytes              staging buffers (all of them), mapped now
//   vamp_agent_step_duration_seconds             histogram: a step, remaps included
//   vamp_agent_staging_stall_seconds             histogram: per step, time compute waited for
//                                                expert copies (the staging not hidden)
//   vamp_agent_staged_bytes_total                expert bytes copied host -> device
//   vamp_agent_remap_duration_seconds{action}    histogram: one offload or restore
//   vamp_agent_remaps_total{action,result}       remaps (and rollbacks) by outcome
//   vamp_agent_steps_total, vamp_agent_step_errors_total, vamp_agent_sampled_tokens_total
//
// Thread-safe (prometheus-cpp metrics are).
#ifndef VAMP_AGENT_AGENT_METRICS_H_
#define VAMP_AGENT_AGENT_METRICS_H_

#include <cstdint>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "vamp/v1/common.pb.h"

namespace vamp {

class AgentMetrics {
 public:
  // Adds the families to `registry` (which must outlive this object).
  AgentMetrics(prometheus::Registry& registry, const std::string& device);

  void SetInitialized(bool initialized);
  // The memory gauges from a rank's memory split.
  void SetMemory(const vamp::v1::RankMemory& memory);
  void ObserveStep(double seconds, double staging_stall_seconds, uint64_t staged_bytes,
                   int64_t sampled_tokens, bool failed);
  // `action`: "offload" | "restore"; `result`: "ok" | "error" | "rollback".
  void ObserveRemap(const std::string& action, const std::string& result, double seconds);

 private:
  prometheus::Gauge& initialized_;
  prometheus::Gauge& resident_expert_bytes_;
  prometheus::Gauge& offloaded_expert_bytes_;
  prometheus::Gauge& offloaded_groups_;
  prometheus::Gauge& max_offload_groups_;
  prometheus::Gauge& other_weight_bytes_;
  prometheus::Gauge& kv_pool_bytes_;
  prometheus::Gauge& kv_pool_blocks_;
  prometheus::Gauge& staging_buffer_bytes_;
  prometheus::Histogram& step_seconds_;
  prometheus::Histogram& stall_seconds_;
  prometheus::Counter& staged_bytes_;
  prometheus::Counter& steps_;
  prometheus::Counter& step_errors_;
  prometheus::Counter& sampled_tokens_;
  prometheus::Family<prometheus::Histogram>& remap_seconds_;
  prometheus::Family<prometheus::Counter>& remaps_;
};

}  // namespace vamp

#endif  // VAMP_AGENT_AGENT_METRICS_H_
