// vamp-sim end to end on a small model: the prefix-cache cliff of the static arbiter and VAMP's
// way around it, determinism, the traces, policies and the report.
#include "sim/simulator.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>

#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/report.h"

namespace vamp::sim {
namespace {

using ::testing::HasSubstr;

// A small MoE: 3 MiB experts in groups of 2 (6 MiB), 7 eligible layers → 42 MiB a group; 4 KiB
// of KV per token, 64 KiB blocks → 672 blocks a group. VAMP-25 may move 16 experts (8 groups)
// per layer: 5,376 blocks on top of a 2,048-block (32k-token) baseline.
SimOptions SmallModel() {
  SimOptions o;
  SimModelShape& m = o.calibration.model;
  m.name = "small-moe";
  m.hidden = 1024;
  m.moe_intermediate = 512;
  m.num_experts = 64;
  m.top_k = 4;
  m.num_layers = 8;
  m.num_kv_layers = 8;
  m.num_q_heads = 8;
  m.num_kv_heads = 2;
  m.head_dim = 64;
  m.vocab = 32000;
  // A slow accelerator, so that a small model's prefill costs what a big one's does on an H100:
  // re-computing an evicted context takes seconds, not milliseconds.
  HardwareCalibration& h = o.calibration.hardware;
  h.name = "slow";
  h.weight_read_bytes_per_s = 2e11;
  h.kv_read_bytes_per_s = 2e11;
  h.moe_flops_per_s = 2e12;
  h.dense_flops_per_s = 2e12;
  h.attention_flops_per_s = 2e12;
  h.h2d_bytes_per_s = 5e9;
  h.routed_h2d_bytes_per_s = 4.5e9;  // 0.9x, as measured on the H200
  o.remap.h2d_bytes_per_s = h.h2d_bytes_per_s;
  // Every step copies the whole offloaded region, the staging the tests below price; the
  // engine's routed staging of small steps has its own test.
  o.staging = StagingMode::kWholeRegion;
  o.scheduler.block_size = 16;
  o.scheduler.max_num_batched_tokens = 2048;
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_model_len = 16384;
  o.offload.base_kv_bytes = 2048LL * 64 * 1024;
  o.exclude_first_turn = true;
  return o;
}

// c sessions × 12 turns; the last prompt is 1,024 + 11 × 576 = 7,360 tokens, so the sessions'
// contexts outgrow the 32k-token baseline pool from c = 5 and VAMP-25's 119k tokens from c = 16.
workload::Workload MultiTurn(int32_t c) {
  workload::MultiTurnOptions o;
  o.concurrency = c;
  o.turns = 12;
  o.first_turn_tokens = 1024;
  o.growth_tokens = 512;
  o.output_tokens = 64;
  o.think_time_s = 0.5;
  o.vocab_size = 32000;
  absl::StatusOr<workload::Workload> w = workload::GenerateMultiTurn(o);
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

SimResult Simulated(const workload::Workload& w, const std::string& policy,
                    const SimOptions& options = SmallModel()) {
  absl::StatusOr<PolicySpec> p = ParsePolicy(policy, VampArbiterConfig{});
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<SimResult> r = Simulate(w, *p, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(SimulatorTest, VampAvoidsTheCliffTheStaticArbiterFallsOff) {
  const workload::Workload w = MultiTurn(10);
  const SimResult base = Simulated(w, "static");
  const SimResult vamp = Simulated(w, "vamp-25");
  for (const SimResult* r : {&base, &vamp}) {
    EXPECT_EQ(r->turns_completed, 10 * 12) << r->policy;
    EXPECT_FALSE(r->stalled) << r->policy;
    EXPECT_EQ(r->ttft_s.size(), 10u * 11) << r->policy;  // turn 0 left out
  }
  const double base_p99 = Percentile(base.ttft_s, 99);
  const double vamp_p99 = Percentile(vamp.ttft_s, 99);
  // The static arbiter evicts the sessions' contexts just before their next turns need them.
  EXPECT_LT(base.counters.prefix_cache.HitRate(), 0.5);
  EXPECT_GT(base.counters.num_evicted_blocks, 0);
  // VAMP moves expert groups into the pool instead and keeps the contexts.
  EXPECT_GT(vamp.counters.prefix_cache.HitRate(), 0.80);
  EXPECT_GE(base_p99, 5 * vamp_p99) << "static p99 " << base_p99 << " s, vamp-25 " << vamp_p99;
  std::cout << "static: p99 " << base_p99 << " s, hit " << base.counters.prefix_cache.HitRate()
            << ", end " << base.end_s << " s; vamp-25: p99 " << vamp_p99 << " s, hit "
            << vamp.counters.prefix_cache.HitRate() << ", end " << vamp.end_s << " s, tpot "
            << vamp.MeanTpotMs() << " ms vs " << base.MeanTpotMs() << " ms\n";
  EXPECT_GT(vamp.max_groups, 0);
  EXPECT_LE(vamp.max_groups, vamp.geometry.max_groups);
  EXPECT_GT(vamp.max_blocks, vamp.base_blocks);
  EXPECT_GE(vamp.decisions.at("offload"), 1);
  // The staging of offloaded experts is VAMP's price: slower decode.
  EXPECT_GT(vamp.MeanTpotMs(), base.MeanTpotMs());
  EXPECT_GT(vamp.exposed_copy_s, 0);
  ASSERT_TRUE(vamp.live.has_value());
  EXPECT_FALSE(base.live.has_value());
}

TEST(SimulatorTest, RoutedStagingKeepsTheCliffWinAtALowerTax) {
  const workload::Workload w = MultiTurn(10);
  SimOptions routed = SmallModel();
  routed.staging = StagingMode::kRouted;
  routed.routed_staging_max_tokens = 16;
  const SimResult base = Simulated(w, "static", routed);
  const SimResult whole = Simulated(w, "vamp-25");
  const SimResult vamp = Simulated(w, "vamp-25", routed);
  EXPECT_EQ(vamp.turns_completed, 10 * 12);
  EXPECT_GT(vamp.counters.prefix_cache.HitRate(), 0.80);
  EXPECT_GT(vamp.max_groups, 0);
  // The decode steps of 10 sessions copy only the experts they route to (top-4 of 64: about
  // half of each offloaded layer), so the per-step tax falls below the whole region's.
  EXPECT_LT(vamp.MeanTpotMs(), whole.MeanTpotMs());
  EXPECT_GE(Percentile(base.ttft_s, 99), 3 * Percentile(vamp.ttft_s, 99));
}

TEST(SimulatorTest, BelowTheCliffVampNeverOffloads) {
  const workload::Workload w = MultiTurn(3);
  const SimResult base = Simulated(w, "static");
  const SimResult vamp = Simulated(w, "vamp-25");
  EXPECT_EQ(vamp.max_groups, 0);
  EXPECT_EQ(vamp.max_blocks, vamp.base_blocks);
  EXPECT_EQ(vamp.counters.num_offloads, 0);
  EXPECT_EQ(vamp.exposed_copy_s, 0);
  EXPECT_EQ(vamp.counters.num_preemptions, 0);
  // Without pressure both policies behave alike.
  EXPECT_EQ(vamp.ttft_s, base.ttft_s);
  EXPECT_GT(vamp.counters.prefix_cache.HitRate(), 0.80);
}

TEST(SimulatorTest, DeterministicAcrossRuns) {
  const workload::Workload w = MultiTurn(6);
  const SimResult a = Simulated(w, "vamp-15");
  const SimResult b = Simulated(w, "vamp-15");
  EXPECT_EQ(a.ttft_s, b.ttft_s);
  EXPECT_EQ(a.tpot_ms, b.tpot_ms);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.decisions, b.decisions);
  EXPECT_EQ(a.counters.num_offloaded_blocks, b.counters.num_offloaded_blocks);
}

TEST(SimulatorTest, ExtensionsRunAndRestoreGivesExpertsBack) {
  // A heavy phase (8 sessions) followed, after it ends, by one light session: with restore and
  // self-calibration the pool gives its expert groups back once the heavy contexts are cold.
  workload::Workload w = MultiTurn(8);
  workload::Workload tail = MultiTurn(1);
  for (workload::Session& s : tail.sessions) {
    s.id = "tail";
    s.start_s = 400;
    for (workload::Turn& t : s.turns) t.output_tokens = 256;  // long decode phases
    w.sessions.push_back(s);
  }
  SimOptions o = SmallModel();
  VampArbiterConfig v;
  v.restore.quiet_steps = 50;
  v.restore.cold_age_steps = 100;
  v.restore.step_groups = 1;  // the pool is small: give groups back one at a time
  v.self_calibration.min_samples = 4;
  absl::StatusOr<PolicySpec> p = ParsePolicy("vamp-25+restore+calib", v);
  ASSERT_TRUE(p.ok());
  absl::StatusOr<SimResult> r = Simulate(w, *p, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->turns_completed, 9 * 12);

  EXPECT_GT(r->max_groups, 0);
  EXPECT_GT(r->counters.num_restores, 0);
  EXPECT_GT(r->counters.num_restored_blocks, 0);
  ASSERT_FALSE(r->series.empty());
  EXPECT_LT(r->series.back().num_blocks, r->max_blocks);
  ASSERT_TRUE(r->live.has_value());
  EXPECT_GE(r->live->c_eff_samples, 4);
  EXPECT_NE(r->live->c_eff_micros, VampArbiterConfig{}.costs.c_eff_micros);
}

TEST(SimulatorTest, RequestsPreemptedForARestoreResumeWithoutWaitingForAnArrival) {
  // Long decodes hold the pool's tail when the heavy phase's restores start, so the arbiter
  // preempts them; when they were all that ran, the plan of that step is empty. The serving
  // engine schedules again at once; the simulator must too, not jump to the next arrival (the
  // tail session at 5,000 s), which kept the preempted requests waiting for it.
  workload::Workload w = MultiTurn(8);
  for (workload::Session& s : w.sessions) {
    for (workload::Turn& t : s.turns) t.output_tokens = 512;
  }
  workload::Workload tail = MultiTurn(1);
  for (workload::Session& s : tail.sessions) {
    s.id = "tail";
    s.start_s = 5000;
    w.sessions.push_back(s);
  }
  const SimResult r = Simulated(w, "vamp-25");
  EXPECT_EQ(r.turns_completed, 9 * 12);
  ASSERT_TRUE(r.decisions.contains("restore-preempt"));
  double heavy_end_s = 0;
  for (const TurnRecord& t : r.turn_records) {
    if (t.arrival_s < 5000) heavy_end_s = std::max(heavy_end_s, t.finish_s);
  }
  EXPECT_LT(heavy_end_s, 1000);
}

TEST(SimulatorTest, ParsePolicy) {
  absl::StatusOr<PolicySpec> p = ParsePolicy("vamp-15", VampArbiterConfig{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->arbiter, "vamp");
  EXPECT_DOUBLE_EQ(p->offload_cap.ratio(), 0.15);
  EXPECT_EQ(p->vamp.cost_model, VampCostModel::kTax);  // the shipped defaults
  EXPECT_TRUE(p->vamp.restore.enabled);
  p = ParsePolicy("vamp-25+paper", VampArbiterConfig{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->vamp.cost_model, VampCostModel::kPaper);
  EXPECT_FALSE(p->vamp.restore.enabled);
  EXPECT_FALSE(p->vamp.self_calibration.enabled);
  p = ParsePolicy("vamp-25+paper+restore+calib", VampArbiterConfig{});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->vamp.restore.enabled);
  EXPECT_TRUE(p->vamp.self_calibration.enabled);
  EXPECT_EQ(ParsePolicy("static", VampArbiterConfig{})->arbiter, "static");
  EXPECT_DOUBLE_EQ(ParsePolicy("vamp-0", {})->offload_cap.ratio(), 0);
  EXPECT_DOUBLE_EQ(ParsePolicy("vamp-100", {})->offload_cap.ratio(), 1);
  EXPECT_THAT(ParsePolicy("vamp-101", {}).status().message(), HasSubstr("0 <= r <= 100"));
  EXPECT_THAT(ParsePolicy("vamp-101", {}).status().message(), HasSubstr("must be in [0, 1]"));
  EXPECT_THAT(ParsePolicy("lru", {}).status().message(), HasSubstr("policy 'lru'"));
  EXPECT_THAT(ParsePolicy("vamp-10+turbo", {}).status().message(), HasSubstr("+turbo"));
}

TEST(SimulatorTest, Percentiles) {
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({0, 10}, 99), 9.9);
  EXPECT_DOUBLE_EQ(Median({5}), 5);
}

TEST(SimulatorTest, MooncakePrefixReplays) {
  const std::string path =
      std::string(VAMP_SOURCE_DIR) + "/../shared/traces/mooncake/synthetic_trace.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no Mooncake trace at " << path;
  workload::MooncakeOptions mo;
  mo.max_requests = 150;
  absl::StatusOr<workload::Workload> w = workload::ReadMooncakeTrace(path, mo);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const char* preset : {"qwen3-30b-a3b", "qwen3-next-80b-a3b-h100-tp2"}) {
    absl::StatusOr<Calibration> c = CalibrationPreset(preset);
    ASSERT_TRUE(c.ok());
    SimOptions o;
    o.calibration = *c;
    o.scheduler.max_model_len = c->model.tp_size > 1 ? 262144 : 65536;  // what the pool holds
    const bool recurrent = c->model.RecurrentStateBytesPerSeq() > 0;
    for (const char* policy : {"static", "vamp-15"}) {
      const SimResult r = Simulated(*w, policy, o);
      EXPECT_EQ(r.turns_completed, 150) << preset << " " << policy;
      EXPECT_EQ(r.ttft_s.size(), 150u) << preset << " " << policy;
      EXPECT_GT(r.OutputTokensPerSecond(), 0) << preset << " " << policy;
      if (recurrent) {
        // A hit on a model with recurrent state must end where a snapshot of it was kept: at a
        // prompt's or an output's last block boundary. The trace's requests share prefixes that
        // end inside their prompts, where the engine keeps none, so none of them hits.
        EXPECT_EQ(r.counters.prefix_cache.hit_tokens, 0) << preset << " " << policy;
      } else {
        EXPECT_GT(r.counters.prefix_cache.hit_tokens, 0) << preset << " " << policy;
      }
    }
  }
}

TEST(SimulatorTest, RecurrentStateSnapshotsServeConversationsAndTakeBlocks) {
  // Qwen3-Next's shape at TP2 on H100: 36 Gated DeltaNet layers of 1,097,728 bytes of float32
  // state per sequence per rank (3 x 4,096 conv channels + 16 x 128 x 128), against 12 KiB of KV
  // per token per rank: a snapshot takes 39,518,208 / 196,608 = 201 blocks of 16 tokens.
  absl::StatusOr<Calibration> c = CalibrationPreset("qwen3-next-80b-a3b-h100-tp2");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->model.RecurrentStateBytesPerLayer(), 1097728);
  EXPECT_EQ(c->model.RecurrentStateBytesPerSeq(), 39518208);
  EXPECT_EQ(c->model.KvBytesPerToken() * 16, 196608);
  EXPECT_EQ(Calibration{}.model.RecurrentStateBytesPerSeq(), 0);  // Qwen3-30B-A3B: none
  SimOptions o;
  o.calibration = *c;
  o.scheduler.max_model_len = 262144;
  const workload::Workload w = MultiTurn(4);
  const SimResult with_state = Simulated(w, "static", o);
  // Each turn continues its conversation at the previous output's snapshot.
  EXPECT_GT(with_state.counters.prefix_cache.hit_tokens, 0);
  EXPECT_EQ(with_state.turns_completed, w.NumTurns());
  int32_t most_snapshot_blocks = 0;
  for (const TimeSample& t : with_state.series) {
    most_snapshot_blocks = std::max(most_snapshot_blocks, t.num_snapshot_blocks);
  }
  EXPECT_GE(most_snapshot_blocks, 201);
  EXPECT_EQ(most_snapshot_blocks % 201, 0);
}

TEST(ReportTest, RendersTablesAndCharts) {
  const workload::Workload w = MultiTurn(4);
  ReportSpec spec;
  spec.title = "test";
  spec.command = "vamp-sim --x";
  spec.policies = {"static", "vamp-25"};
  spec.concurrencies = {4};
  spec.runs.push_back({4, Simulated(w, "static")});
  spec.runs.push_back({4, Simulated(w, "vamp-25")});
  spec.paper = PaperFigure9H100();
  spec.svg_prefix = "sim-test";
  spec.phase_split_s = 1;
  const RenderedReport r = RenderReport(spec);
  EXPECT_THAT(r.markdown, HasSubstr("# test"));
  EXPECT_THAT(r.markdown, HasSubstr("vamp-sim --x"));
  EXPECT_THAT(r.markdown, HasSubstr("| 4 | vamp-25 | 48 |"));
  EXPECT_THAT(r.markdown, HasSubstr("Late phase"));
  EXPECT_THAT(r.markdown, HasSubstr("![TTFT p99 against concurrency](sim-test-ttft-p99.svg)"));
  ASSERT_GE(r.svgs.size(), 5u);
  for (const auto& [name, svg] : r.svgs) {
    EXPECT_EQ(name.rfind("sim-test-", 0), 0u) << name;
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << name;
    EXPECT_THAT(svg, HasSubstr("</svg>"));
  }
}

}  // namespace
}  // namespace vamp::sim

