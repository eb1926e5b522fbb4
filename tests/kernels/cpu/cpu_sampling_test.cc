// Tests of the CPU sampling kernel: greedy, temperature, top-k, top-p and seeded determinism.
#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling.h"

namespace vamp::kernels::cpu {
namespace {

struct Sampler {
  int vocab;
  std::vector<int32_t> idx_ws;
  std::vector<float> val_ws;
  explicit Sampler(int v) : vocab(v), idx_ws(v), val_ws(v) {}
  int32_t Draw(const std::vector<float>& logits, float temperature, int32_t top_k, float top_p,
               uint64_t seed, int64_t draw, float* logprob = nullptr) {
    int32_t token = -1;
    SampleTokens(logits.data(), vocab, 1, vocab, &temperature, &top_k, &top_p, &seed, &draw,
                 idx_ws.data(), val_ws.data(), &token, logprob);
    return token;
  }
};

TEST(SamplingTest, GreedyTakesFirstMaximumAndReportsLogprob) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f};
  Sampler s(4);
  float logprob = 0;
  EXPECT_EQ(s.Draw(logits, 0.0f, 0, 1.0f, 1, 0, &logprob), 1);
  const double den = 1 + 2 * std::exp(3.0) + std::exp(1.0);
  EXPECT_NEAR(logprob, 3.0 - std::log(den), 1e-6);
}

TEST(SamplingTest, TopKOneAndTinyTopPAreGreedy) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.9f, 0.0f};
  Sampler s(5);
  for (int64_t draw = 0; draw < 50; ++draw) {
    EXPECT_EQ(s.Draw(logits, 5.0f, 1, 1.0f, 7, draw), 2);
    EXPECT_EQ(s.Draw(logits, 5.0f, 0, 1e-6f, 7, draw), 2);
  }
}

TEST(SamplingTest, TopKRestrictsTheSupport) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.9f, 0.0f};
  Sampler s(5);
  std::map<int, int> counts;
  for (int64_t draw = 0; draw < 2000; ++draw) counts[s.Draw(logits, 1.0f, 2, 1.0f, 3, draw)]++;
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[3], 0);
}

TEST(SamplingTest, TopPKeepsTheSmallestPrefixReachingTheMass) {
  // Probabilities 0.5, 0.3, 0.2 (logits are their logs): top_p 0.7 keeps {0, 1}.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s(3);
  std::map<int, int> counts;
  const int n = 20000;
  for (int64_t draw = 0; draw < n; ++draw) counts[s.Draw(logits, 1.0f, 0, 0.7f, 11, draw)]++;
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_NEAR(counts[0] / double(n), 0.5 / 0.8, 0.02);
}

TEST(SamplingTest, FrequenciesFollowTheTemperatureScaledDistribution) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f, -1.0f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(4);
    std::vector<int> counts(4);
    const int n = 40000;
    for (int64_t draw = 0; draw < n; ++draw) counts[s.Draw(logits, t, 0, 1.0f, 5, draw)]++;
    double den = 0;
    for (float l : logits) den += std::exp(l / t);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(counts[i] / double(n), std::exp(logits[i] / t) / den, 0.015) << t << " " << i;
    }
  }
}

