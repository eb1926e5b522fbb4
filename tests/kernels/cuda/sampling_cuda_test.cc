// CUDA token sampling (kernels/cuda/sampling.h) against the CPU twin (kernels/cpu/sampling.h):
// GreedySample, and SampleTokens over many rows and parameter mixes, uniform draws, frequencies,
// argument checks (these run without a GPU) and a timing print; ProcessLogits (penalties,
// min_tokens bans, min_p) against cpu::ProcessLogits; TopLogprobs against cpu::TopLogprobs.
//
// Tokens must equal the CPU's. Both sides compute every probability as a float32 expf of the same
// float argument and accumulate in double, but CUDA's expf may differ from glibc's by an ulp and
// the device sums in another order, so a draw landing within ~1e-7 (relative) of a cumulative
// boundary may pick the neighbouring token. The chance is ~1e-7 per row, so a test tolerates at
// most kMaxBoundaryMismatches such rows, and only when the two tokens are adjacent in the CPU's
// cumulative order (greedy rows: none). Logprobs: within 1e-4 absolute of the token's
// log_softmax in double (both sides sum ~152k exp terms, ~1e-7 apart).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr int kMaxBoundaryMismatches = 2;
constexpr double kLogprobTol = 1e-4;
constexpr int64_t kQwenVocab = 151936;

// ---------------------------------------------------------------------------------------------
// GreedySample (moved here from norm_rope_cuda_test.cc).

using GreedySampleTest = CudaTest;

TEST_F(GreedySampleTest, GreedyMatchesCpuIncludingTies) {
  // Qwen3 vocabulary, a small one, and one shorter than a warp.
  for (const int64_t vocab : {kQwenVocab, int64_t{1000}, int64_t{7}}) {
    const int64_t rows = 5, stride = vocab + 4;
    auto logits = RandomFloats(rows * stride, 41, 2.0f);
    // Row 1: the maximum appears twice (the lower index must win); row 2: three times at the
    // end of the row; row 3: constant row (index 0 wins).
    auto place_max = [&](int64_t r, std::vector<int64_t> at) {
      for (int64_t i : at) logits[r * stride + i] = 50.0f;
    };
    place_max(1, {vocab / 2, vocab - 1});
    place_max(2, {vocab - 3, vocab - 2, vocab - 1});
    for (int64_t i = 0; i < vocab; ++i) logits[3 * stride + i] = 0.5f;
    std::vector<float> temps(rows, 0.0f), top_ps(rows, 1.0f);
    std::vector<int32_t> top_ks(rows, 0), index_ws(rows * vocab);
    std::vector<uint64_t> seeds(rows, 1);
    std::vector<int64_t> draws(rows, 0);
    std::vector<float> value_ws(rows * vocab), want_lp(rows);
    std::vector<int32_t> want(rows);
    cpu::SampleTokens(logits.data(), stride, rows, vocab, temps.data(), top_ks.data(),
                      top_ps.data(), seeds.data(), draws.data(), index_ws.data(), value_ws.data(),
                      want.data(), want_lp.data());
    int32_t* d_tokens = Alloc<int32_t>(rows);
    float* d_lp = Alloc<float>(rows);
    VAMP_ASSERT_OK(GreedySample(Upload(logits), stride, rows, vocab, d_tokens, d_lp, stream_));
    EXPECT_EQ(Download(d_tokens, rows), want) << "vocab " << vocab;
    // log(sum of exp) over up to 151936 terms summed in float32 (CPU: double): ~1e-6 relative.
    ExpectClose(Download(d_lp, rows), want_lp, 1e-5, "logprobs vocab " + std::to_string(vocab));
    // Without logprobs the tokens are the same.
    int32_t* d_tokens2 = Alloc<int32_t>(rows);
    VAMP_ASSERT_OK(GreedySample(Upload(logits), stride, rows, vocab, d_tokens2, nullptr, stream_));
    EXPECT_EQ(Download(d_tokens2, rows), want) << "vocab " << vocab << " without logprobs";
  }
}

// ---------------------------------------------------------------------------------------------
// SampleTokens helpers.

struct RowParams {
  float temperature;
  int32_t top_k;
  float top_p;
  uint64_t seed = 0;
  int64_t draw = 0;
};

// Rows of logits with their sampling parameters, as the engine hands them over.
struct Batch {
  int64_t vocab = 0;
  int64_t stride = 0;
  std::vector<float> logits;  // rows * stride; the padding holds a NaN that must never be read
  std::vector<RowParams> params;
  int64_t rows() const { return static_cast<int64_t>(params.size()); }
  const float* row(int64_t r) const { return logits.data() + r * stride; }
};