namespace vamp::sim {
namespace {

// Property: VAMP with a zero offload cap is the static split, decision for decision.
TEST(SimulatorTaxModelTest, ZeroCapEqualsStatic) {
  for (int32_t c : {3, 8}) {
    const workload::Workload w = MultiTurn(c);
    const SimResult base = Simulated(w, "static");
    const SimResult zero = Simulated(w, "vamp-0");
    EXPECT_EQ(zero.max_groups, 0);
    EXPECT_EQ(zero.ttft_s, base.ttft_s) << "c=" << c;
    EXPECT_EQ(zero.tpot_ms, base.tpot_ms) << "c=" << c;
    EXPECT_EQ(zero.counters.num_preemptions, base.counters.num_preemptions);
    EXPECT_EQ(zero.counters.prefix_cache.hit_tokens, base.counters.prefix_cache.hit_tokens);
  }
}

// On traffic whose reuse no reachable pool serves, the tax model stays at the static split
// (the paper's model offloads and loses here).
TEST(SimulatorTaxModelTest, LowReuseTrafficStaysStatic) {
  workload::LowReuseOptions o;
  o.num_requests = 300;
  o.rate_per_s = 1.0;
  o.prompt_tokens = 3000;
  o.output_tokens = 64;
  o.reuse_probability = 0.3;
  o.mean_reuse_distance = 2000;  // far beyond what VAMP-25's pool holds
  o.vocab_size = 32000;
  absl::StatusOr<workload::Workload> w = workload::GenerateLowReuse(o);
  ASSERT_TRUE(w.ok()) << w.status();
  SimOptions options = SmallModel();
  options.exclude_first_turn = false;  // single-turn requests: every turn counts
  const SimResult base = Simulated(*w, "static", options);
  const SimResult tax = Simulated(*w, "vamp-25", options);
  const SimResult paper = Simulated(*w, "vamp-25+paper", options);
  EXPECT_EQ(tax.turns_completed, 300);
  ASSERT_EQ(base.ttft_s.size(), 300u);
  const double base_p99 = Percentile(base.ttft_s, 99);
  EXPECT_LE(Percentile(tax.ttft_s, 99), 1.05 * base_p99);
  EXPECT_LE(tax.MeanTpotMs(), 1.05 * base.MeanTpotMs());
  std::cout << "low reuse: static p99 " << base_p99 << " s, tpot " << base.MeanTpotMs()
            << " ms; tax p99 " << Percentile(tax.ttft_s, 99) << " s, tpot " << tax.MeanTpotMs()
            << " ms, groups " << tax.max_groups << "; paper p99 " << Percentile(paper.ttft_s, 99)
            << " s, tpot " << paper.MeanTpotMs() << " ms, groups " << paper.max_groups << "\n";
}

TEST(LowReuseGeneratorTest, DeterministicWithReuseAsConfigured) {
  workload::LowReuseOptions o;
  o.num_requests = 400;
  o.prompt_tokens = 256;
  o.prompt_jitter = 0;
  o.reuse_probability = 0.5;
  o.reuse_fraction = 0.5;
  o.mean_reuse_distance = 10;
  o.vocab_size = 1000;
  absl::StatusOr<workload::Workload> a = workload::GenerateLowReuse(o);
  absl::StatusOr<workload::Workload> b = workload::GenerateLowReuse(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->sessions.size(), 400u);
  int shared = 0;
  for (size_t i = 0; i < a->sessions.size(); ++i) {
    EXPECT_EQ(a->sessions[i].turns[0].new_tokens, b->sessions[i].turns[0].new_tokens);
    EXPECT_EQ(a->sessions[i].turns[0].new_tokens.size(), 256u);
    if (i > 0) {
      EXPECT_GE(a->sessions[i].start_s, a->sessions[i - 1].start_s);
    }
    for (size_t j = 0; j < i; ++j) {
      if (std::equal(a->sessions[i].turns[0].new_tokens.begin(),
                     a->sessions[i].turns[0].new_tokens.begin() + 128,
                     a->sessions[j].turns[0].new_tokens.begin())) {
        ++shared;
        break;
      }
    }
  }
  EXPECT_NEAR(shared / 400.0, 0.5, 0.08);  // about reuse_probability of them repeat a prefix
  workload::WorkloadSummary s = workload::Summarize(*a, 16);
  EXPECT_GT(s.ideal_prefix_hit_ratio, 0.15);
  EXPECT_LT(s.ideal_prefix_hit_ratio, 0.35);
  o.rate_per_s = 0;
  EXPECT_THAT(workload::GenerateLowReuse(o).status().message(), HasSubstr("rate_per_s"));
}

}  // namespace
}  // namespace vamp::sim
