// vamp-bench's statistics against hand-computed values: percentiles, TPOT, the paper's
// measurement window (warm-up, end before drain, first turns left out) and Q(T, P).
#include "bench/stats/run_stats.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::bench {
namespace {

RequestRecord Req(int32_t session, int32_t turn, double issue, double first, double finish,
                  int32_t outputs, bool ok = true) {
  RequestRecord r;
  r.session = session;
  r.turn = turn;
  r.issue_s = issue;
  r.first_token_s = first;
  r.finish_s = finish;
  r.output_tokens = outputs;
  r.ok = ok;
  return r;
}

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  // Sorted: 1 2 3 4 10. Rank of p90 = 0.9 * 4 = 3.6 → 4 + 0.6 * (10 − 4) = 7.6.
  EXPECT_DOUBLE_EQ(Percentile({10, 1, 3, 2, 4}, 90), 7.6);
  EXPECT_DOUBLE_EQ(Percentile({10, 1, 3, 2, 4}, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile({10, 1, 3, 2, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile({10, 1, 3, 2, 4}, 100), 10);
  // p99 of 1..100: rank 98.01 → 99 + 0.01 = 99.01.
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_NEAR(Percentile(v, 99), 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_TRUE(std::isnan(Percentile({}, 50)));
  EXPECT_TRUE(std::isnan(Mean({})));
  EXPECT_DOUBLE_EQ(Mean({1, 2, 6}), 3);
}

TEST(RequestRecordTest, TpotIsTimeAfterTheFirstTokenPerLaterToken) {
  // First token at 1.5 s, finish at 2.4 s, 10 tokens: 0.9 s / 9 = 0.1 s.
  EXPECT_NEAR(Req(0, 0, 1.0, 1.5, 2.4, 10).Tpot(), 0.1, 1e-12);
  EXPECT_NEAR(Req(0, 0, 1.0, 1.5, 2.4, 10).Ttft(), 0.5, 1e-12);
  EXPECT_NEAR(Req(0, 0, 1.0, 1.5, 2.4, 10).E2e(), 1.4, 1e-12);
  EXPECT_EQ(Req(0, 0, 1.0, 1.5, 1.5, 1).Tpot(), 0);  // one token: no TPOT
  EXPECT_FALSE(Req(0, 0, 1.0, -1, -1, 0, false).Completed());
}

// Two sessions of three turns; session 1 starts late (at 2 s).
std::vector<RequestRecord> TwoSessions() {
  return {Req(0, 0, 0.0, 0.5, 1.0, 2), Req(0, 1, 1.5, 1.7, 2.0, 2), Req(1, 0, 2.0, 2.8, 3.0, 2),
          Req(0, 2, 2.5, 2.6, 4.0, 2), Req(1, 1, 3.5, 3.6, 5.0, 2), Req(1, 2, 5.5, 5.6, 6.0, 2)};
}

TEST(WindowTest, EndsWhenTheFirstSessionCompletesAfterAllStarted) {
  const std::vector<int32_t> turns = {3, 3};
  WindowRule rule;
  // All started at 2.0 (session 1's first issue); session 0 completes at 4.0 ≥ 2.0.
  Window w = MeasurementWindow(TwoSessions(), turns, rule);
  EXPECT_DOUBLE_EQ(w.start_s, 0);
  EXPECT_DOUBLE_EQ(w.end_s, 4.0);
  // Warm-up of 2 completed requests: the 2nd finish is at 2.0.
  rule.warmup_requests = 2;
  w = MeasurementWindow(TwoSessions(), turns, rule);
  EXPECT_DOUBLE_EQ(w.start_s, 2.0);
  EXPECT_DOUBLE_EQ(w.end_s, 4.0);
  // Without the drain rule: the last finish.
  rule.end_before_drain = false;
  w = MeasurementWindow(TwoSessions(), turns, rule);
  EXPECT_DOUBLE_EQ(w.end_s, 6.0);
}

TEST(WindowTest, SessionsDoneBeforeOthersStartDoNotEndIt) {
  // Session 0 (one turn) completes at 1.0, before session 1 starts at 2.0; session 1 at 3.0.
  std::vector<RequestRecord> r = {Req(0, 0, 0, 0.5, 1.0, 2), Req(1, 0, 2.0, 2.5, 3.0, 2)};
  Window w = MeasurementWindow(r, {1, 1}, WindowRule{});
  EXPECT_DOUBLE_EQ(w.end_s, 3.0);
  // A session that never started: the window runs to the last finish.
  w = MeasurementWindow(r, {1, 1, 1}, WindowRule{});
  EXPECT_DOUBLE_EQ(w.end_s, 3.0);
}

TEST(RunStatsTest, WindowPopulationsAndThroughput) {
  WindowRule rule;  // [0, 4]; first turns left out of TTFT
  RunStats s = ComputeRunStats(TwoSessions(), {3, 3}, rule);
  EXPECT_EQ(s.requests, 6);
  EXPECT_EQ(s.completed, 6);
  // Issued in [0, 4]: all but (1,1)@3.5? No: 3.5 ≤ 4 is inside; (1,2)@5.5 is out → 5.
  EXPECT_EQ(s.window_requests, 5);
  // Finished in [0, 4]: 1.0, 2.0, 3.0, 4.0 → 4, over 4 s → 1 req/s, 8 tokens → 2 tok/s.
  EXPECT_EQ(s.window_completed, 4);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 2.0);
  // TTFTs of window requests, turn 0 left out: (0,1) 0.2, (0,2) 0.1, (1,1) 0.1.
  EXPECT_EQ(s.ttft_s.count, 3);
  EXPECT_NEAR(s.ttft_s.max, 0.2, 1e-12);
  EXPECT_NEAR(s.ttft_s.p50, 0.1, 1e-12);
  rule.exclude_first_turn = false;
  s = ComputeRunStats(TwoSessions(), {3, 3}, rule);
  EXPECT_EQ(s.ttft_s.count, 5);
  EXPECT_NEAR(s.ttft_s.max, 0.8, 1e-12);
  // TPOT (2 tokens each): finish − first: 0.5, 0.3, 0.2, 1.4, 1.4 → mean 0.76.
  EXPECT_NEAR(s.tpot_s.mean, 0.76, 1e-12);
}

TEST(QGridTest, CountsQualifiedCompletionsPerSecondOfWindow) {
  Window w{0, 4};
  // Completed in the window with (TTFT, TPOT): (0.5, 0.5) (0.2, 0.3) (0.8, 0.2) (0.1, 1.4);
  // (1,1) and (1,2) finish after 4 s and do not count; a failed request never does.
  std::vector<RequestRecord> r = TwoSessions();
  r.push_back(Req(2, 0, 0.1, 0.2, 0.3, 2, /*ok=*/false));
  QGrid g = QualifiedThroughput(r, w, {0.3, 1.0}, {0.4, 2.0});
  ASSERT_EQ(g.q_per_s.size(), 2u);
  // T 0.3: (0.2,0.3) meets P 0.4; (0.1,1.4) and (0.2,0.3) meet P 2.0.
  EXPECT_DOUBLE_EQ(g.q_per_s[0][0], 1 / 4.0);
  EXPECT_DOUBLE_EQ(g.q_per_s[0][1], 2 / 4.0);
  // T 1.0: all four have TTFT ≤ 1; TPOT ≤ 0.4: (0.2,0.3) and (0.8,0.2).
  EXPECT_DOUBLE_EQ(g.q_per_s[1][0], 2 / 4.0);
  EXPECT_DOUBLE_EQ(g.q_per_s[1][1], 4 / 4.0);
  // An empty window gives zeros, not a division by zero.
  g = QualifiedThroughput(r, Window{1, 1}, {1}, {1});
  EXPECT_EQ(g.q_per_s[0][0], 0);
}

TEST(QGridTest, CellsWonShareTiesAndSkipEmptyCells) {
  QGrid a{{1, 2}, {1}, {{0.5}, {1.0}}}, b{{1, 2}, {1}, {{0.5}, {0.8}}}, none{{1, 2}, {1}, {{0}, {0}}};
  // Row 0: a and b tie; row 1: a wins.
  EXPECT_EQ(CellsWon({&a, &b}), (std::vector<int>{2, 1}));
  // A configuration not measured at this point wins nothing; a cell nobody met counts for nobody.
  EXPECT_EQ(CellsWon({nullptr, &b}), (std::vector<int>{0, 2}));
  EXPECT_EQ(CellsWon({&none, &none}), (std::vector<int>{0, 0}));
  EXPECT_EQ(CellsWon({nullptr}), (std::vector<int>{0}));
}

TEST(QGridTest, NearlyEqualCellsTie) {
  QGrid a{{1}, {1}, {{1.000}}}, b{{1}, {1}, {{0.995}}}, c{{1}, {1}, {{0.97}}};
  EXPECT_EQ(CellsWon({&a, &b, &c}), (std::vector<int>{1, 1, 0}));  // 0.5 % behind ties; 3 % loses
  EXPECT_EQ(CellsWon({&a, &b, &c}, 0.0), (std::vector<int>{1, 0, 0}));
}

TEST(QGridTest, CompareQCellByCell) {
  // 2x2: ratios 2 and 0.5 where both qualify; one cell only the candidate, one only the baseline.
  QGrid cand{{1, 2}, {1, 2}, {{2.0, 1.0}, {0.5, 0.0}}};
  QGrid base{{1, 2}, {1, 2}, {{1.0, 0.0}, {1.0, 3.0}}};
  QComparison q = CompareQ(cand, base);
  EXPECT_EQ(q.cells, 2);
  EXPECT_DOUBLE_EQ(q.geomean_ratio, 1.0);
  EXPECT_DOUBLE_EQ(q.worst_ratio, 0.5);
  EXPECT_DOUBLE_EQ(q.best_ratio, 2.0);
  EXPECT_EQ(q.only_candidate, 1);
  EXPECT_EQ(q.only_baseline, 1);
  EXPECT_EQ(CompareQ(base, base).worst_ratio, 1.0);
  EXPECT_EQ(DescribeQComparison(q),
            "×1.000 (worst ×0.500, best ×2.000); 1 cells only it; 1 cells only the baseline");
  EXPECT_EQ(DescribeQComparison(QComparison{}), "–");
}

TEST(AutoLimitsTest, PooledPercentilesRoundedToTwoDigitsAndIncreasing) {
  std::vector<double> v;
  for (int i = 1; i <= 101; ++i) v.push_back(i * 0.0123);
  // Closest ranks 25, 50, 75, 90, 99: 0.3198, 0.6273, 0.9348, 1.1193, 1.23, each to two digits.
  EXPECT_THAT(AutoLimits(v), ::testing::Pointwise(::testing::DoubleNear(1e-12),
                                                  std::vector<double>{0.32, 0.63, 0.93, 1.1, 1.2}));
  // Repeats collapse (the grid never has two equal limits); nothing measured gives one limit.
  EXPECT_EQ(AutoLimits({2.0, 2.0, 2.0}), (std::vector<double>{2.0}));
  EXPECT_EQ(AutoLimits({}), (std::vector<double>{1.0}));
}

}  // namespace
}  // namespace vamp::bench