struct Sampled {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

enum class Dist {
  kNormal,    // N(0, 1): a flat-ish row, top-p keeps tens of thousands of tokens
  kLlmLike,   // N(0, 2) plus 16 head tokens 12..22 above: peaked, as LLM logits
  kPeaked,    // N(0, 1) plus one token at +30
  kFlat,      // N(0, 1e-3)
  kConstant,  // every logit 0.5: all ties
  kTies,      // N(0, 2) rounded to quarters: many exact ties
  kMasked,    // N(0, 2) with every third token at -inf
  kWide,      // N(0, 4)
};
constexpr Dist kAllDists[] = {Dist::kNormal,   Dist::kLlmLike, Dist::kPeaked, Dist::kFlat,
                              Dist::kConstant, Dist::kTies,    Dist::kMasked, Dist::kWide};

void FillRow(Dist dist, std::mt19937& rng, float* row, int64_t vocab) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scale = dist == Dist::kFlat     ? 1e-3f
                      : dist == Dist::kWide   ? 4.0f
                      : dist == Dist::kNormal ? 1.0f
                      : dist == Dist::kPeaked ? 1.0f
                                              : 2.0f;
  for (int64_t i = 0; i < vocab; ++i) row[i] = scale * normal(rng);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  switch (dist) {
    case Dist::kLlmLike: {
      std::uniform_real_distribution<float> head(12.0f, 22.0f);
      for (int h = 0; h < 16; ++h) row[token(rng)] = head(rng);
      break;
    }
    case Dist::kPeaked:
      row[token(rng)] = 30.0f;
      break;
    case Dist::kConstant:
      std::fill(row, row + vocab, 0.5f);
      break;
    case Dist::kTies:
      for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 4.0f) / 4.0f;
      break;
    case Dist::kMasked:
      for (int64_t i = 0; i < vocab; i += 3) row[i] = -INFINITY;
      break;
    default:
      break;
  }
}

// Every path of the sampler: greedy, temperature only (also with top_k <= 0 or >= vocab), top-k
// (1, small, beyond the shared-memory candidates, at a tiny temperature), top-p (tiny, zero, usual,
// near 1), and both.
std::vector<RowParams> ParameterMix(int64_t vocab) {
  const int32_t v = static_cast<int32_t>(vocab);
  return {
      {0.0f, 0, 1.0f},   {0.0f, 50, 0.9f},    {-1.0f, 0, 1.0f}, {1.0f, 0, 1.0f},
      {0.7f, 0, 1.0f},   {1.5f, -1, 1.0f},    {1.0f, v, 1.0f},  {1.0f, v + 10, 1.0f},
      {1.0f, 1, 1.0f},   {1.0f, 5, 1.0f},     {0.8f, 50, 1.0f}, {1.0f, 5000, 1.0f},
      {0.05f, 50, 1.0f}, {1.0f, 0, 0.9f},     {1.0f, 0, 0.5f},  {1.0f, 0, 0.99f},
      {1.0f, 0, 1e-6f},  {1.0f, 0, 0.0f},     {2.0f, 0, 0.95f}, {0.6f, 0, 0.95f},
      {1.0f, 40, 0.9f},  {0.8f, 1000, 0.95f}, {0.3f, 20, 0.8f}, {1.0f, 1, 0.5f},
  };
}

// Every distribution with every parameter mix, random seeds and draw indices.
Batch MixedBatch(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.vocab = vocab;
  b.stride = vocab + 3;
  const std::vector<RowParams> mix = ParameterMix(vocab);
  b.logits.assign(std::size(kAllDists) * mix.size() * b.stride, NAN);
  for (Dist dist : kAllDists) {
    for (RowParams p : mix) {
      p.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
      p.draw = rng() % 100000;
      FillRow(dist, rng, b.logits.data() + b.rows() * b.stride, vocab);
      b.params.push_back(p);
    }
  }
  return b;
}

Sampled SampleOnCpu(const Batch& b) {
  Sampled out;
  out.tokens.resize(b.rows());
  out.logprobs.resize(b.rows());
  std::vector<int32_t> index_ws(b.vocab);
  std::vector<float> value_ws(b.vocab);
  for (int64_t r = 0; r < b.rows(); ++r) {
    const RowParams& p = b.params[r];
    cpu::SampleTokens(b.row(r), b.stride, 1, b.vocab, &p.temperature, &p.top_k, &p.top_p, &p.seed,
                      &p.draw, index_ws.data(), value_ws.data(), &out.tokens[r], &out.logprobs[r]);
  }
  return out;
}

// log_softmax(row)[token] in double.
double LogSoftmax(const float* row, int64_t vocab, int32_t token) {
  double max_value = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) max_value = std::max<double>(max_value, row[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max_value);
  return row[token] - max_value - std::log(sum);
}

// Position of `token` in the CPU's cumulative order for the row: token ids when neither top-k
// nor top-p applies, else descending logits with ties by id.
int64_t CumulativePosition(const float* row, int64_t vocab, const RowParams& p, int32_t token) {
  const int64_t k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  if (!(k < vocab || p.top_p < 1.0f)) return token;
  int64_t before = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    before += row[i] > row[token] || (row[i] == row[token] && i < token);
  }
  return before;
}

