#include "bench/vamp_bench/metrics_sampler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {

MetricsSample SampleFromMetrics(const std::vector<PromSample>& controller,
                                const std::vector<std::vector<PromSample>>& agents) {
  MetricsSample m;
  m.ok = true;
  const std::map<std::string, double MetricsSample::*> gauges = {
      {"vamp_kv_pool_blocks", &MetricsSample::kv_pool_blocks},
      {"vamp_kv_usage_ratio", &MetricsSample::kv_usage_ratio},
      {"vamp_kv_offload_ratio", &MetricsSample::kv_offload_ratio},
      {"vamp_experts_offloaded_groups", &MetricsSample::experts_offloaded_groups},
      {"vamp_scheduler_requests_running", &MetricsSample::requests_running},
      {"vamp_scheduler_requests_waiting", &MetricsSample::requests_waiting},
      {"vamp_scheduler_preemptions_total", &MetricsSample::preemptions_total},
      {"vamp_prefix_cache_query_tokens_total", &MetricsSample::prefix_query_tokens_total},
      {"vamp_prefix_cache_hit_tokens_total", &MetricsSample::prefix_hit_tokens_total},
      {"vamp_scheduler_steps_total", &MetricsSample::steps_total},
      {"vamp_request_inter_token_latency_seconds_sum", &MetricsSample::itl_sum_s},
      {"vamp_request_inter_token_latency_seconds_count", &MetricsSample::itl_count},
  };
  for (const PromSample& s : controller) {
    if (auto it = gauges.find(s.name); it != gauges.end()) {
      m.*(it->second) = s.value;
    } else if (s.name == "vamp_arbiter_decisions_total") {
      auto a = s.labels.find("action");
      m.decisions_total[a == s.labels.end() ? "" : a->second] += s.value;
    }
  }
  for (const std::vector<PromSample>& agent : agents) {
    ++m.agents_scraped;
    for (const PromSample& s : agent) {
      if (s.name == "vamp_agent_kv_pool_bytes") m.agent_kv_pool_bytes += s.value;
      if (s.name == "vamp_agent_offloaded_expert_bytes") m.agent_offloaded_expert_bytes += s.value;
      if (s.name == "vamp_agent_resident_expert_bytes") m.agent_resident_expert_bytes += s.value;
    }
  }
  return m;
}

absl::StatusOr<std::vector<std::string>> AgentTargets(const std::string& targets_json) {
  using Json = nlohmann::json;
  Json j = Json::parse(targets_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::InvalidArgumentError("/metrics/targets is not a JSON array of target groups");
  }
  std::vector<std::string> out;
  for (const Json& group : j) {
    if (!group.is_object() || !group.contains("targets") || !group["targets"].is_array()) {
      return absl::InvalidArgumentError("/metrics/targets has a group without 'targets'");
    }
    const bool agent = group.contains("labels") && group["labels"].is_object() &&
                       group["labels"].value("vamp_role", "") == "agent";
    if (!agent) continue;
    for (const Json& t : group["targets"]) {
      if (t.is_string()) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

MetricsSample ScrapeOnce(const HttpEndpoint& controller, const std::vector<std::string>& agents,
                         double timeout_s, BenchClock::time_point start) {
  const double t = SecondsSince(start);
  auto failed = [&](std::string why) {
    MetricsSample m;
    m.t_s = t;
    m.error = std::move(why);
    return m;
  };
  absl::StatusOr<HttpResponse> r = HttpGet(controller, "/metrics", timeout_s);
  if (!r.ok()) return failed(std::string(r.status().message()));
  if (r->status != 200) return failed(absl::StrCat("/metrics answered HTTP ", r->status));
  absl::StatusOr<std::vector<PromSample>> parsed = ParsePrometheusText(r->body);
  if (!parsed.ok()) return failed(std::string(parsed.status().message()));
  std::vector<std::vector<PromSample>> agent_samples;
  for (const std::string& address : agents) {
    absl::StatusOr<HttpEndpoint> e = ParseHostPort(address, "agent metrics target");
    if (!e.ok()) continue;
    e->api_key = controller.api_key;
    absl::StatusOr<HttpResponse> a = HttpGet(*e, "/metrics", timeout_s);
    if (!a.ok() || a->status != 200) continue;
    absl::StatusOr<std::vector<PromSample>> p = ParsePrometheusText(a->body);
    if (p.ok()) agent_samples.push_back(*std::move(p));
  }
  MetricsSample m = SampleFromMetrics(*parsed, agent_samples);
  m.t_s = t;
  return m;
}

MetricsSampler::MetricsSampler(SamplerOptions options, BenchClock::time_point start)
    : options_(std::move(options)), start_(start) {}

MetricsSampler::~MetricsSampler() { Stop(); }

void MetricsSampler::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void MetricsSampler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<MetricsSample> MetricsSampler::samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

MetricsSample MetricsSampler::Latest() const {
  absl::MutexLock lock(&mu_);
  for (auto it = samples_.rbegin(); it != samples_.rend(); ++it) {
    if (it->ok) return *it;
  }
  return MetricsSample{};
}

void MetricsSampler::Loop() {
  std::vector<std::string> agents;
  bool discovered = !options_.scrape_agents;
  int64_t tick = 0;
  const double first = SecondsSince(start_);
  bool last = false;
  while (true) {
    if (!discovered) {
      absl::StatusOr<HttpResponse> t =
          HttpGet(options_.controller, "/metrics/targets", options_.timeout_s);
      if (t.ok() && t->status == 200) {
        absl::StatusOr<std::vector<std::string>> a = AgentTargets(t->body);
        if (a.ok()) {
          agents = *std::move(a);
          discovered = true;
        }
      } else if (t.ok()) {
        discovered = true;  // no service discovery on this server: controller only
      }
    }
    MetricsSample m = ScrapeOnce(options_.controller, agents, options_.timeout_s, start_);
    ++tick;
    absl::MutexLock lock(&mu_);
    samples_.push_back(std::move(m));
    if (last) return;
    // Sleep until the next tick on the client's clock, so samples stay one interval apart.
    const double next = first + static_cast<double>(tick) * options_.interval_s;
    const double wait = std::max(0.0, next - SecondsSince(start_));
    // Stopped: one last sample, so the end of the run is covered.
    last = mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(wait));
  }
}

}  // namespace vamp::bench
