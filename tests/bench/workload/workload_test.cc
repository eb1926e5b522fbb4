#include <cstdio>
#include <filesystem>
#include <fstream>

#include "bench/workload/lmcache_trace.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "bench/workload/token_synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace vamp::workload {
namespace {

using ::testing::HasSubstr;

// shared/ sits beside the checkout (DEVELOPERS' layout, and CI's).
std::string TracesDir() { return std::string(VAMP_SOURCE_DIR) + "/../shared/traces"; }

bool HaveTraces() { return std::filesystem::exists(TracesDir() + "/mooncake"); }

TEST(TokenSynthTest, DeterministicAndInRange) {
  EXPECT_EQ(TokensForHashBlock(46, 512, 1000), TokensForHashBlock(46, 512, 1000));
  EXPECT_NE(TokensForHashBlock(46, 512, 1000), TokensForHashBlock(47, 512, 1000));
  // A partial block is the prefix of the full one.
  std::vector<int32_t> full = TokensForHashBlock(9, 512, 1000);
  std::vector<int32_t> part = TokensForHashBlock(9, 100, 1000);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin()));
  for (int32_t t : SyntheticTokens(1, 2, 10000, 7)) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 7);
  }
}

TEST(TokenSynthTest, SharedTextPrefixGivesSharedTokens) {
  std::vector<int32_t> a = TokenizeText("The migration executor only adds the outer", 4, 50000);
  std::vector<int32_t> b = TokenizeText("The migration executor only adds XYZ", 4, 50000);
  ASSERT_EQ(a.size(), 11u);
  // 32 shared characters = 8 whole chunks.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 8, b.begin()));
  EXPECT_NE(a[8], b[8]);
}

TEST(MooncakeTraceTest, ReadsTheSyntheticTraceAndItsPrefixReuse) {
  if (!HaveTraces()) GTEST_SKIP() << "shared/traces not beside the checkout";
  MooncakeOptions options;
  options.vocab_size = 151936;
  absl::StatusOr<Workload> w =
      ReadMooncakeTrace(TracesDir() + "/mooncake/synthetic_trace.jsonl", options);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sessions.size(), 3993u);
  const Turn& first = w->sessions[0].turns[0];
  EXPECT_EQ(first.new_tokens.size(), 40160u);
  EXPECT_EQ(first.output_tokens, 6);
  EXPECT_DOUBLE_EQ(first.arrival_offset_s, 0.0);
  WorkloadSummary s = Summarize(*w, 512);
  // The trace's README: average input 15,325 tokens; 64 % leading-prefix block hit with an
  // infinite cache. Whole 512-token blocks of our tokens must reproduce that reuse.
  EXPECT_NEAR(static_cast<double>(s.prompt_tokens) / s.turns, 15325, 5);
  EXPECT_NEAR(s.ideal_prefix_hit_ratio, 0.64, 0.03);
}

TEST(MooncakeTraceTest, ErrorsNameLineAndField) {
  const std::string path = ::testing::TempDir() + "/bad_mooncake.jsonl";
  std::ofstream(path) << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, "
                         "\"hash_ids\": [1]}\n"
                      << "{\"timestamp\": 5, \"input_length\": 1000, \"output_length\": 1, "
                         "\"hash_ids\": [1]}\n";
  absl::StatusOr<Workload> w = ReadMooncakeTrace(path);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(":2: field 'hash_ids' has 1 ids"));
  std::ofstream(path) << "{\"timestamp\": -1}\n";
  EXPECT_THAT(ReadMooncakeTrace(path).status().message(),
              HasSubstr(":1: field 'timestamp' must be a non-negative integer"));
  std::ofstream(path) << "not json\n";
  EXPECT_THAT(ReadMooncakeTrace(path).status().message(), HasSubstr(":1: not a JSON object"));
  EXPECT_EQ(ReadMooncakeTrace("/nonexistent.jsonl").status().code(), absl::StatusCode::kNotFound);
}

TEST(LmcacheTraceTest, MiniSweSessionsReuseTheirGrowingContext) {
  if (!HaveTraces()) GTEST_SKIP() << "shared/traces not beside the checkout";
  LmcacheOptions options;
  options.stagger_s = 10;
  absl::StatusOr<Workload> w =
      ReadLmcacheTraces(TracesDir() + "/lmcache-agent-trace/miniswe", options);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sessions.size(), 20u);
  EXPECT_EQ(w->NumTurns(), 402);
  EXPECT_DOUBLE_EQ(w->sessions[3].start_s, 30.0);
  for (const Session& s : w->sessions) {
    EXPECT_FALSE(s.turns[0].after_previous);
    for (size_t t = 1; t < s.turns.size(); ++t) {
      EXPECT_TRUE(s.turns[t].after_previous);
      EXPECT_GE(s.turns[t].arrival_offset_s, s.turns[t - 1].arrival_offset_s);
    }
  }
  // Each call re-sends the previous context: most prompt tokens are reusable prefix.
  EXPECT_GT(Summarize(*w, 16).ideal_prefix_hit_ratio, 0.8);
}

TEST(LmcacheTraceTest, MoreSessionsThanFilesReuseFilesUnderNewIds) {
  if (!HaveTraces()) GTEST_SKIP() << "shared/traces not beside the checkout";
  LmcacheOptions options;
  options.num_sessions = 30;
  absl::StatusOr<Workload> w =
      ReadLmcacheTraces(TracesDir() + "/lmcache-agent-trace/miniswe", options);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->sessions.size(), 30u);
  EXPECT_NE(w->sessions[0].id, w->sessions[20].id);
  EXPECT_EQ(w->sessions[0].turns.size(), w->sessions[20].turns.size());
}