// The checks described at the top of the file; returns the number of boundary mismatches.
int ExpectMatchesCpu(const Batch& b, const Sampled& gpu, const Sampled& cpu,
                     const std::string& what) {
  int boundary = 0;
  for (int64_t r = 0; r < b.rows(); ++r) {
    const RowParams& p = b.params[r];
    const std::string row_what =
        what + " row " + std::to_string(r) + " (T " + std::to_string(p.temperature) + ", top_k " +
        std::to_string(p.top_k) + ", top_p " + std::to_string(p.top_p) + ")";
    const int32_t got = gpu.tokens[r];
    const int32_t want = cpu.tokens[r];
    if (got < 0 || got >= b.vocab) {
      ADD_FAILURE() << row_what << ": token " << got << " out of range";
      continue;
    }
    if (got != want) {
      const int64_t distance = std::abs(CumulativePosition(b.row(r), b.vocab, p, got) -
                                        CumulativePosition(b.row(r), b.vocab, p, want));
      EXPECT_TRUE(p.temperature > 0.0f && distance == 1)
          << row_what << ": token " << got << ", CPU " << want << ", " << distance
          << " apart in the cumulative order";
      ++boundary;
    }
    if (!gpu.logprobs.empty()) {
      EXPECT_NEAR(gpu.logprobs[r], LogSoftmax(b.row(r), b.vocab, got), kLogprobTol) << row_what;
      if (got == want) {
        EXPECT_NEAR(gpu.logprobs[r], cpu.logprobs[r], kLogprobTol) << row_what;
      }
    }
  }
  EXPECT_LE(boundary, kMaxBoundaryMismatches) << what << ": boundary mismatches";
  std::cout << what << ": " << b.rows() << " rows, " << boundary << " boundary mismatches\n";
  return boundary;
}

class SampleTokensTest : public CudaTest {
 protected:
  // Device copies of a batch's inputs and outputs.
  struct DeviceBatch {
    const float* logits;
    const float* temperatures;
    const int32_t* top_ks;
    const float* top_ps;
    const uint64_t* seeds;
    const int64_t* draws;
    void* workspace;
    int64_t workspace_bytes;
    int32_t* tokens;
    float* logprobs;
  };

  void UploadBatch(const Batch& b, DeviceBatch* d) {
    std::vector<float> temps, top_ps;
    std::vector<int32_t> top_ks;
    std::vector<uint64_t> seeds;
    std::vector<int64_t> draws;
    for (const RowParams& p : b.params) {
      temps.push_back(p.temperature);
      top_ks.push_back(p.top_k);
      top_ps.push_back(p.top_p);
      seeds.push_back(p.seed);
      draws.push_back(p.draw);
    }
    d->logits = Upload(b.logits);
    d->temperatures = Upload(temps);
    d->top_ks = Upload(top_ks);
    d->top_ps = Upload(top_ps);
    d->seeds = Upload(seeds);
    d->draws = Upload(draws);
    d->workspace_bytes = SampleTokensWorkspaceBytes(b.rows(), b.vocab);
    d->workspace = Alloc<uint8_t>(d->workspace_bytes);
    d->tokens = Alloc<int32_t>(b.rows());
    d->logprobs = Alloc<float>(b.rows());
  }

  absl::Status Launch(const Batch& b, const DeviceBatch& d, bool with_logprobs) {
    return SampleTokens(d.logits, b.stride, b.rows(), b.vocab, d.temperatures, d.top_ks, d.top_ps,
                        d.seeds, d.draws, d.workspace, d.workspace_bytes, d.tokens,
                        with_logprobs ? d.logprobs : nullptr, stream_);
  }

  // SampleTokens on the device; out->logprobs stays empty when with_logprobs is false.
  void SampleOnGpu(const Batch& b, bool with_logprobs, Sampled* out) {
    DeviceBatch d;
    UploadBatch(b, &d);
    VAMP_ASSERT_OK(Launch(b, d, with_logprobs));
    out->tokens = Download(d.tokens, b.rows());
    if (with_logprobs) out->logprobs = Download(d.logprobs, b.rows());
  }
};

// ---------------------------------------------------------------------------------------------
// SampleTokens against the CPU.

TEST_F(SampleTokensTest, MatchesCpuOverParameterMixes) {
  for (const int64_t vocab : {int64_t{256}, int64_t{1000}, kQwenVocab}) {
    for (uint32_t seed : {1u, 2u}) {
      const Batch b = MixedBatch(vocab, seed);
      const Sampled cpu = SampleOnCpu(b);
      Sampled gpu;
      SampleOnGpu(b, /*with_logprobs=*/true, &gpu);
      ASSERT_FALSE(HasFatalFailure());
      const std::string what = "vocab " + std::to_string(vocab) + " seed " + std::to_string(seed);
      ExpectMatchesCpu(b, gpu, cpu, what);
      // Logprobs change nothing else.
      Sampled gpu_no_lp;
      SampleOnGpu(b, /*with_logprobs=*/false, &gpu_no_lp);
      EXPECT_EQ(gpu_no_lp.tokens, gpu.tokens) << what << " without logprobs";
    }
  }
}

