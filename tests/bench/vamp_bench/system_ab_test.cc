// vamp-bench against the real system: vamp-controller spawning a CPU vamp-agent on the tiny
// checkpoint. The metrics sampler reads the live controller and its agent, and a short A/B
// (static vs VAMP) runs end to end and renders its report.
#include <filesystem>

#include "bench/vamp_bench/ab.h"
#include "bench/vamp_bench/metrics_sampler.h"
#include "bench/workload/multi_turn_generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::bench {
namespace {

using ::testing::HasSubstr;

SystemOptions TinySystem() {
  SystemOptions o;
  o.controller_binary = std::string(VAMP_BINARY_DIR) + "/controller/vamp-controller";
  o.agent_binary = std::string(VAMP_BINARY_DIR) + "/agent/vamp-agent";
  o.model_path = std::string(VAMP_TEST_DATA_DIR) + "/tiny-qwen3-moe";
  o.flags = {"--agent_host_memory_bytes=268435456", "--agent_host_page_bytes=4096",
             "--log_level=warning"};
  o.startup_timeout_s = 60;
  return o;
}

workload::Workload Small(int32_t sessions) {
  workload::MultiTurnOptions o;
  o.concurrency = sessions;
  o.turns = 3;
  o.first_turn_tokens = 48;
  o.growth_tokens = 16;
  o.output_tokens = 6;
  o.think_time_s = 0.2;
  o.vocab_size = 256;
  return *workload::GenerateMultiTurn(o);
}

TEST(SystemAbTest, SamplerReadsTheLiveControllerAndItsAgent) {
  absl::StatusOr<std::unique_ptr<RunningSystem>> sys =
      RunningSystem::Start(TinySystem(), {"--arbiter=static"});
  ASSERT_TRUE(sys.ok()) << sys.status();
  const BenchClock::time_point start = BenchClock::now();
  MetricsSample m = ScrapeOnce((*sys)->http(), {}, 5, start);
  ASSERT_TRUE(m.ok) << m.error;
  EXPECT_GT(m.kv_pool_blocks, 0);
  EXPECT_EQ(m.kv_offload_ratio, 0);

  SamplerOptions so;
  so.controller = (*sys)->http();
  so.interval_s = 0.2;
  MetricsSampler sampler(so, start);
  sampler.Start();
  ClientOptions c;
  c.endpoint = (*sys)->http();
  c.progress = false;
  absl::StatusOr<ClientRun> run = RunWorkload(Small(2), c, start);
  ASSERT_TRUE(run.ok()) << run.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sampler.Stop();
  for (const RequestRecord& r : run->records) EXPECT_TRUE(r.Completed()) << r.error;
  const std::vector<MetricsSample> samples = sampler.samples();
  ASSERT_GE(samples.size(), 2u);
  const MetricsSample& last = samples.back();
  ASSERT_TRUE(last.ok) << last.error;
  // The agent is discovered through /metrics/targets and scraped.
  EXPECT_EQ(last.agents_scraped, 1);
  EXPECT_GT(last.agent_kv_pool_bytes, 0);
  EXPECT_GT(last.agent_resident_expert_bytes, 0);
  // 6 turns; later turns re-send their history, so some prompt tokens hit the cache.
  EXPECT_GT(last.prefix_query_tokens_total, 0);
  EXPECT_GT(last.prefix_hit_tokens_total, 0);
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_GT(samples[i].t_s, samples[i - 1].t_s);
    EXPECT_GE(samples[i].prefix_query_tokens_total, samples[i - 1].prefix_query_tokens_total);
  }
  // With a pool far larger than the workload, the server's hit rate is exactly what an infinite
  // cache would give: the client re-sent each history with the tokens the server generated.
  EXPECT_NEAR(last.prefix_hit_tokens_total / last.prefix_query_tokens_total,
              workload::Summarize(Small(2), 16).ideal_prefix_hit_ratio, 1e-9);
  // The client counted the same cached tokens the server did (usage chunks).
  int64_t cached = 0;
  for (const RequestRecord& r : run->records) cached += r.cached_tokens;
  EXPECT_EQ(static_cast<double>(cached), last.prefix_hit_tokens_total);
}

TEST(SystemAbTest, ShortAbAgainstCpuAgents) {
  AbOptions o;
  o.system = TinySystem();
  o.configs = *ParseAbConfigs("static,vamp-50");
  o.sessions = {2};
  o.client.progress = false;
  o.sample_interval_s = 0.25;
  const std::string dir = ::testing::TempDir() + "/vamp-bench-ab";
  std::filesystem::create_directories(dir);
  o.log_dir = dir;
  absl::StatusOr<std::vector<RunResult>> runs =
      RunAb(o, [](int32_t n, int32_t) { return Small(n); });
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  for (const RunResult& r : *runs) {
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.stats.completed, 6) << r.config;
    EXPECT_EQ(r.stats.failed, 0);
    // First turns left out; the window ends when the first session completes, by when the
    // other has issued its turn 2 or not yet.
    EXPECT_GE(r.stats.ttft_s.count, 3);
    EXPECT_LE(r.stats.ttft_s.count, 4);
    EXPECT_EQ(r.samples.back().agents_scraped, 1);
    EXPECT_GT(r.server.samples, 0);
    // The server's TPOT (its inter-token histogram over the window) is measured too.
    EXPECT_GT(r.server.server_tpot_s, 0) << r.config;
    EXPECT_THAT(r.command, HasSubstr("--spawn_agents=1"));
  }
  EXPECT_EQ((*runs)[0].config, "static");
  EXPECT_THAT((*runs)[0].command, HasSubstr("--arbiter=static"));
  EXPECT_THAT((*runs)[1].command, HasSubstr("--max_offload_ratio=0.5"));
  ReportSpec spec;
  spec.title = "ab-test";
  spec.svg_prefix = "ab-test";
  RenderedReport report = RenderReport(spec, *runs);
  EXPECT_THAT(report.markdown, HasSubstr("| static | 2 | 1 |"));
  EXPECT_THAT(report.markdown, HasSubstr("| vamp-50 | 2 | 1 |"));
  EXPECT_THAT(report.markdown, HasSubstr("Q(T, P)"));
  EXPECT_THAT(report.markdown, HasSubstr("![TTFT p99 against concurrency](ab-test-ttft-p99.svg)"));
  EXPECT_GE(report.svgs.size(), 10u);
  EXPECT_THAT(report.json, HasSubstr("\"records\""));
}

TEST(SystemAbTest, ConfigsParse) {
  EXPECT_EQ(ParseAbConfig("static")->flags,
            (std::vector<std::string>{"--arbiter=static", "--max_offload_ratio=0"}));
  EXPECT_EQ(ParseAbConfig("paper-15")->flags,
            (std::vector<std::string>{"--arbiter=vamp", "--vamp_cost_model=paper",
                                      "--max_offload_ratio=0.15"}));
  absl::StatusOr<AbConfig> custom = ParseAbConfig("wide:--arbiter=vamp  --vamp_margin=0.5");
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->name, "wide");
  EXPECT_EQ(custom->flags.size(), 2u);
  EXPECT_FALSE(ParseAbConfig("vamp-0").ok());
  EXPECT_FALSE(ParseAbConfig("vamp-x").ok());
  EXPECT_FALSE(ParseAbConfig("bogus").ok());
  EXPECT_FALSE(ParseAbConfigs("static,static").ok());
}

}  // namespace
}  // namespace vamp::bench
