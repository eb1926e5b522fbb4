// Samples the serving system's Prometheus metrics while vamp-bench runs: the controller's
// /metrics and, when it publishes them at /metrics/targets, every agent's, once per interval,
// stamped with the client's clock (seconds since the run's start) so they line up with the
// requests' timings.
#ifndef VAMP_BENCH_VAMP_BENCH_METRICS_SAMPLER_H_
#define VAMP_BENCH_VAMP_BENCH_METRICS_SAMPLER_H_

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/vamp_bench/client.h"
#include "bench/vamp_bench/http_client.h"
#include "bench/vamp_bench/protocol.h"

namespace vamp::bench {

// One scrape. Gauges are as read; counters are the running totals (differences of two samples
// give what happened between them). NaN for a metric the server did not export.
struct MetricsSample {
  double t_s = 0;  // client time of the scrape's start
  bool ok = false;
  std::string error;  // why not, when !ok
  // Controller (vamp_kv_*, vamp_scheduler_*, vamp_prefix_cache_*, vamp_arbiter_*).
  double kv_pool_blocks = 0;
  double kv_usage_ratio = 0;            // 0..1
  double kv_offload_ratio = 0;          // offloaded groups over the cap's groups, 0..1
  double experts_offloaded_groups = 0;  // per eligible layer
  double requests_running = 0;
  double requests_waiting = 0;
  double preemptions_total = 0;
  double prefix_query_tokens_total = 0;
  double prefix_hit_tokens_total = 0;
  double steps_total = 0;
  // The server's inter-token latency histogram (the paper's server-side TPOT): sum (s) and count.
  double itl_sum_s = 0;
  double itl_count = 0;
  std::map<std::string, double> decisions_total;  // by action
  // Agents, summed over ranks (0 agents scraped: all 0).
  int32_t agents_scraped = 0;
  double agent_kv_pool_bytes = 0;
  double agent_offloaded_expert_bytes = 0;
  double agent_resident_expert_bytes = 0;
};

// Fills a sample from parsed expositions of the controller and of the agents.
MetricsSample SampleFromMetrics(const std::vector<PromSample>& controller,
                                const std::vector<std::vector<PromSample>>& agents);

// The agents' scrape addresses ("host:port") from a /metrics/targets body (Prometheus HTTP
// service discovery JSON: [{"targets": [...], "labels": {"vamp_role": ...}}]).
absl::StatusOr<std::vector<std::string>> AgentTargets(const std::string& targets_json);

// Scrapes once: controller /metrics, then each agent in `agents`. A failed controller scrape
// gives a sample with ok = false; failed agent scrapes are left out of the sums.
MetricsSample ScrapeOnce(const HttpEndpoint& controller, const std::vector<std::string>& agents,
                         double timeout_s, BenchClock::time_point start);

struct SamplerOptions {
  HttpEndpoint controller;
  double interval_s = 1.0;
  bool scrape_agents = true;  // discover agents at /metrics/targets
  double timeout_s = 2.0;     // per scrape
};

// A thread scraping every interval from Start() to Stop(); Stop() takes one last sample.
class MetricsSampler {
 public:
  MetricsSampler(SamplerOptions options, BenchClock::time_point start);
  ~MetricsSampler();  // stops
  void Start();
  void Stop();
  std::vector<MetricsSample> samples() const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest successful sample; ok = false when none yet.
  MetricsSample Latest() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const SamplerOptions options_;
  const BenchClock::time_point start_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<MetricsSample> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_METRICS_SAMPLER_H_
