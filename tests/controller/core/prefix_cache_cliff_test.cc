// The prefix-cache cliff under the static arbiter (paper §III-B, Fig. 1b): multi-turn sessions
// whose every turn extends the previous context. While the sessions' reusable prefixes fit in the
// pool, almost every turn is a prefix hit; once their total exceeds it, LRU eviction removes each
// session's context just before its next turn needs it, and the hit rate collapses.
#include <cstdint>
#include <iostream>
#include <vector>

#include "gtest/gtest.h"
#include "tests/controller/core/scheduler_test_util.h"

namespace vamp {
namespace {

using testing::Harness;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPoolBlocks = 256;  // 4,096 tokens
constexpr int32_t kSystemTokens = 256;
constexpr int32_t kUserTokens = 64;
constexpr int32_t kOutputTokens = 32;
constexpr int kTurns = 8;

struct TurnStats {
  int64_t query_tokens = 0;
  int64_t hit_tokens = 0;
  int32_t context_blocks = 0;  // blocks of one session's context at this turn
  double HitRate() const {
    return query_tokens ? static_cast<double>(hit_tokens) / query_tokens : 0;
  }
};

// Runs `sessions` sessions round-robin, one turn at a time; returns per-turn prefix-cache stats.
std::vector<TurnStats> RunSessions(int sessions) {
  SchedulerConfig c;
  c.block_size = kBlockSize;
  c.num_blocks = kPoolBlocks;
  c.max_model_len = 2048;
  c.max_num_batched_tokens = 512;
  Harness h(c);
  std::vector<std::vector<TokenId>> context(sessions);
  auto token = [](int session, int pos) { return static_cast<TokenId>(session * 100000 + pos); };
  for (int s = 0; s < sessions; ++s) {
    for (int i = 0; i < kSystemTokens; ++i) context[s].push_back(token(s, i));
  }
  std::vector<TurnStats> turns(kTurns);
  RequestId next_id = 1;
  for (int t = 0; t < kTurns; ++t) {
    const PrefixCacheStats before = h.scheduler().counters().prefix_cache;
    for (int s = 0; s < sessions; ++s) {
      std::vector<TokenId>& ctx = context[s];
      for (int i = 0; i < kUserTokens; ++i) ctx.push_back(token(s, static_cast<int>(ctx.size())));
      RequestSpec spec = testing::Spec(next_id, ctx, kOutputTokens);
      spec.sampling_params.ignore_eos = true;
      EXPECT_TRUE(h.scheduler().AddRequest(spec).ok());
      // The "model" answers with session-specific tokens; the next turn carries them as context.
      h.set_sampler([&, s](RequestId, int32_t pos) { return token(s, pos); });
      std::vector<TokenId> answer;
      while (h.scheduler().has_unfinished_requests()) {
        for (const RequestOutput& o : h.Step().outputs) {
          answer.insert(answer.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }
      }
      EXPECT_EQ(answer.size(), static_cast<size_t>(kOutputTokens));
      ctx.insert(ctx.end(), answer.begin(), answer.end());
      ++next_id;
    }
    const PrefixCacheStats after = h.scheduler().counters().prefix_cache;
    turns[t].query_tokens = after.query_tokens - before.query_tokens;
    turns[t].hit_tokens = after.hit_tokens - before.hit_tokens;
    turns[t].context_blocks = static_cast<int32_t>(context[0].size()) / kBlockSize;
  }
  EXPECT_EQ(h.scheduler().counters().num_preemptions, 0);  // one request at a time: pure caching
  for (int t = 0; t < kTurns; ++t) {
    std::cout << sessions << " sessions, turn " << t << ": total context "
              << sessions * turns[t].context_blocks << " of " << kPoolBlocks << " blocks, hit rate "
              << turns[t].HitRate() << "\n";
  }
  return turns;
}

TEST(PrefixCacheCliffTest, HitRateHighWhileSessionsFit) {
  const int sessions = 3;  // at most 3 × 62 blocks of context: fits in 256
  const std::vector<TurnStats> turns = RunSessions(sessions);
  for (int t = 1; t < kTurns; ++t) {
    ASSERT_LE(sessions * turns[t].context_blocks, kPoolBlocks);
    EXPECT_GT(turns[t].HitRate(), 0.75) << "turn " << t;
  }
  EXPECT_EQ(turns[0].hit_tokens, 0);  // first turns share nothing
}

TEST(PrefixCacheCliffTest, HitRateCollapsesOnceTheyDoNot) {
  // 8 sessions: their contexts fit the pool for the first turns and outgrow it later.
  const int sessions = 8;
  const std::vector<TurnStats> turns = RunSessions(sessions);
  int fitting = 0, collapsed = 0;
  for (int t = 1; t < kTurns; ++t) {
    // What the sessions have cached when turn t starts.
    const int32_t footprint = sessions * turns[t - 1].context_blocks;
    if (footprint <= kPoolBlocks) {
      EXPECT_GT(turns[t].HitRate(), 0.75) << "turn " << t << " (fits)";
      ++fitting;
    } else if (footprint > kPoolBlocks + kPoolBlocks / 5) {
      EXPECT_LT(turns[t].HitRate(), 0.05) << "turn " << t << " (does not fit)";
      ++collapsed;
    }
  }
  EXPECT_GE(fitting, 2);
  EXPECT_GE(collapsed, 3);
}

}  // namespace
}  // namespace vamp
