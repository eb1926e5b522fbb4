// The metrics sampler's parsing of controller and agent expositions and of /metrics/targets.
#include "bench/vamp_bench/metrics_sampler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::bench {
namespace {

using ::testing::ElementsAre;

TEST(MetricsSamplerTest, SampleFromControllerAndAgents) {
  absl::StatusOr<std::vector<PromSample>> controller = ParsePrometheusText(
      "vamp_kv_pool_blocks 2048\nvamp_kv_usage_ratio 0.75\nvamp_kv_offload_ratio 0.5\n"
      "vamp_experts_offloaded_groups 4\nvamp_scheduler_requests_running 8\n"
      "vamp_scheduler_requests_waiting 3\nvamp_scheduler_preemptions_total 12\n"
      "vamp_prefix_cache_query_tokens_total 1000\nvamp_prefix_cache_hit_tokens_total 900\n"
      "vamp_arbiter_decisions_total{action=\"offload\"} 5\n"
      "vamp_arbiter_decisions_total{action=\"evict\"} 7\nvamp_unrelated 1\n"
      "vamp_request_inter_token_latency_seconds_bucket{le=\"0.1\"} 4\n"
      "vamp_request_inter_token_latency_seconds_sum 0.25\n"
      "vamp_request_inter_token_latency_seconds_count 5\n");
  absl::StatusOr<std::vector<PromSample>> a0 = ParsePrometheusText(
      "vamp_agent_kv_pool_bytes{rank=\"0\"} 100\nvamp_agent_offloaded_expert_bytes 10\n"
      "vamp_agent_resident_expert_bytes 90\n");
  absl::StatusOr<std::vector<PromSample>> a1 = ParsePrometheusText(
      "vamp_agent_kv_pool_bytes{rank=\"1\"} 200\nvamp_agent_offloaded_expert_bytes 20\n");
  ASSERT_TRUE(controller.ok() && a0.ok() && a1.ok());
  MetricsSample m = SampleFromMetrics(*controller, {*a0, *a1});
  EXPECT_TRUE(m.ok);
  EXPECT_EQ(m.kv_pool_blocks, 2048);
  EXPECT_EQ(m.kv_usage_ratio, 0.75);
  EXPECT_EQ(m.kv_offload_ratio, 0.5);
  EXPECT_EQ(m.experts_offloaded_groups, 4);
  EXPECT_EQ(m.requests_running, 8);
  EXPECT_EQ(m.requests_waiting, 3);
  EXPECT_EQ(m.preemptions_total, 12);
  EXPECT_EQ(m.prefix_query_tokens_total, 1000);
  EXPECT_EQ(m.prefix_hit_tokens_total, 900);
  EXPECT_EQ(m.decisions_total.at("offload"), 5);
  EXPECT_EQ(m.decisions_total.at("evict"), 7);
  EXPECT_EQ(m.itl_sum_s, 0.25);
  EXPECT_EQ(m.itl_count, 5);
  EXPECT_EQ(m.agents_scraped, 2);
  EXPECT_EQ(m.agent_kv_pool_bytes, 300);
  EXPECT_EQ(m.agent_offloaded_expert_bytes, 30);
  EXPECT_EQ(m.agent_resident_expert_bytes, 90);
}

TEST(MetricsSamplerTest, AgentTargetsFromServiceDiscovery) {
  absl::StatusOr<std::vector<std::string>> t = AgentTargets(
      R"([{"targets":["127.0.0.1:8000"],"labels":{"vamp_role":"controller"}},
          {"targets":["127.0.0.1:9001"],"labels":{"vamp_role":"agent","rank":"0"}},
          {"targets":["10.0.0.2:9001"],"labels":{"vamp_role":"agent","rank":"1"}}])");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(*t, ElementsAre("127.0.0.1:9001", "10.0.0.2:9001"));
  EXPECT_FALSE(AgentTargets("{}").ok());
  EXPECT_FALSE(AgentTargets(R"([{"labels":{}}])").ok());
}

}  // namespace
}  // namespace vamp::bench