TEST(SamplingTest, SeededDrawsAreReproducibleAndBatchIndependent) {
  const int vocab = 50;
  std::vector<float> logits(3 * vocab);
  for (int i = 0; i < 3 * vocab; ++i) logits[i] = std::sin(i * 0.37f);
  const std::vector<float> temps = {0.8f, 1.0f, 1.3f};
  const std::vector<int32_t> top_ks = {0, 10, 0};
  const std::vector<float> top_ps = {1.0f, 1.0f, 0.9f};
  const std::vector<uint64_t> seeds = {1, 2, 3};
  const std::vector<int64_t> draws = {4, 5, 6};
  std::vector<int32_t> idx(3 * vocab), batch(3);
  std::vector<float> val(3 * vocab);
  SampleTokens(logits.data(), vocab, 3, vocab, temps.data(), top_ks.data(), top_ps.data(),
               seeds.data(), draws.data(), idx.data(), val.data(), batch.data(), nullptr);
  for (int r = 0; r < 3; ++r) {
    int32_t alone;
    SampleTokens(logits.data() + r * vocab, vocab, 1, vocab, &temps[r], &top_ks[r], &top_ps[r],
                 &seeds[r], &draws[r], idx.data(), val.data(), &alone, nullptr);
    EXPECT_EQ(alone, batch[r]) << r;
  }
  // Different draw indices of one seed give different uniforms.
  EXPECT_NE(UniformFromCounter(9, 0), UniformFromCounter(9, 1));
  EXPECT_NE(UniformFromCounter(9, 0), UniformFromCounter(10, 0));
  EXPECT_EQ(UniformFromCounter(9, 3), UniformFromCounter(9, 3));
  for (int i = 0; i < 1000; ++i) {
    const float u = UniformFromCounter(i, i * 7);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
}

TEST(TopLogprobsTest, ByHandWithTiesAndPadding) {
  // Row 0: log_softmax of {1, 3, 3, 0, 2} = x - 3 - log(e^-2 + 2 + e^-3 + e^-1)
  //   = x - 3.93726984; top 3: ids 1 and 2 tie (lower id first), then 4.
  // Row 1: k 2 of {0.5, -1, 0.5} = x - 1.29891618: ids 0, 2; the third slot is padding.
  // Row 2: k 0, all padding.
  const int64_t vocab = 5;
  const std::vector<float> logits = {1, 3, 3, 0, 2, 0.5f, -1, 0.5f, 9, 9, 7, 7, 7, 7, 7};
  const std::vector<int32_t> counts = {3, 2, 0};
  const int32_t max_k = 3;
  std::vector<int32_t> ids(9, 42);
  std::vector<float> lps(9, 42.0f);
  // Row 1 only reads its first 3 logits (vocab 3 is emulated by -inf on ids 3 and 4).
  std::vector<float> rows = logits;
  rows[8] = rows[9] = -INFINITY;
  TopLogprobs(rows.data(), vocab, 3, vocab, counts.data(), max_k, ids.data(), lps.data(), nullptr,
              nullptr);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4, 0, 2, -1, -1, -1, -1}));
  EXPECT_NEAR(lps[0], -0.93726984, 1e-6);
  EXPECT_NEAR(lps[1], -0.93726984, 1e-6);
  EXPECT_NEAR(lps[2], -1.93726984, 1e-6);
  EXPECT_NEAR(lps[3], -0.79891618, 1e-6);
  EXPECT_NEAR(lps[4], -0.79891618, 1e-6);
  for (int j : {5, 6, 7, 8}) EXPECT_EQ(lps[j], 0.0f) << j;
}

TEST(TopLogprobsTest, FirstEntryIsTheGreedyTokenWithTheSamplersLogprob) {
  const int64_t vocab = 40;
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = std::sin(0.7f * i) * 4;
  Sampler s(vocab);
  float logprob = 0;
  const int32_t token = s.Draw(logits, 0.0f, 0, 1.0f, 1, 0, &logprob);
  const int32_t count = kMaxTopLogprobs;
  std::vector<int32_t> ids(count);
  std::vector<float> lps(count);
  TopLogprobs(logits.data(), vocab, 1, vocab, &count, count, ids.data(), lps.data(), nullptr,
              nullptr);
  EXPECT_EQ(ids[0], token);
  EXPECT_EQ(lps[0], logprob);  // bit-identical
  for (int j = 1; j < count; ++j) {
    EXPECT_GE(lps[j - 1], lps[j]) << j;
    EXPECT_GE(logits[ids[j - 1]], logits[ids[j]]) << j;
  }
}