// Constant rows make the cumulative sums exact integers on both sides, so the token is
// floor(U * kept) exactly: any difference in the counter-based draw shows.
TEST_F(SampleTokensTest, UniformDrawIsBitExact) {
  const int64_t vocab = 1000;
  Batch b;
  b.vocab = vocab;
  b.stride = vocab;
  for (int64_t i = 0; i < 2048; ++i) {
    // Token order (no top-k/top-p), and descending order (ties by id) with top-p 0.5 and top-k.
    const RowParams mixes[] = {{1.0f, 0, 1.0f}, {0.5f, 0, 0.5f}, {2.0f, 300, 1.0f}};
    RowParams p = mixes[i % 3];
    p.seed = 0x5eed0000ull + static_cast<uint64_t>(i / 7);
    p.draw = i * 7919;
    b.params.push_back(p);
  }
  b.logits.assign(b.rows() * b.stride, -1.25f);
  const Sampled cpu = SampleOnCpu(b);
  Sampled gpu;
  SampleOnGpu(b, /*with_logprobs=*/true, &gpu);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  ExpectClose(gpu.logprobs, cpu.logprobs, 1e-6, "constant-row logprobs");
  // The draws cover the support: token order reaches the top of the row.
  EXPECT_GT(*std::max_element(gpu.tokens.begin(), gpu.tokens.end()), vocab * 9 / 10);
}

// Many draws of one small distribution: frequencies match the renormalised probabilities.
TEST_F(SampleTokensTest, FrequenciesMatchTheDistribution) {
  const std::vector<double> probs = {0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01};
  const int64_t vocab = static_cast<int64_t>(probs.size());
  const int64_t draws = 100000;
  struct Case {
    RowParams params;
    std::vector<double> expected;  // renormalised over the kept tokens
  };
  std::vector<double> sqrt_probs;
  for (double p : probs) sqrt_probs.push_back(std::sqrt(p));
  const std::vector<Case> cases = {
      {{1.0f, 0, 1.0f}, probs},
      {{1.0f, 3, 1.0f}, {0.4, 0.2, 0.15}},
      {{1.0f, 0, 0.7f}, {0.4, 0.2, 0.15}},  // 0.4 + 0.2 < 0.7 <= 0.4 + 0.2 + 0.15
      {{2.0f, 0, 1.0f}, sqrt_probs},        // T = 2: p^(1/2)
      {{1.0f, 5, 0.5f}, {0.4, 0.2}},
  };
  for (const Case& c : cases) {
    Batch b;
    b.vocab = vocab;
    b.stride = vocab;
    for (int64_t i = 0; i < draws; ++i) {
      RowParams p = c.params;
      p.seed = 42;
      p.draw = i;
      b.params.push_back(p);
      for (double q : probs) b.logits.push_back(static_cast<float>(std::log(q)));
    }
    Sampled gpu;
    SampleOnGpu(b, /*with_logprobs=*/false, &gpu);
    ASSERT_FALSE(HasFatalFailure());
    const Sampled cpu = SampleOnCpu(b);
    const std::string what = "T " + std::to_string(c.params.temperature) + " top_k " +
                             std::to_string(c.params.top_k) + " top_p " +
                             std::to_string(c.params.top_p);
    int mismatches = 0;
    for (int64_t i = 0; i < draws; ++i) mismatches += gpu.tokens[i] != cpu.tokens[i];
    EXPECT_LE(mismatches, kMaxBoundaryMismatches) << what;
    std::vector<int64_t> counts(vocab, 0);
    for (int32_t t : gpu.tokens) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ++counts[t];
    }
    const double norm = std::accumulate(c.expected.begin(), c.expected.end(), 0.0);
    for (int64_t t = 0; t < vocab; ++t) {
      const double q = t < static_cast<int64_t>(c.expected.size()) ? c.expected[t] / norm : 0.0;
      const double freq = static_cast<double>(counts[t]) / draws;
      // Five standard deviations of a binomial frequency (zero for tokens outside the support).
      EXPECT_NEAR(freq, q, 5.0 * std::sqrt(q * (1.0 - q) / draws)) << what << " token " << t;
    }
  }
}

