// vamp-bench's workload flags: every family builds from flags, deterministically; the sweep's
// session override and seed offsets; the window rule per family; errors name the input.
#include "bench/vamp_bench/workload_flags.h"

#include <filesystem>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::bench {
namespace {

using ::testing::HasSubstr;

const ConfigSchema& Schema() {
  static const ConfigSchema* s = [] {
    auto* schema = new ConfigSchema();
    AddWorkloadFlags(*schema);
    return schema;
  }();
  return *s;
}

WorkloadFlags Flags(std::vector<std::string> flags) {
  std::vector<const char*> argv = {"vamp-bench"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  absl::StatusOr<CommandLine> cli =
      ParseCommandLine(Schema(), static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(cli.ok()) << cli.status();
  return WorkloadFlagsFromConfig(cli->config);
}

bool Same(const workload::Workload& a, const workload::Workload& b) {
  if (a.sessions.size() != b.sessions.size()) return false;
  for (size_t i = 0; i < a.sessions.size(); ++i) {
    const auto& x = a.sessions[i];
    const auto& y = b.sessions[i];
    if (x.start_s != y.start_s || x.turns.size() != y.turns.size()) return false;
    for (size_t k = 0; k < x.turns.size(); ++k) {
      if (x.turns[k].new_tokens != y.turns[k].new_tokens ||
          x.turns[k].think_time_s != y.turns[k].think_time_s ||
          x.turns[k].arrival_offset_s != y.turns[k].arrival_offset_s ||
          x.turns[k].output_tokens != y.turns[k].output_tokens) {
        return false;
      }
    }
  }
  return true;
}

TEST(WorkloadFlagsTest, MultiTurnStructureDeterminismAndSweepOverride) {
  WorkloadFlags c =
      Flags({"--sessions=3", "--turns=4", "--first_turn_tokens=100", "--growth_tokens=10",
             "--output_tokens=5", "--think_time_s=0.5", "--vocab_size=256"});
  absl::StatusOr<workload::Workload> w = BuildWorkload(c, 0, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->sessions.size(), 3u);
  for (const workload::Session& s : w->sessions) {
    ASSERT_EQ(s.turns.size(), 4u);
    EXPECT_EQ(s.turns[0].new_tokens.size(), 100u);
    for (size_t k = 1; k < 4; ++k) {
      // Later turns re-send the history, wait for the previous turn and think first.
      EXPECT_TRUE(s.turns[k].extends_history);
      EXPECT_TRUE(s.turns[k].after_previous);
      EXPECT_EQ(s.turns[k].think_time_s, 0.5);
      EXPECT_EQ(s.turns[k].new_tokens.size(), 10u);
    }
    for (const workload::Turn& t : s.turns) {
      EXPECT_EQ(t.output_tokens, 5);
      for (int32_t id : t.new_tokens) ASSERT_LT(id, 256);
    }
  }
  EXPECT_TRUE(Same(*w, *BuildWorkload(c, 0, 0)));
  // The sweep's sessions override --sessions; a seed offset gives other tokens, same shape.
  EXPECT_EQ(BuildWorkload(c, 7, 0)->sessions.size(), 7u);
  absl::StatusOr<workload::Workload> other = BuildWorkload(c, 0, 0, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(Same(*w, *other));
  EXPECT_EQ(other->NumTurns(), w->NumTurns());
  EXPECT_TRUE(c.window.exclude_first_turn);
  EXPECT_FALSE(Flags({"--include_first_turn"}).window.exclude_first_turn);
  EXPECT_THAT(DescribeWorkload(c, 5), HasSubstr("5 sessions x 4 turns"));
}

TEST(WorkloadFlagsTest, MooncakeReplaySharesPrefixesByHashId) {
  // The default --trace is the shared synthetic trace, outside the repository.
  WorkloadFlags c = Flags({"--workload=mooncake", "--max_requests=50", "--time_scale=0.5"});
  absl::StatusOr<workload::Workload> w = BuildWorkload(c, 0, 0);
  if (!w.ok()) GTEST_SKIP() << "no Mooncake trace here: " << w.status();
  ASSERT_EQ(w->sessions.size(), 50u);
  double last = -1;
  std::set<std::vector<int32_t>> first_blocks;
  for (const workload::Session& s : w->sessions) {
    ASSERT_EQ(s.turns.size(), 1u);  // one request per record, open loop by its timestamp
    EXPECT_GE(s.start_s + s.turns[0].arrival_offset_s, last);
    last = s.start_s + s.turns[0].arrival_offset_s;
    const auto& t = s.turns[0].new_tokens;
    first_blocks.insert(
        std::vector<int32_t>(t.begin(), t.begin() + std::min<size_t>(512, t.size())));
  }
  // Records that start with the same hash id start with the same tokens.
  EXPECT_LT(first_blocks.size(), w->sessions.size());
  EXPECT_FALSE(c.window.exclude_first_turn);  // every request is a first turn
}

TEST(WorkloadFlagsTest, LowReuseAndErrors) {
  WorkloadFlags c = Flags(
      {"--workload=low_reuse", "--num_requests=30", "--prompt_tokens=64", "--vocab_size=256"});
  absl::StatusOr<workload::Workload> w = BuildWorkload(c, 0, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sessions.size(), 30u);
  EXPECT_TRUE(Same(*w, *BuildWorkload(c, 0, 0)));
  absl::StatusOr<workload::Workload> bad =
      BuildWorkload(Flags({"--workload=mooncake", "--trace=/nonexistent/trace.jsonl"}), 0, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("/nonexistent/trace.jsonl"));
  bad = BuildWorkload(Flags({"--workload=lmcache", "--trace_dir=/nonexistent"}), 0, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("/nonexistent"));
}

TEST(WorkloadFlagsTest, LmcacheTextGoesThroughTheModelsTokenizer) {
  const std::string qwen = std::string(VAMP_TEST_DATA_DIR) + "/qwen3-30b-a3b";
  const std::string tiny = std::string(VAMP_TEST_DATA_DIR) + "/tiny-qwen3-moe";  // no tokenizer
  WorkloadFlags lmcache = Flags({"--workload=lmcache"});
  // --tokenizer_dir wins; else the model folder when it has a tokenizer.json; else none.
  EXPECT_EQ(TokenizerDirFor(Flags({"--workload=lmcache", "--tokenizer_dir=/x"}), qwen), "/x");
  EXPECT_EQ(TokenizerDirFor(lmcache, tiny), "");
  EXPECT_EQ(TokenizerDirFor(Flags({"--workload=multi_turn", "--tokenizer_dir=/x"}), qwen), "");
  EXPECT_THAT(DescribeWorkload(lmcache, 0, tiny), HasSubstr("text through 4 bytes a token"));
  // A folder without a usable tokenizer.json is an error naming the flag, not a silent fallback.
  absl::StatusOr<workload::Workload> bad =
      BuildWorkload(Flags({"--workload=lmcache", "--tokenizer_dir=" + tiny}), 0, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--tokenizer_dir '" + tiny));
  if (!std::filesystem::exists(qwen + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3's tokenizer is not fetched (scripts/fetch-tokenizers.sh)";
  }
  EXPECT_EQ(TokenizerDirFor(lmcache, qwen), qwen);
  EXPECT_THAT(DescribeWorkload(lmcache, 0, qwen),
              HasSubstr("text through the tokenizer of " + qwen));
  const std::string traces =
      std::string(VAMP_SOURCE_DIR) + "/../shared/traces/lmcache-agent-trace/miniswe";
  WorkloadFlags two = Flags({"--workload=lmcache", "--sessions=2", "--trace_dir=" + traces});
  absl::StatusOr<workload::Workload> by_chars = BuildWorkload(two, 0, 0);
  absl::StatusOr<workload::Workload> by_qwen = BuildWorkload(two, 0, 0, 0, qwen);
  if (!by_chars.ok())
    GTEST_SKIP() << "shared/traces not beside the checkout: " << by_chars.status();
  ASSERT_TRUE(by_qwen.ok()) << by_qwen.status();
  ASSERT_EQ(by_qwen->sessions.size(), 2u);
  EXPECT_NE(by_qwen->sessions[0].turns[0].new_tokens, by_chars->sessions[0].turns[0].new_tokens);
  EXPECT_FALSE(by_qwen->sessions[0].turns[0].new_tokens.empty());
}

}  // namespace
}  // namespace vamp::bench
