// vamp-sim's flags: defaults come from SimConfig (vamp-sim's own where they differ from the
// libraries'), every flag lands in its typed field, and bad lists are refused naming the flag.
#include "sim/sim_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<SimConfig> Bind(std::vector<std::string> flags) {
  std::vector<const char*> argv = {"vamp-sim"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  absl::StatusOr<CommandLine> cli =
      ParseCommandLine(SimConfigSchema(), static_cast<int>(argv.size()), argv.data());
  if (!cli.ok()) return cli.status();
  return SimConfigFromConfig(cli->config);
}

TEST(SimConfigTest, DefaultsAreSimConfigs) {
  absl::StatusOr<SimConfig> c = Bind({});
  ASSERT_TRUE(c.ok()) << c.status();
  const SimConfig d;
  EXPECT_EQ(c->workload, "multi-turn");
  EXPECT_EQ(c->concurrencies, d.concurrencies);
  EXPECT_EQ(c->sim.scheduler.max_num_seqs, 128);
  EXPECT_EQ(c->sim.scheduler.max_model_len, d.sim.scheduler.max_model_len);
  EXPECT_EQ(c->sim.scheduler.block_size, SchedulerConfig{}.block_size);
  EXPECT_EQ(c->sim.offload.base_kv_bytes, OffloadOptions{}.base_kv_bytes);
  EXPECT_EQ(c->sim.offload.page_bytes, OffloadOptions{}.page_bytes);
  EXPECT_EQ(c->multi_turn.growth_tokens, 6144);
  EXPECT_EQ(c->low_reuse.num_requests, workload::LowReuseOptions{}.num_requests);
  EXPECT_EQ(c->lmcache.stagger_s, workload::LmcacheOptions{}.stagger_s);
  EXPECT_EQ(c->sim.remap.per_group_layer_micros, RemapCosts{}.per_group_layer_micros);
  ASSERT_EQ(c->policies.size(), 5u);
  EXPECT_EQ(c->policies[0].label, "static");
  EXPECT_TRUE(c->sim.exclude_first_turn) << "auto: yes for multi-turn";
  // Vocabulary and h2d bandwidth come from the calibration.
  EXPECT_EQ(c->multi_turn.vocab_size, c->sim.calibration.model.vocab);
  EXPECT_EQ(c->sim.remap.h2d_bytes_per_s, c->sim.calibration.hardware.h2d_bytes_per_s);
  EXPECT_EQ(c->sim.staging, StagingMode::kRouted) << "this engine's staging";
  EXPECT_EQ(c->sim.routed_staging_max_tokens, 16) << "the agent's default";
}

TEST(SimConfigTest, EveryFlagLandsInItsField) {
  absl::StatusOr<SimConfig> c =
      Bind({"--workload=low-reuse", "--policies=static,vamp-25", "--kv_pool_gib=2",
            "--page_mib=4", "--block_size=32", "--max_num_seqs=64", "--workload_seed=5",
            "--low_reuse_requests=10", "--threads=3", "--no-progress", "--report=/tmp/x.md",
            "--decision_log_entries=9", "--max_time_s=60", "--staging=routed",
            "--routed_staging_max_tokens=24"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->workload, "low-reuse");
  ASSERT_EQ(c->policies.size(), 2u);
  EXPECT_DOUBLE_EQ(c->policies[1].offload_cap.ratio(), 0.25);
  EXPECT_EQ(c->sim.offload.base_kv_bytes, int64_t{2} << 30);
  EXPECT_EQ(c->sim.offload.page_bytes, int64_t{4} << 20);
  EXPECT_EQ(c->sim.scheduler.block_size, 32);
  EXPECT_EQ(c->sim.scheduler.max_num_seqs, 64);
  EXPECT_EQ(c->multi_turn.seed, 5u);
  EXPECT_EQ(c->low_reuse.seed, 5u + 7919) << "text of its own";
  EXPECT_EQ(c->low_reuse.num_requests, 10);
  EXPECT_EQ(c->threads, 3);
  EXPECT_FALSE(c->progress);
  EXPECT_EQ(c->report, "/tmp/x.md");
  EXPECT_EQ(c->sim.decision_log_capacity, 9u);
  EXPECT_EQ(c->sim.max_time_s, 60);
  EXPECT_EQ(c->sim.staging, StagingMode::kRouted);
  EXPECT_EQ(c->sim.routed_staging_max_tokens, 24);
  absl::StatusOr<SimConfig> prefetch = Bind({"--staging=routed_prefetch"});
  ASSERT_TRUE(prefetch.ok()) << prefetch.status();
  EXPECT_EQ(prefetch->sim.staging, StagingMode::kRoutedPrefetch);
  EXPECT_FALSE(c->sim.exclude_first_turn) << "auto: no for low-reuse";
  EXPECT_TRUE(c->concurrencies.empty()) << "only multi-turn sweeps";
}

TEST(SimConfigTest, BadListsAreRefusedNamingTheFlag) {
  absl::StatusOr<SimConfig> bad = Bind({"--concurrency=4,x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'concurrency'"));
  absl::StatusOr<SimConfig> empty = Bind({"--policies=,"});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("'policies'"));
  absl::StatusOr<SimConfig> staging = Bind({"--staging=some"});
  ASSERT_FALSE(staging.ok());
  EXPECT_THAT(std::string(staging.status().message()), HasSubstr("'staging'"));
  absl::StatusOr<SimConfig> sweep = Bind({"--concurrency=2,4"});
  ASSERT_TRUE(sweep.ok());
  EXPECT_THAT(sweep->concurrencies, ElementsAre(2, 4));
}

}  // namespace
}  // namespace vamp::sim