// The log probability of a given token (sampled from a processed copy of the row) against the
// raw row, by hand, with or without alternatives alongside; for the greedy token it is the
// sampler's out_logprobs bit for bit.
TEST(TopLogprobsTest, TokenLogprobsByHandAndAsTheSamplerReportsThem) {
  // Row 0 as in ByHandWithTiesAndPadding: x - 3.93726984; row 1: x - 1.29891618 (vocab 3 emulated
  // by -inf).
  const int64_t vocab = 5;
  const std::vector<float> logits = {1, 3, 3, 0, 2, 0.5f, -1, 0.5f, -INFINITY, -INFINITY};
  const std::vector<int32_t> tokens = {3, 1};
  const std::vector<int32_t> counts = {2, 0};
  std::vector<int32_t> ids(4, 42);
  std::vector<float> lps(4, 42.0f), token_lps(2, 42.0f), alone(2, 42.0f);
  TopLogprobs(logits.data(), vocab, 2, vocab, counts.data(), 2, ids.data(), lps.data(),
              tokens.data(), token_lps.data());
  EXPECT_NEAR(token_lps[0], -3.93726984, 1e-6);
  EXPECT_NEAR(token_lps[1], -2.29891618, 1e-6);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, -1, -1}));
  // Without alternatives (max_k 0: no top arrays needed) the same bits.
  TopLogprobs(logits.data(), vocab, 2, vocab, nullptr, 0, nullptr, nullptr, tokens.data(),
              alone.data());
  EXPECT_EQ(alone, token_lps);
  // The greedy token of a longer row: the sampler's logprob, bit for bit.
  const int64_t long_vocab = 40;
  std::vector<float> row(long_vocab);
  for (int64_t i = 0; i < long_vocab; ++i) row[i] = std::cos(0.3f * i) * 5;
  Sampler s(long_vocab);
  float greedy_lp = 0;
  const int32_t greedy = s.Draw(row, 0.0f, 0, 1.0f, 1, 0, &greedy_lp);
  float lp = 42.0f;
  TopLogprobs(row.data(), long_vocab, 1, long_vocab, nullptr, 0, nullptr, nullptr, &greedy, &lp);
  EXPECT_EQ(lp, greedy_lp);
}

TEST(ProcessLogitsTest, PenaltiesBansAndMinPByHand) {
  // Row 0: vocab 6, entries for tokens 1 (prompt only), 2 (generated twice), 3 (banned),
  // 4 (prompt and generated once). Row 1: min_p 0.5 at temperature 1.
  std::vector<float> logits = {1.0f, 2.0f,           -2.0f,          5.0f,           4.0f,  0.5f,
                               0.0f, std::log(0.6f), std::log(0.4f), std::log(0.2f), -9.0f, 0.0f};
  const std::vector<int32_t> offsets = {0, 4, 4}, tokens = {1, 2, 3, 4}, counts = {0, 2, 0, 1};
  const std::vector<uint8_t> flags = {kLogitInPrompt, 0, kLogitBanned, kLogitInPrompt};
  const std::vector<float> repetition = {2.0f, 1.0f}, frequency = {0.5f, 0.0f},
                           presence = {0.25f, 0.0f}, min_p = {0.0f, 0.5f}, temps = {1.0f, 1.0f};
  const LogitsProcessing p{offsets.data(),  tokens.data(),     counts.data(),
                           flags.data(),    repetition.data(), frequency.data(),
                           presence.data(), min_p.data(),      temps.data()};
  ProcessLogits(logits.data(), 6, 2, 6, p);
  EXPECT_EQ(logits[0], 1.0f);                  // no entry
  EXPECT_EQ(logits[1], 1.0f);                  // 2 / 2 (in the prompt, never generated)
  EXPECT_EQ(logits[2], -4.0f - 1.0f - 0.25f);  // -2 * 2, then 0.5 * 2 + 0.25
  EXPECT_EQ(logits[3], -INFINITY);             // banned
  EXPECT_EQ(logits[4], 2.0f - 0.5f - 0.25f);   // 4 / 2, then 0.5 * 1 + 0.25
  EXPECT_EQ(logits[5], 0.5f);
  // Row 1: probabilities relative to the largest (tokens 0 and 5, logit 0) of 0.6 stay; 0.4,
  // 0.2 and e^-9 are below min_p 0.5.
  EXPECT_EQ(logits[6], 0.0f);
  EXPECT_EQ(logits[7], std::log(0.6f));
  EXPECT_EQ(logits[8], -INFINITY);
  EXPECT_EQ(logits[9], -INFINITY);
  EXPECT_EQ(logits[10], -INFINITY);
  EXPECT_EQ(logits[11], 0.0f);
}

TEST(ProcessLogitsTest, GreedyRowsIgnoreMinP) {
  std::vector<float> logits = {3.0f, 0.0f, -1.0f};
  const std::vector<int32_t> offsets = {0, 0};
  const std::vector<float> one = {1.0f}, zero = {0.0f}, min_p = {0.9f}, greedy = {0.0f};
  const LogitsProcessing p{offsets.data(), nullptr,     nullptr,      nullptr,      one.data(),
                           zero.data(),    zero.data(), min_p.data(), greedy.data()};
  ProcessLogits(logits.data(), 3, 1, 3, p);
  EXPECT_EQ(logits, (std::vector<float>{3.0f, 0.0f, -1.0f}));
}

}  // namespace
}  // namespace vamp::kernels::cpu
