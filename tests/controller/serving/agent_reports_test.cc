// The controller's checks of what agents report (controller/serving/agent_reports.h).
#include "controller/serving/agent_reports.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

vamp::v1::InitRequest Request() {
  vamp::v1::InitRequest r;
  r.mutable_memory()->set_block_size(16);
  r.mutable_memory()->set_max_offload_ratio(0.75);  // 6 of 8 experts: 3 groups of 2
  return r;
}

// What an honest agent on 1 GiB serving a small model says.
vamp::v1::InitResponse Honest() {
  vamp::v1::InitResponse r;
  r.set_num_layers(4);
  r.set_num_experts(8);
  r.set_experts_per_group(2);
  r.set_vocab_size(256);
  r.set_eos_token_id(1);
  r.set_max_position_embeddings(2048);
  vamp::v1::RankMemory& m = *r.mutable_memory();
  m.set_device("cpu");
  m.set_device_total_bytes(uint64_t{1} << 30);
  m.set_page_bytes(4096);
  m.set_resident_expert_bytes(100 << 20);
  m.set_other_weight_bytes(10 << 20);
  m.set_kv_pool_bytes(500 << 20);
  m.set_kv_blocks(1000);
  m.set_max_offload_groups(3);
  vamp::v1::OffloadGeometry& g = *r.mutable_offload();
  g.set_kv_block_bytes(500 << 10);  // 1000 blocks in the 500 MiB pool
  g.set_kv_pages_per_group(256);    // 1 MiB of KV per offloaded group
  g.set_staged_bytes_per_group(3 << 20);
  return r;
}

TEST(AgentReportsTest, HonestInitPasses) {
  absl::Status s = CheckInitResponses(Request(), {Honest(), Honest()});
  EXPECT_TRUE(s.ok()) << s;
}

// Regression: kv_blocks = 2^31 - 1 from one agent ended in std::bad_alloc in the controller.
TEST(AgentReportsTest, LiesRefuseTheAgentNamingRankAndField) {
  struct Case {
    const char* name;
    std::function<void(vamp::v1::InitResponse*)> lie;
    const char* field;
  };
  const Case cases[] = {
      {"kv_blocks", [](auto* r) { r->mutable_memory()->set_kv_blocks(2147483647); },
       "memory.kv_blocks"},
      {"no blocks", [](auto* r) { r->mutable_memory()->set_kv_blocks(0); }, "memory.kv_blocks"},
      {"memory", [](auto* r) { r->mutable_memory()->set_device_total_bytes(uint64_t{1} << 62); },
       "memory.device_total_bytes"},
      {"kv pool", [](auto* r) { r->mutable_memory()->set_kv_pool_bytes(uint64_t{2} << 30); },
       "memory.kv_pool_bytes"},
      {"groups", [](auto* r) { r->mutable_memory()->set_max_offload_groups(5); },
       "memory.max_offload_groups"},
      {"offloaded", [](auto* r) { r->mutable_memory()->set_offloaded_groups(4); },
       "memory.offloaded_groups"},
      {"experts", [](auto* r) { r->set_num_experts(-3); }, "num_experts"},
      {"per group", [](auto* r) { r->set_experts_per_group(0); }, "experts_per_group"},
      {"layers", [](auto* r) { r->set_num_layers(1 << 20); }, "num_layers"},
      {"vocab", [](auto* r) { r->set_vocab_size(0); }, "vocab_size"},
      {"eos", [](auto* r) { r->set_eos_token_id(256); }, "eos_token_id"},
      {"context", [](auto* r) { r->set_max_position_embeddings(-1); }, "max_position_embeddings"},
      {"shape", [](auto* r) { r->set_num_layers(5); }, "unlike rank 0"},
      // Recurrent state (prefix-cache snapshots are sized from it) on every rank or none.
      {"state on one rank", [](auto* r) { r->set_recurrent_state_bytes(6400); }, "unlike rank 0"},
      // The offload geometry the controller sizes every remap by.
      {"no block bytes", [](auto* r) { r->mutable_offload()->set_kv_block_bytes(0); },
       "offload.kv_block_bytes"},
      {"blocks beyond the pool", [](auto* r) { r->mutable_offload()->set_kv_block_bytes(1 << 20); },
       "memory.kv_blocks"},
      {"pages", [](auto* r) { r->mutable_offload()->set_kv_pages_per_group(-1); },
       "offload.kv_pages_per_group"},
      {"more than the device",
       [](auto* r) { r->mutable_offload()->set_kv_pages_per_group(100000); },
       "offload.kv_pages_per_group"},
      {"reachable blocks",
       [](auto* r) {
         r->mutable_memory()->set_kv_blocks(1);
         r->mutable_offload()->set_kv_block_bytes(1);
       },
       "offload.kv_block_bytes"},
      {"staged",
       [](auto* r) { r->mutable_offload()->set_staged_bytes_per_group(uint64_t{1} << 40); },
       "offload.staged_bytes_per_group"},
      {"no page", [](auto* r) { r->mutable_memory()->set_page_bytes(0); }, "memory.page_bytes"},
  };
  for (const Case& c : cases) {
    vamp::v1::InitResponse liar = Honest();
    c.lie(&liar);
    absl::Status s = CheckInitResponses(Request(), {Honest(), liar});
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("agent rank 1")) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.field)) << c.name;
  }
}