TEST(LmcacheTraceTest, TextGoesThroughTheGivenTokenizer) {
  const std::string dir = ::testing::TempDir() + "/lmcache_tokenized";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/s.jsonl")
      << "{\"timestamp\": 1000000, \"input\": \"abc\", \"output\": \"hello\"}\n"
      << "{\"timestamp\": 3000000, \"input\": \"abchello!\", \"output\": \"x\"}\n";
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> bytes = ByteTokenizer::Create(256);
  ASSERT_TRUE(bytes.ok());
  LmcacheOptions options;
  options.vocab_size = 256;
  options.tokenizer = bytes->get();
  absl::StatusOr<Workload> w = ReadLmcacheTraces(dir, options);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->sessions.size(), 1u);
  ASSERT_EQ(w->sessions[0].turns.size(), 2u);
  // The byte tokenizer's ids are the text's bytes; output lengths are token counts of the text.
  EXPECT_EQ(w->sessions[0].turns[0].new_tokens, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(w->sessions[0].turns[0].output_tokens, 5);
  EXPECT_EQ(w->sessions[0].turns[1].new_tokens.size(), 9u);
  EXPECT_EQ(w->sessions[0].turns[1].output_tokens, 1);
  EXPECT_DOUBLE_EQ(w->sessions[0].turns[1].arrival_offset_s, 2.0);
  // Ids the model cannot take are refused, naming the file, line and field.
  options.vocab_size = 100;
  w = ReadLmcacheTraces(dir, options);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(),
              HasSubstr("s.jsonl:2: the tokenizer 'byte-fallback' gave token id 104"));
  EXPECT_THAT(w.status().message(), HasSubstr("for 'input'"));
}

TEST(LmcacheTraceTest, QwenTokensOfMiniSweKeepTheReusablePrefix) {
  if (!HaveTraces()) GTEST_SKIP() << "shared/traces not beside the checkout";
  const std::string model = std::string(VAMP_TEST_DATA_DIR) + "/qwen3-30b-a3b";
  if (!std::filesystem::exists(model + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3's tokenizer is not fetched (scripts/fetch-tokenizers.sh)";
  }
  absl::StatusOr<std::unique_ptr<HfTokenizer>> qwen = HfTokenizer::FromModelFolder(model);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  LmcacheOptions by_chars, by_tokenizer;
  by_tokenizer.tokenizer = qwen->get();
  absl::StatusOr<Workload> chars =
      ReadLmcacheTraces(TracesDir() + "/lmcache-agent-trace/miniswe", by_chars);
  absl::StatusOr<Workload> tokens =
      ReadLmcacheTraces(TracesDir() + "/lmcache-agent-trace/miniswe", by_tokenizer);
  ASSERT_TRUE(chars.ok() && tokens.ok());
  ASSERT_EQ(tokens->NumTurns(), chars->NumTurns());
  const WorkloadSummary c = Summarize(*chars, 16), t = Summarize(*tokens, 16);
  // BPE differs from 4 bytes a token, but not by much on English and code, and a shared text
  // prefix stays a shared token prefix.
  EXPECT_GT(t.prompt_tokens, c.prompt_tokens / 2);
  EXPECT_LT(t.prompt_tokens, c.prompt_tokens * 2);
  EXPECT_NE(t.prompt_tokens, c.prompt_tokens);
  EXPECT_GT(t.ideal_prefix_hit_ratio, 0.8);
}

TEST(LmcacheTraceTest, ErrorsNameFileLineAndField) {
  const std::string dir = ::testing::TempDir() + "/bad_lmcache";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/s.jsonl") << "{\"timestamp\": 1, \"input\": \"x\"}\n";
  absl::StatusOr<Workload> w = ReadLmcacheTraces(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("s.jsonl:1: field 'output' must be a string"));
  EXPECT_FALSE(ReadLmcacheTraces("/nonexistent-folder").ok());
}

TEST(MultiTurnTest, ContextGrowsEveryTurnAndSessionsAreDistinct) {
  MultiTurnOptions o;
  o.concurrency = 4;
  o.turns = 12;
  o.first_turn_tokens = 256;
  o.growth_tokens = 64;
  o.output_tokens = 16;
  o.shared_system_tokens = 32;
  absl::StatusOr<Workload> w = GenerateMultiTurn(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->NumTurns(), 48);
  WorkloadSummary s = Summarize(*w, 16);
  // Turn t's prompt: 256 + t * (64 + 16) tokens.
  int64_t per_session = 0;
  for (int t = 0; t < 12; ++t) per_session += 256 + t * 80;
  EXPECT_EQ(s.prompt_tokens, 4 * per_session);
  EXPECT_GT(s.ideal_prefix_hit_ratio, 0.7);
  EXPECT_NE(w->sessions[0].turns[0].new_tokens, w->sessions[1].turns[0].new_tokens);
  // The shared system prompt is shared.
  EXPECT_TRUE(std::equal(w->sessions[0].turns[0].new_tokens.begin(),
                         w->sessions[0].turns[0].new_tokens.begin() + 32,
                         w->sessions[1].turns[0].new_tokens.begin()));
  o.concurrency = 0;
  EXPECT_THAT(GenerateMultiTurn(o).status().message(), HasSubstr("concurrency"));
}

}  // namespace
}  // namespace vamp::workload
