// vamp-controller's options: the schema's defaults are the options' defaults (one default per
// option), every flag lands in its typed field, and values the ranges cannot catch are refused
// naming the field.
#include "controller/server/controller_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<ControllerOptions> Options(std::vector<std::string> flags) {
  std::vector<const char*> argv = {"vamp-controller"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  absl::StatusOr<CommandLine> cli =
      ParseCommandLine(ControllerConfigSchema(), static_cast<int>(argv.size()), argv.data());
  if (!cli.ok()) return cli.status();
  return ControllerOptionsFromConfig(cli->config);
}

TEST(ControllerConfigTest, TheFlagsDefaultsAreTheOptionsDefaults) {
  absl::StatusOr<ControllerOptions> bound = Options({});
  ASSERT_TRUE(bound.ok()) << bound.status();
  const ControllerOptions d;
  EXPECT_EQ(bound->grpc_address, d.grpc_address);
  EXPECT_EQ(bound->admin_address, d.admin_address);
  EXPECT_EQ(bound->metrics_address, d.metrics_address);
  EXPECT_EQ(bound->http.server.address, d.http.server.address);
  EXPECT_EQ(bound->http.server.threads, d.http.server.threads);
  EXPECT_EQ(bound->http.server.max_body_bytes, d.http.server.max_body_bytes);
  EXPECT_EQ(bound->http.server.max_header_bytes, d.http.server.max_header_bytes);
  EXPECT_EQ(bound->http.server.header_timeout_s, d.http.server.header_timeout_s);
  EXPECT_EQ(bound->http.server.write_timeout_s, d.http.server.write_timeout_s);
  EXPECT_EQ(bound->http.server.max_connections, d.http.server.max_connections);
  EXPECT_EQ(bound->http.request_timeout_s, d.http.request_timeout_s);
  EXPECT_EQ(bound->http.limits.max_n, d.http.limits.max_n);
  EXPECT_EQ(bound->http.limits.max_batch_prompts, d.http.limits.max_batch_prompts);
  EXPECT_EQ(bound->metrics_targets_file, d.metrics_targets_file);
  EXPECT_EQ(bound->arbiter, ServingEngineOptions{}.arbiter);
  EXPECT_EQ(bound->step_timeout_s * 1000, AgentGroupOptions{}.step_timeout_ms);
  EXPECT_EQ(bound->offload_cap, d.offload_cap);
  EXPECT_EQ(bound->load_format, d.load_format);
  EXPECT_EQ(bound->log.level, LogOptions{}.level);
  EXPECT_EQ(bound->scheduler.max_num_seqs, SchedulerConfig{}.max_num_seqs);
  EXPECT_EQ(bound->vamp.restore.enabled, VampArbiterConfig{}.restore.enabled);
}

TEST(ControllerConfigTest, EveryFlagLandsInItsField) {
  absl::StatusOr<ControllerOptions> o = Options(
      {"--http_address=0.0.0.0:9", "--http_threads=7", "--request_timeout_s=3", "--max_n=5",
       "--spawn_agents=2", "--agent_device=cuda", "--arbiter=static", "--step_timeout_s=2.5",
       "--tls_cert_file=/c.pem", "--tls_key_file=/k.pem", "--log_level=debug", "--log_format=json",
       "--ready_file=/tmp/r.json", "--max_num_seqs=9", "--no-vamp_restore", "--served_model_name=m",
       "--replica=r1", "--max_batch_prompts=12", "--metrics_targets_file=/tmp/t.json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->http.server.address, "0.0.0.0:9");
  EXPECT_EQ(o->http.server.threads, 7);
  EXPECT_EQ(o->http.request_timeout_s, 3);
  EXPECT_EQ(o->http.limits.max_n, 5);
  EXPECT_EQ(o->spawn_agents, 2);
  EXPECT_EQ(o->agent_device, "cuda");
  EXPECT_EQ(o->arbiter, "static");
  EXPECT_EQ(o->step_timeout_s, 2.5);
  EXPECT_EQ(o->http.server.tls_cert_file, "/c.pem");
  EXPECT_EQ(o->http.server.tls_key_file, "/k.pem");
  EXPECT_EQ(o->log.level, "debug");
  EXPECT_EQ(o->log.format, "json");
  EXPECT_EQ(o->ready_file, "/tmp/r.json");
  EXPECT_EQ(o->scheduler.max_num_seqs, 9);
  EXPECT_FALSE(o->vamp.restore.enabled);
  EXPECT_EQ(o->served_model_name, "m");
  EXPECT_EQ(o->replica, "r1");
  EXPECT_EQ(o->http.limits.max_batch_prompts, 12);
  EXPECT_EQ(o->metrics_targets_file, "/tmp/t.json");
}

TEST(ControllerConfigTest, ValuesTheRangesCannotCatchAreRefusedByName) {
  absl::StatusOr<ControllerOptions> key = Options({"--prefix_cache_hash_key=xyz"});
  ASSERT_FALSE(key.ok());
  EXPECT_THAT(std::string(key.status().message()), HasSubstr("prefix_cache_hash_key"));
  // Every request may ask for max_n choices of one prompt, so the choices bound covers them.
  absl::StatusOr<ControllerOptions> batch = Options({"--max_n=16", "--max_batch_prompts=8"});
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("'max_batch_prompts' (8)"));
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("at least max_n (16)"));
}

}  // namespace
}  // namespace vamp