// 64 rows of the Qwen3 vocabulary, as a decode step at batch 64: the time per call for each kind
// of row (printed for the log, not asserted), with the tokens checked against the CPU. LLM-like
// rows keep a handful of top-p candidates (shared-memory sort); the normal rows are the slow case,
// a top-p prefix of tens of thousands of tokens (radix sort in the workspace).
TEST_F(SampleTokensTest, TimingQwenVocabBatch64) {
  const int64_t vocab = kQwenVocab, rows = 64;
  struct Case {
    std::string name;
    Dist dist;
    RowParams params;
  };
  const std::vector<Case> cases = {
      {"greedy", Dist::kLlmLike, {0.0f, 0, 1.0f}},
      {"temperature 0.8", Dist::kLlmLike, {0.8f, 0, 1.0f}},
      {"top_k 50", Dist::kLlmLike, {0.8f, 50, 1.0f}},
      {"top_p 0.9, LLM-like logits (shared-memory candidates)", Dist::kLlmLike, {1.0f, 0, 0.9f}},
      {"top_k 50 + top_p 0.9, LLM-like logits", Dist::kLlmLike, {0.7f, 50, 0.9f}},
      {"top_p 0.9, N(0,1) logits (~99k candidates, radix sort)", Dist::kNormal, {1.0f, 0, 0.9f}},
      {"top_p 0.9, N(0,2) quantised logits (~50k candidates, radix sort)",
       Dist::kTies,
       {1.0f, 0, 0.9f}},
  };
  cudaEvent_t start, stop;
  VAMP_ASSERT_CUDA(cudaEventCreate(&start));
  VAMP_ASSERT_CUDA(cudaEventCreate(&stop));
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    Batch b;
    b.vocab = vocab;
    b.stride = vocab;
    b.logits.resize(rows * vocab);
    for (int64_t r = 0; r < rows; ++r) {
      RowParams p = c.params;
      p.seed = rng();
      p.draw = r;
      b.params.push_back(p);
      FillRow(c.dist, rng, b.logits.data() + r * vocab, vocab);
    }
    DeviceBatch d;
    UploadBatch(b, &d);
    ASSERT_FALSE(HasFatalFailure());
    for (int i = 0; i < 3; ++i) VAMP_ASSERT_OK(Launch(b, d, /*with_logprobs=*/true));
    constexpr int kIterations = 20;
    VAMP_ASSERT_CUDA(cudaEventRecord(start, stream_));
    for (int i = 0; i < kIterations; ++i) VAMP_ASSERT_OK(Launch(b, d, /*with_logprobs=*/true));
    VAMP_ASSERT_CUDA(cudaEventRecord(stop, stream_));
    VAMP_ASSERT_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    VAMP_ASSERT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    std::cout << "SampleTokens 64 x " << vocab << ", " << c.name << ": " << ms / kIterations
              << " ms per call\n";
    Sampled gpu;
    gpu.tokens = Download(d.tokens, rows);
    gpu.logprobs = Download(d.logprobs, rows);
    const auto cpu_start = std::chrono::steady_clock::now();
    const Sampled cpu = SampleOnCpu(b);
    const double cpu_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start)
            .count();
    std::cout << "  (cpu::SampleTokens, one thread: " << cpu_ms << " ms)\n";
    ExpectMatchesCpu(b, gpu, cpu, c.name);
  }
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(stop), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// Argument checks: rejected on the host before anything is enqueued, so these run without a GPU.

TEST(SampleTokensArgsTest, WorkspaceBytes) {
  EXPECT_EQ(SampleTokensWorkspaceBytes(64, kQwenVocab), 64 * kQwenVocab * 8);
  EXPECT_EQ(SampleTokensWorkspaceBytes(1, 7), 56);
  EXPECT_EQ(SampleTokensWorkspaceBytes(0, kQwenVocab), 0);
  EXPECT_EQ(SampleTokensWorkspaceBytes(64, 0), 0);
  EXPECT_EQ(SampleTokensWorkspaceBytes(int64_t{1} << 40, int64_t{1} << 30), INT64_MAX);
}