TEST(AgentReportsTest, RecurrentStateMustFitTheDevice) {
  vamp::v1::InitResponse r = Honest();
  r.set_recurrent_state_bytes(6400);
  EXPECT_TRUE(CheckInitResponses(Request(), {r, r}).ok());
  vamp::v1::InitResponse liar = r;
  liar.set_recurrent_state_bytes(uint64_t{2} << 30);
  absl::Status s = CheckInitResponses(Request(), {r, liar});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("agent rank 1 reported recurrent_state_bytes"));
}

TEST(AgentReportsTest, TheRequestedCapBoundsTheOffloadableGroups) {
  vamp::v1::InitRequest half = Request();
  half.mutable_memory()->set_max_offload_ratio(0.5);  // 4 of 8 experts: 2 groups of 2
  absl::Status s = CheckInitResponses(half, {Honest()});
  ASSERT_FALSE(s.ok()) << "3 groups declared under a cap of 2";
  EXPECT_THAT(s.message(), HasSubstr("memory.max_offload_groups = 3"));
  vamp::v1::InitRequest bad = Request();
  bad.mutable_memory()->set_max_offload_ratio(1.5);
  s = CheckInitResponses(bad, {Honest()});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("memory.max_offload_ratio"));
}

TEST(AgentReportsTest, TimingsAreBounded) {
  vamp::v1::StepTimings t;
  t.set_total_us(1500);
  t.set_forward_us(1200);
  EXPECT_TRUE(CheckStepTimings(t, 0).ok());
  t.set_staging_stall_us(-5);
  EXPECT_THAT(CheckStepTimings(t, 2).message(), HasSubstr("agent rank 2 reported timings.staging"));
  t.set_staging_stall_us(0);
  t.set_total_us(INT64_MAX);
  EXPECT_THAT(CheckStepTimings(t, 0).message(), HasSubstr("timings.total_us"));
}

TEST(AgentReportsTest, StagedShareIsAFraction) {
  vamp::v1::StepTimings t;
  t.set_total_us(1500);
  t.set_routed_staging(true);
  t.set_staged_share(0.0625);
  EXPECT_TRUE(CheckStepTimings(t, 0).ok());
  for (double bad : {-0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    t.set_staged_share(bad);
    const absl::Status s = CheckStepTimings(t, 1);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << bad << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("agent rank 1 reported timings.staged_share")) << bad;
  }
}

}  // namespace
}  // namespace vamp