TEST(SampleTokensArgsTest, RejectsBadArgumentsWithoutLaunching) {
  // Host pointers stand in for device ones: none is dereferenced when the arguments are bad.
  const int64_t rows = 2, vocab = 16;
  std::vector<float> logits(rows * vocab), temps(rows), top_ps(rows), logprobs(rows);
  std::vector<int32_t> top_ks(rows), tokens(rows);
  std::vector<uint64_t> seeds(rows);
  std::vector<int64_t> draws(rows);
  std::vector<int32_t> workspace(rows * vocab * 2);
  const int64_t ws_bytes = SampleTokensWorkspaceBytes(rows, vocab);
  auto call = [&](int64_t num_rows, int64_t v, int64_t stride, const float* l, void* ws,
                  int64_t ws_size, int32_t* out) {
    return SampleTokens(l, stride, num_rows, v, temps.data(), top_ks.data(), top_ps.data(),
                        seeds.data(), draws.data(), ws, ws_size, out, logprobs.data(), nullptr);
  };
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(call(-1, vocab, vocab, logits.data(), workspace.data(), ws_bytes, tokens.data()).code(),
            invalid);
  EXPECT_EQ(call(rows, 0, vocab, logits.data(), workspace.data(), ws_bytes, tokens.data()).code(),
            invalid);
  EXPECT_EQ(call(rows, int64_t{1} << 31, int64_t{1} << 31, logits.data(), workspace.data(),
                 ws_bytes, tokens.data())
                .code(),
            invalid);
  EXPECT_EQ(
      call(rows, vocab, vocab - 1, logits.data(), workspace.data(), ws_bytes, tokens.data()).code(),
      invalid);
  EXPECT_EQ(call(rows, vocab, vocab, nullptr, workspace.data(), ws_bytes, tokens.data()).code(),
            invalid);
  EXPECT_EQ(call(rows, vocab, vocab, logits.data(), workspace.data(), ws_bytes, nullptr).code(),
            invalid);
  EXPECT_EQ(call(rows, vocab, vocab, logits.data(), nullptr, ws_bytes, tokens.data()).code(),
            invalid);
  const absl::Status short_ws =
      call(rows, vocab, vocab, logits.data(), workspace.data(), ws_bytes - 1, tokens.data());
  EXPECT_EQ(short_ws.code(), invalid);
  EXPECT_NE(short_ws.message().find(std::to_string(ws_bytes)), absl::string_view::npos) << short_ws;
  void* misaligned = reinterpret_cast<char*>(workspace.data()) + 1;
  EXPECT_EQ(call(rows, vocab, vocab, logits.data(), misaligned, ws_bytes, tokens.data()).code(),
            invalid);
  // No rows: nothing to do, whatever the pointers.
  EXPECT_TRUE(call(0, vocab, vocab, nullptr, nullptr, 0, nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// ProcessLogits: penalties, min_tokens bans and min_p against cpu::ProcessLogits.

// Host arrays of a LogitsProcessing: per row, `entries` random distinct tokens with counts and
// flags, and the row's parameters.
struct Processing {
  std::vector<int32_t> offsets{0}, tokens, counts;
  std::vector<uint8_t> flags;
  std::vector<float> repetition, frequency, presence, min_p, temperature;
  cpu::LogitsProcessing View() const {
    return {offsets.data(),   tokens.data(),   counts.data(), flags.data(),      repetition.data(),
            frequency.data(), presence.data(), min_p.data(),  temperature.data()};
  }
};

struct RowProcessing {
  int entries;
  float repetition, frequency, presence, min_p, temperature;
};

Processing MakeProcessing(const std::vector<RowProcessing>& rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Processing p;
  for (const RowProcessing& r : rows) {
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    // A row cannot name more distinct tokens than the vocabulary holds.
    const int64_t entries = std::min<int64_t>(r.entries, vocab);
    for (int64_t e = 0; e < entries; ++e) {
      p.tokens.push_back(ids[e]);
      p.counts.push_back(static_cast<int32_t>(rng() % 4));  // 0: a prompt-only token
      p.flags.push_back(static_cast<uint8_t>(rng() % 4));   // in prompt and/or banned
    }
    p.offsets.push_back(static_cast<int32_t>(p.tokens.size()));
    p.repetition.push_back(r.repetition);
    p.frequency.push_back(r.frequency);
    p.presence.push_back(r.presence);
    p.min_p.push_back(r.min_p);
    p.temperature.push_back(r.temperature);
  }
  return p;
}

using ProcessLogitsTest = CudaTest;

TEST_F(ProcessLogitsTest, MatchesCpuAndSamplingAfterwardsAgrees) {
  const std::vector<RowProcessing> rows = {
      {0, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f},       // nothing to do
      {300, 1.3f, 0.0f, 0.0f, 0.0f, 0.8f},     // repetition only
      {300, 1.0f, 0.7f, 0.4f, 0.0f, 1.0f},     // frequency and presence
      {2000, 0.7f, -0.5f, -1.5f, 0.0f, 1.0f},  // rewarding repetition (penalties < 1 / < 0)
      {50, 1.2f, 0.2f, 0.2f, 0.05f, 0.7f},     // all of them and min_p
      {10, 1.0f, 0.0f, 0.0f, 0.3f, 1.5f},      // min_p, a high temperature
      {10, 1.1f, 0.0f, 0.0f, 0.5f, 0.0f},      // min_p on a greedy row: no mask
  };
  for (const int64_t vocab : {kQwenVocab, int64_t{1000}}) {
    const int64_t n = static_cast<int64_t>(rows.size()), stride = vocab + 3;
    std::vector<float> logits = RandomFloats(n * stride, 77, 3.0f);
    const Processing p = MakeProcessing(rows, vocab, 5);
    std::vector<float> want = logits;
    cpu::ProcessLogits(want.data(), stride, n, vocab, p.View());

    float* d_logits = Upload(logits);
    const cpu::LogitsProcessing d{Upload(p.offsets),  Upload(p.tokens),     Upload(p.counts),
                                  Upload(p.flags),    Upload(p.repetition), Upload(p.frequency),
                                  Upload(p.presence), Upload(p.min_p),      Upload(p.temperature)};
    VAMP_ASSERT_OK(ProcessLogits(d_logits, stride, n, vocab, d, stream_));
    const std::vector<float> got = Download(d_logits, n * stride);
    int boundary = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < vocab; ++i) {
        const float a = want[r * stride + i], b = got[r * stride + i];
        if (a == b || (std::isinf(a) && std::isinf(b) && a < 0 && b < 0)) continue;
        // Only the min_p mask may differ, and only for a token at the boundary (expf ulps).
        ++boundary;
        EXPECT_TRUE(std::isinf(a) != std::isinf(b))
            << "vocab " << vocab << " row " << r << " token " << i << ": " << a << " vs " << b;
      }
    }
    EXPECT_LE(boundary, kMaxBoundaryMismatches) << "vocab " << vocab;
    // The processed rows sample the same tokens on both sides.
    std::vector<int32_t> top_ks(n, 0), index_ws(n * vocab), want_tokens(n);
    std::vector<float> top_ps(n, 1.0f), value_ws(n * vocab);
    std::vector<uint64_t> seeds(n, 9);
    std::vector<int64_t> draws(n);
    std::iota(draws.begin(), draws.end(), 0);
    cpu::SampleTokens(want.data(), stride, n, vocab, p.temperature.data(), top_ks.data(),
                      top_ps.data(), seeds.data(), draws.data(), index_ws.data(), value_ws.data(),
                      want_tokens.data(), nullptr);
    void* ws = Alloc<uint8_t>(SampleTokensWorkspaceBytes(n, vocab));
    int32_t* d_tokens = Alloc<int32_t>(n);
    VAMP_ASSERT_OK(SampleTokens(d_logits, stride, n, vocab, Upload(p.temperature), Upload(top_ks),
                                Upload(top_ps), Upload(seeds), Upload(draws), ws,
                                SampleTokensWorkspaceBytes(n, vocab), d_tokens, nullptr, stream_));
    const std::vector<int32_t> got_tokens = Download(d_tokens, n);
    if (boundary == 0) {
      EXPECT_EQ(got_tokens, want_tokens) << "vocab " << vocab;
    }
    // Banned tokens are never sampled.
    for (int64_t r = 0; r < n; ++r) {
      for (int32_t e = p.offsets[r]; e < p.offsets[r + 1]; ++e) {
        if (p.flags[e] & cpu::kLogitBanned) {
          EXPECT_NE(got_tokens[r], p.tokens[e]);
        }
      }
    }
  }
}

TEST(ProcessLogitsArgsTest, RejectsBadArgumentsWithoutLaunching) {
  std::vector<float> logits(32), row(2);
  std::vector<int32_t> offsets(3);
  const cpu::LogitsProcessing p{offsets.data(), nullptr,    nullptr,    nullptr,   row.data(),
                                row.data(),     row.data(), row.data(), row.data()};
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(ProcessLogits(logits.data(), 16, -1, 16, p, nullptr).code(), invalid);
  EXPECT_EQ(ProcessLogits(logits.data(), 15, 2, 16, p, nullptr).code(), invalid);
  EXPECT_EQ(ProcessLogits(logits.data(), 16, 2, 0, p, nullptr).code(), invalid);
  EXPECT_EQ(ProcessLogits(nullptr, 16, 2, 16, p, nullptr).code(), invalid);
  cpu::LogitsProcessing no_rows = p;
  no_rows.min_ps = nullptr;
  EXPECT_EQ(ProcessLogits(logits.data(), 16, 2, 16, no_rows, nullptr).code(), invalid);
  EXPECT_TRUE(ProcessLogits(nullptr, 16, 0, 16, p, nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// TopLogprobs.

using TopLogprobsTest = CudaTest;

TEST_F(TopLogprobsTest, MatchesCpuIncludingTiesAndPadding) {
  for (const int64_t vocab : {kQwenVocab, int64_t{1000}, int64_t{7}}) {
    const int64_t rows = 6, stride = vocab + 3;
    const int32_t max_k = cpu::kMaxTopLogprobs;
    auto logits = RandomFloats(rows * stride, 57, 3.0f);
    // Row 1: the maximum three times and the runner-up twice (lower ids first); row 2: constant
    // (ids 0, 1, ... in order); row 3: asks for nothing (all padding).
    for (int64_t i : {vocab - 1, vocab / 2, int64_t{0}}) logits[stride + i] = 40.0f;
    for (int64_t i : {vocab - 2, vocab / 3}) logits[stride + i] = 39.0f;
    for (int64_t i = 0; i < vocab; ++i) logits[2 * stride + i] = -1.5f;
    std::vector<int32_t> counts = {max_k, max_k, max_k, 0, 1, 5};
    for (auto& c : counts) c = static_cast<int32_t>(std::min<int64_t>(c, vocab));
    // Every row also reports the logprob of a token spread over the vocabulary (row 3 too,
    // though it asks for no alternatives).
    std::vector<int32_t> tokens(rows);
    for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7919) % vocab);
    std::vector<int32_t> want_ids(rows * max_k);
    std::vector<float> want_lps(rows * max_k), want_token_lps(rows);
    cpu::TopLogprobs(logits.data(), stride, rows, vocab, counts.data(), max_k, want_ids.data(),
                     want_lps.data(), tokens.data(), want_token_lps.data());
    int32_t* d_ids = Alloc<int32_t>(rows * max_k);
    float* d_lps = Alloc<float>(rows * max_k);
    float* d_token_lps = Alloc<float>(rows);
    const float* d_logits = Upload(logits);
    const int32_t* d_tokens_in = Upload(tokens);
    VAMP_ASSERT_OK(TopLogprobs(d_logits, stride, rows, vocab, Upload(counts), max_k, d_ids, d_lps,
                               d_tokens_in, d_token_lps, stream_));
    EXPECT_EQ(Download(d_ids, rows * max_k), want_ids) << "vocab " << vocab;
    // Both sum double exp terms; only the order of the sum differs.
    ExpectClose(Download(d_lps, rows * max_k), want_lps, 1e-6,
                "top logprobs vocab " + std::to_string(vocab));
    ExpectClose(Download(d_token_lps, rows), want_token_lps, 1e-6,
                "token logprobs vocab " + std::to_string(vocab));
    // Token logprobs alone (max_k 0, no top arrays): the same values.
    float* d_alone = Alloc<float>(rows);
    VAMP_ASSERT_OK(TopLogprobs(d_logits, stride, rows, vocab, nullptr, 0, nullptr, nullptr,
                               d_tokens_in, d_alone, stream_));
    ExpectClose(Download(d_alone, rows), want_token_lps, 1e-6,
                "token logprobs alone vocab " + std::to_string(vocab));
    // The first entry is the greedy token, with GreedySample's logprob (float32 sums) within
    // this suite's logprob tolerance.
    int32_t* d_tokens = Alloc<int32_t>(rows);
    float* d_lp = Alloc<float>(rows);
    VAMP_ASSERT_OK(GreedySample(Upload(logits), stride, rows, vocab, d_tokens, d_lp, stream_));
    const auto greedy = Download(d_tokens, rows);
    const auto lps = Download(d_lp, rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (counts[r] == 0) continue;
      EXPECT_EQ(want_ids[r * max_k], greedy[r]) << "row " << r << " vocab " << vocab;
      EXPECT_NEAR(want_lps[r * max_k], lps[r], kLogprobTol) << "row " << r << " vocab " << vocab;
    }
  }
}

TEST(TopLogprobsArgsTest, RejectsBadArgumentsWithoutLaunching) {
  // Host pointers stand in for device ones: none is dereferenced when the arguments are bad.
  std::vector<float> logits(32), lps(40);
  std::vector<int32_t> counts(2), ids(40);
  const auto invalid = absl::StatusCode::kInvalidArgument;
  auto call = [&](int64_t rows, int64_t vocab, int64_t stride, int32_t max_k, int32_t* out) {
    return TopLogprobs(logits.data(), stride, rows, vocab, counts.data(), max_k, out, lps.data(),
                       nullptr, nullptr, nullptr)
        .code();
  };
  EXPECT_EQ(call(-1, 16, 16, 4, ids.data()), invalid);
  EXPECT_EQ(call(2, 0, 16, 4, ids.data()), invalid);
  EXPECT_EQ(call(2, 16, 15, 4, ids.data()), invalid);
  EXPECT_EQ(call(2, 16, 16, -1, ids.data()), invalid);
  EXPECT_EQ(call(2, 16, 16, cpu::kMaxTopLogprobs + 1, ids.data()), invalid);
  EXPECT_EQ(call(2, 16, 16, 4, nullptr), invalid);
  EXPECT_EQ(call(0, 16, 16, 4, nullptr), absl::StatusCode::kOk);
  EXPECT_EQ(call(2, 16, 16, 0, nullptr), absl::StatusCode::kOk);
  // Token logprobs need both arrays; alone (max_k 0) they need no top arrays.
  std::vector<int32_t> tokens(2);
  std::vector<float> token_lps(2);
  EXPECT_EQ(TopLogprobs(logits.data(), 16, 2, 16, counts.data(), 4, ids.data(), lps.data(),
                        tokens.data(), nullptr, nullptr)
                .code(),
            invalid);
  EXPECT_EQ(TopLogprobs(logits.data(), 16, 2, 16, nullptr, 0, nullptr, nullptr, nullptr,
                        token_lps.data(), nullptr)
                .code(),
            invalid);
  EXPECT_EQ(TopLogprobs(nullptr, 16, 2, 16, nullptr, 0, nullptr, nullptr, tokens.data(),
                        token_lps.data(), nullptr)
                .code(),
            invalid);
}

}  // namespace
}  // namespace vamp::kernels::cuda
