// ModelRunner end to end on the tiny model: HF goldens, chunked prefill, batching, prefix-cache
// hits, preemption, sampling (penalties, min_tokens, min_p, top logprobs included) and bad step
// inputs; the persistent batch's penalty bookkeeping.
#include "engine/runner/model_runner.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling.h"
#include "tests/engine/model/tiny_model.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp {
namespace {

using testing::Goldens;
using testing::LoadGoldens;
using testing::LogitsMatch;
using testing::MakeTinyEngine;
using testing::MiniScheduler;
using testing::Range;

constexpr int64_t kVocab = 256;

// Runs every golden prompt to 16 tokens in one batch with prefill chunks of `chunk`.
MiniScheduler RunGoldens(const Goldens& g, int chunk, bool all_logits = true) {
  auto engine = MakeTinyEngine();
  EXPECT_NE(engine, nullptr);
  MiniScheduler sched(16, Range(0, 256), chunk);
  for (size_t i = 0; i < g.prompts.size(); ++i) sched.Submit(i, g.prompts[i], 16);
  sched.RunAll(*engine->runner, all_logits);
  return sched;
}

TEST(ModelRunnerTest, GreedyContinuationsAndLogitsMatchHfGoldens) {
  const Goldens g = LoadGoldens();
  const MiniScheduler sched = RunGoldens(g, 1 << 20);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const auto& r = sched.request(i);
    EXPECT_EQ(r.outputs, g.continuations[i]) << "prompt " << i;
    // The prompt positions' logits are the goldens (the decode positions have no goldens).
    ASSERT_GE(r.all_logits.size(), g.logits[i].size());
    EXPECT_TRUE(LogitsMatch(r.all_logits.data(), g.logits[i].data(), g.logits[i].size()))
        << "prompt " << i;
  }
}

TEST(ModelRunnerTest, LastTokenLogitsModeSamplesTheSameTokens) {
  const Goldens g = LoadGoldens();
  const MiniScheduler sched = RunGoldens(g, 1 << 20, /*all_logits=*/false);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    EXPECT_EQ(sched.request(i).outputs, g.continuations[i]) << "prompt " << i;
  }
}

TEST(ModelRunnerTest, ChunkedPrefillIsBitIdenticalToOneShot) {
  const Goldens g = LoadGoldens();
  const MiniScheduler one_shot = RunGoldens(g, 1 << 20);
  for (int chunk : {1, 5, 16, 17}) {
    const MiniScheduler chunked = RunGoldens(g, chunk);
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const auto& a = one_shot.request(i);
      const auto& b = chunked.request(i);
      EXPECT_EQ(a.outputs, b.outputs) << "chunk " << chunk << " prompt " << i;
      ASSERT_EQ(a.all_logits.size(), b.all_logits.size());
      EXPECT_EQ(0, std::memcmp(a.all_logits.data(), b.all_logits.data(),
                               a.all_logits.size() * sizeof(float)))
          << "chunk " << chunk << " prompt " << i;
    }
  }
}

TEST(ModelRunnerTest, BatchCompositionDoesNotChangeAnyBit) {
  const Goldens g = LoadGoldens();
  const MiniScheduler together = RunGoldens(g, 7);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    auto engine = MakeTinyEngine();
    MiniScheduler alone(16, Range(100, 256));  // other blocks than in the batched run
    alone.Submit(i, g.prompts[i], 16);
    alone.RunAll(*engine->runner);
    const auto& a = together.request(i);
    const auto& b = alone.request(i);
    EXPECT_EQ(a.outputs, b.outputs);
    ASSERT_EQ(a.all_logits.size(), b.all_logits.size());
    EXPECT_EQ(0, std::memcmp(a.all_logits.data(), b.all_logits.data(),
                             a.all_logits.size() * sizeof(float)))
        << "prompt " << i;
  }
}

TEST(ModelRunnerTest, DecodingAfterAPrefixCacheHitEqualsAFreshPrefill) {
  const Goldens g = LoadGoldens();
  const std::vector<int32_t>& prefix = g.prompts[2];  // 33 tokens: two full blocks and one more
  std::vector<int32_t> prompt_b = prefix;
  for (int32_t t : {200, 13, 77, 5, 5, 9, 250, 31, 64}) prompt_b.push_back(t);

  // A computes the prefix (and more); B reuses A's first two full blocks: 32 cached tokens.
  auto engine = MakeTinyEngine();
  MiniScheduler sched(16, Range(0, 256));
  sched.Submit(1, prefix, 6);
  sched.RunAll(*engine->runner);
  const std::vector<int32_t> shared(sched.request(1).blocks.begin(),
                                    sched.request(1).blocks.begin() + 2);
  sched.Submit(2, prompt_b, 12, MiniScheduler::Greedy(), shared, 32);
  sched.RunAll(*engine->runner);

  auto fresh_engine = MakeTinyEngine();
  MiniScheduler fresh(16, Range(50, 256));
  fresh.Submit(2, prompt_b, 12);
  fresh.RunAll(*fresh_engine->runner);

  const auto& hit = sched.request(2);
  const auto& ref = fresh.request(2);
  EXPECT_EQ(hit.outputs, ref.outputs);
  ASSERT_EQ(hit.sampled_logits.size(), ref.sampled_logits.size());
  for (size_t s = 0; s < hit.sampled_logits.size(); ++s) {
    EXPECT_EQ(0, std::memcmp(hit.sampled_logits[s].data(), ref.sampled_logits[s].data(),
                             kVocab * sizeof(float)))
        << "sampled token " << s;
  }
  // The positions B computed (32 onwards) match the fresh run's, bit for bit.
  ASSERT_EQ(hit.all_logits.size() + 32 * kVocab, ref.all_logits.size());
  EXPECT_EQ(0, std::memcmp(hit.all_logits.data(), ref.all_logits.data() + 32 * kVocab,
                           hit.all_logits.size() * sizeof(float)));
}

// Top logprobs: the rows that ask get their alternatives (kernels::cpu::TopLogprobs of the raw
// logits), the others none.
TEST(ModelRunnerTest, TopLogprobsOnlyForTheRowsThatAskForThem) {
  const Goldens g = LoadGoldens();
  const auto& prompt = g.prompts[1];
  auto engine = MakeTinyEngine();
  RunnerSamplingParams top = MiniScheduler::Greedy();
  top.num_top_logprobs = 5;
  RunnerSamplingParams plain;
  plain.temperature = 0.7f;
  plain.seed = 3;
  StepInput in;
  in.new_requests.push_back({9, prompt, {3, 4}, 0, top});
  in.new_requests.push_back({10, prompt, {5, 6}, 0, plain});
  in.scheduled.push_back({9, static_cast<int32_t>(prompt.size())});
  in.scheduled.push_back({10, static_cast<int32_t>(prompt.size())});
  in.return_all_logits = true;
  auto out = engine->runner->ExecuteStep(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->sampled.size(), 2u);
  const SampledToken& s = out->sampled[0];
  ASSERT_EQ(s.top_token_ids.size(), 5u);
  ASSERT_EQ(s.top_logprobs.size(), 5u);
  EXPECT_EQ(s.top_token_ids[0], s.token);  // greedy
  EXPECT_EQ(s.top_logprobs[0], s.logprob);
  const int32_t count = 5;
  std::vector<int32_t> want_ids(count);
  std::vector<float> want_lps(count);
  const float* last = out->logits[0].data() + (prompt.size() - 1) * kVocab;
  kernels::cpu::TopLogprobs(last, kVocab, 1, kVocab, &count, count, want_ids.data(),
                            want_lps.data(), nullptr, nullptr);
  EXPECT_EQ(s.top_token_ids, want_ids);
  EXPECT_EQ(s.top_logprobs, want_lps);
  EXPECT_TRUE(out->sampled[1].top_token_ids.empty());
  EXPECT_TRUE(out->sampled[1].top_logprobs.empty());
}

// log_softmax(row)[token] in double: the reference the prompt log-probabilities must match.
double LogSoftmaxAt(const float* row, int64_t vocab, int32_t token) {
  double max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max<double>(max, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  return static_cast<double>(row[token]) - max - std::log(sum);
}

// Prompt log-probabilities (echo with logprobs): every prompt token after the first scored under
// the logits of the position before it. Against the model's own full-logits path (the same
// request with return_all_logits): within 1e-6 of log_softmax in double, bit-identical to the
// sampler's TopLogprobs on those rows (chunked prefill gives bit-identical logits), the k
// alternatives identical; across two prefill chunks, beside a request that did not ask (which
// reports none), and with the sampled tokens unchanged.
TEST(ModelRunnerTest, PromptLogprobsAreTheFullLogitsPathsLogSoftmax) {
  const Goldens g = LoadGoldens();
  const std::vector<int32_t>& prompt = g.prompts[1];
  const int32_t P = static_cast<int32_t>(prompt.size());
  ASSERT_GE(P, 4);
  constexpr int32_t k = 3;

  // The reference: the whole prompt with every position's logits.
  auto reference = MakeTinyEngine();
  StepInput full;
  full.new_requests.push_back({9, prompt, {3, 4}, 0, MiniScheduler::Greedy()});
  full.scheduled.push_back({9, P});
  full.return_all_logits = true;
  auto ref = reference->runner->ExecuteStep(full);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::vector<float>& logits = ref->logits[0];
  EXPECT_TRUE(ref->prompt_logprobs.empty()) << "not asked for";

  auto engine = MakeTinyEngine();
  RunnerSamplingParams asks = MiniScheduler::Greedy();
  asks.prompt_logprobs = true;
  asks.num_top_logprobs = k;
  // Two chunks: positions [0, 3) then [3, P); request 10 beside it asks for nothing.
  StepInput first;
  first.new_requests.push_back({9, prompt, {3, 4}, 0, asks});
  first.new_requests.push_back({10, prompt, {5, 6}, 0, MiniScheduler::Greedy()});
  first.scheduled.push_back({10, P});
  first.scheduled.push_back({9, 3});
  auto a = engine->runner->ExecuteStep(first);
  ASSERT_TRUE(a.ok()) << a.status();
  StepInput second;
  second.cached_requests.push_back({9, {}, 3, false});
  second.scheduled.push_back({9, P - 3});
  auto b = engine->runner->ExecuteStep(second);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->prompt_logprobs.size(), 1u);
  ASSERT_EQ(b->prompt_logprobs.size(), 1u);
  const PromptLogprobs& p1 = a->prompt_logprobs[0];
  const PromptLogprobs& p2 = b->prompt_logprobs[0];
  EXPECT_EQ(p1.id, 9u);
  EXPECT_EQ(p1.first_position, 1);
  ASSERT_EQ(p1.logprobs.size(), 3u);  // tokens 1..3 from rows 0..2
  EXPECT_EQ(p2.first_position, 4);
  ASSERT_EQ(static_cast<int32_t>(p2.logprobs.size()), P - 4);  // row P-1 samples instead
  std::vector<float> got = p1.logprobs, got_alt_lps = p1.top_logprobs;
  std::vector<int32_t> got_alt_ids = p1.top_token_ids;
  got.insert(got.end(), p2.logprobs.begin(), p2.logprobs.end());
  got_alt_ids.insert(got_alt_ids.end(), p2.top_token_ids.begin(), p2.top_token_ids.end());
  got_alt_lps.insert(got_alt_lps.end(), p2.top_logprobs.begin(), p2.top_logprobs.end());
  ASSERT_EQ(got_alt_ids.size(), static_cast<size_t>((P - 1) * k));

  std::vector<int32_t> counts(P - 1, k), want_ids((P - 1) * k);
  std::vector<float> want(P - 1), want_lps((P - 1) * k);
  kernels::cpu::TopLogprobs(logits.data(), kVocab, P - 1, kVocab, counts.data(), k, want_ids.data(),
                            want_lps.data(), prompt.data() + 1, want.data());
  for (int32_t pos = 1; pos < P; ++pos) {
    const float* row = logits.data() + (pos - 1) * kVocab;
    EXPECT_NEAR(got[pos - 1], LogSoftmaxAt(row, kVocab, prompt[pos]), 1e-6) << "position " << pos;
    EXPECT_NEAR(got_alt_lps[(pos - 1) * k], LogSoftmaxAt(row, kVocab, got_alt_ids[(pos - 1) * k]),
                1e-6);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_alt_ids, want_ids);
  EXPECT_EQ(got_alt_lps, want_lps);
  // The tokens sampled are those of the plain path.
  ASSERT_EQ(b->sampled.size(), 1u);
  ASSERT_EQ(ref->sampled.size(), 1u);
  EXPECT_EQ(b->sampled[0].token, ref->sampled[0].token);
  EXPECT_EQ(b->sampled[0].logprob, ref->sampled[0].logprob);
  ASSERT_EQ(a->sampled.size(), 1u);
  EXPECT_EQ(a->sampled[0].id, 10u);

  // Decode steps score nothing more; after a preemption the recomputation reports the prompt's
  // positions again with the same values.
  StepInput decode;
  decode.cached_requests.push_back({9, {}, P, false});
  decode.scheduled.push_back({9, 1});
  auto d = engine->runner->ExecuteStep(decode);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->prompt_logprobs.empty());
  StepInput preempt;
  preempt.finished_ids.push_back(9);
  ASSERT_TRUE(engine->runner->ExecuteStep(preempt).ok());
  NewRequestData again{9, prompt, {7, 8}, 0, asks};
  again.prompt_token_ids.push_back(ref->sampled[0].token);
  again.prompt_token_ids.push_back(d->sampled[0].token);
  again.num_prompt_tokens = P;
  StepInput resume;
  resume.new_requests.push_back(again);
  resume.scheduled.push_back({9, P + 2});
  auto r = engine->runner->ExecuteStep(resume);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompt_logprobs.size(), 1u);
  EXPECT_EQ(r->prompt_logprobs[0].first_position, 1);
  EXPECT_EQ(r->prompt_logprobs[0].logprobs, want) << "outputs are not scored as prompt";
}

TEST(ModelRunnerTest, PreemptedRequestResumesByRecomputation) {
  const Goldens g = LoadGoldens();
  const auto& prompt = g.prompts[1];
  auto engine = MakeTinyEngine();
  ModelRunner& runner = *engine->runner;
  std::vector<int32_t> outputs;
  auto decode = [&](StepInput in) {
    auto out = runner.ExecuteStep(in);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->sampled.size(), 1u);
    outputs.push_back(out->sampled[0].token);
  };
  StepInput first;
  first.new_requests.push_back({9, prompt, {3, 4}, 0, MiniScheduler::Greedy()});
  first.scheduled.push_back({9, static_cast<int32_t>(prompt.size())});
  decode(first);
  int32_t computed = prompt.size();
  for (int i = 0; i < 4; ++i) {
    StepInput in;
    in.cached_requests.push_back({9, {}, computed, false});
    in.scheduled.push_back({9, 1});
    decode(in);
    ++computed;
  }
  // Preempted: a step without it (and its block freed by the scheduler).
  StepInput idle;
  ASSERT_TRUE(runner.ExecuteStep(idle).ok());
  // Resumed into different blocks, recomputing all known tokens (prompt + 5 outputs).
  StepInput resume;
  resume.cached_requests.push_back({9, {40, 41}, 0, true});
  resume.scheduled.push_back({9, static_cast<int32_t>(prompt.size() + outputs.size())});
  decode(resume);
  computed = prompt.size() + outputs.size() - 1;
  while (outputs.size() < 16) {
    StepInput in;
    in.cached_requests.push_back({9, {}, computed, false});
    in.scheduled.push_back({9, 1});
    decode(in);
    ++computed;
  }
  EXPECT_EQ(outputs, g.continuations[1]);
}

TEST(ModelRunnerTest, SeededSamplingIsReproducibleAcrossBatches) {
  RunnerSamplingParams p;
  p.temperature = 1.2f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = 1234;
  auto run = [&](bool with_others, std::optional<uint64_t> seed, uint64_t runner_seed) {
    RunnerConfig rc;
    rc.seed = runner_seed;
    auto engine = MakeTinyEngine({}, nullptr, 256, rc);
    MiniScheduler sched(16, Range(0, 256), 4);
    RunnerSamplingParams q = p;
    q.seed = seed;
    if (with_others) sched.Submit(1, Range(50, 90), 10, p);
    sched.Submit(7, Range(3, 20), 16, q);
    if (with_others) sched.Submit(2, {1, 2, 3}, 20);
    sched.RunAll(*engine->runner, /*all_logits=*/false);
    return sched.request(7).outputs;
  };
  const auto alone = run(false, 1234, 0);
  EXPECT_EQ(alone.size(), 16u);
  EXPECT_EQ(alone, run(true, 1234, 99)) << "own seed: batching and runner seed do not matter";
  EXPECT_NE(alone, run(false, 4321, 0));
  // Without a seed: derived from the runner seed and the request id.
  EXPECT_EQ(run(false, std::nullopt, 5), run(true, std::nullopt, 5));
  EXPECT_NE(run(false, std::nullopt, 5), run(false, std::nullopt, 6));
}

// Penalties, min_tokens bans and min_p run on the sampler (kernels::cpu::ProcessLogits), fed by
// the runner's per-request token counts.
TEST(ModelRunnerTest, PenaltiesAndMinTokensShapeGreedyOutput) {
  const Goldens g = LoadGoldens();
  auto run = [&](const RunnerSamplingParams& p) {
    auto engine = MakeTinyEngine();
    MiniScheduler sched(16, Range(0, 256), 8);
    sched.Submit(3, g.prompts[0], 16, p);
    sched.Submit(4, g.prompts[1], 16);  // without processing, in the same batch
    sched.RunAll(*engine->runner, /*all_logits=*/false);
    EXPECT_EQ(sched.request(4).outputs, g.continuations[1]);
    return sched.request(3).outputs;
  };
  RunnerSamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(run(greedy), g.continuations[0]);
  // min_tokens: the first greedy token is banned for the first 2 outputs only.
  RunnerSamplingParams ban = greedy;
  ban.min_tokens = 2;
  ban.min_tokens_banned_ids = {g.continuations[0][0]};
  const std::vector<int32_t> banned = run(ban);
  EXPECT_NE(banned[0], g.continuations[0][0]);
  EXPECT_NE(banned[1], g.continuations[0][0]);
  // A large presence penalty: no output token repeats (the tiny model's logits span < 100).
  RunnerSamplingParams presence = greedy;
  presence.presence_penalty = 100.0f;
  const std::vector<int32_t> distinct = run(presence);
  EXPECT_EQ(std::set<int32_t>(distinct.begin(), distinct.end()).size(), distinct.size());
  // A repetition penalty changes greedy output (it covers prompt and outputs; the arithmetic is
  // checked in the kernel's tests, which tokens count in PersistentBatchTest below).
  RunnerSamplingParams repetition = greedy;
  repetition.repetition_penalty = 3.0f;
  EXPECT_NE(run(repetition), g.continuations[0]);
  // min_p near 1 at a sampling temperature keeps only the most likely token: greedy output.
  RunnerSamplingParams min_p;
  min_p.temperature = 1.0f;
  min_p.min_p = 0.999999f;
  min_p.seed = 5;
  EXPECT_EQ(run(min_p), g.continuations[0]);
}

// Logprobs and alternatives are the raw model's (vLLM's default logprobs mode): log_softmax of the
// logits before penalties, min_tokens bans, temperature and min_p, which only shape what is
// sampled. With a presence penalty that forbids repeats, every logprob is still that of the
// unprocessed logits row.
TEST(ModelRunnerTest, LogprobsAreTheRawModelsWhateverTheProcessing) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams p;
  p.temperature = 0.8f;
  p.seed = 11;
  p.presence_penalty = 100.0f;
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.25f;
  p.min_p = 0.01f;
  p.min_tokens = 3;
  p.min_tokens_banned_ids = {g.continuations[0][0]};
  p.num_top_logprobs = 4;
  RunnerSamplingParams plain = p;  // the same without processing, in the same batch
  plain.presence_penalty = 0.0f;
  plain.repetition_penalty = 1.0f;
  plain.frequency_penalty = 0.0f;
  plain.min_p = 0.0f;
  plain.min_tokens = 0;
  plain.min_tokens_banned_ids.clear();
  auto engine = MakeTinyEngine();
  MiniScheduler sched(16, Range(0, 256), 8);
  sched.Submit(3, g.prompts[0], 12, p);
  sched.Submit(4, g.prompts[1], 12, plain);
  sched.RunAll(*engine->runner, /*all_logits=*/true);
  const auto& r = sched.request(3);
  ASSERT_EQ(r.outputs.size(), 12u);
  EXPECT_EQ(std::set<int32_t>(r.outputs.begin(), r.outputs.end()).size(), r.outputs.size())
      << "the presence penalty applied";
  EXPECT_NE(r.outputs[0], g.continuations[0][0]) << "the min_tokens ban applied";
  for (RunnerRequestId id : {3, 4}) {
    const auto& q = sched.request(id);
    ASSERT_EQ(q.sampled_logits.size(), q.outputs.size());
    for (size_t t = 0; t < q.outputs.size(); ++t) {
      const std::vector<float>& raw = q.sampled_logits[t];
      const int32_t count = 4;
      std::vector<int32_t> ids(count);
      std::vector<float> lps(count);
      float lp = 0;
      kernels::cpu::TopLogprobs(raw.data(), kVocab, 1, kVocab, &count, count, ids.data(),
                                lps.data(), &q.outputs[t], &lp);
      EXPECT_EQ(q.logprobs[t], lp) << "request " << id << " output " << t;
      EXPECT_EQ(q.top_ids[t], ids) << "request " << id << " output " << t;
      EXPECT_EQ(q.top_logprobs[t], lps) << "request " << id << " output " << t;
    }
  }
  // The banned first greedy token is still reported among the raw alternatives.
  EXPECT_EQ(r.top_ids[0][0], g.continuations[0][0]);
}

TEST(PersistentBatchTest, ProcessingEntriesCountOutputsAndBanUntilMinTokens) {
  PersistentBatch batch(2, 4);
  NewRequestData r;
  r.id = 1;
  r.prompt_token_ids = {5, 5, 7, 9};  // re-sent: the last token is an earlier output
  r.num_prompt_tokens = 3;
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.min_tokens = 3;
  r.sampling.min_tokens_banned_ids = {9, 11};
  absl::StatusOr<int> slot = batch.Add(r, 0);
  ASSERT_TRUE(slot.ok()) << slot.status();
  batch.AppendToken(*slot, 7);
  EXPECT_EQ(batch.num_outputs(*slot), 2);
  auto entries = [&] {
    std::vector<int32_t> tokens, counts;
    std::vector<uint8_t> flags;
    batch.AppendProcessingEntries(*slot, &tokens, &counts, &flags);
    std::map<int32_t, std::pair<int32_t, int>> out;
    for (size_t e = 0; e < tokens.size(); ++e) {
      EXPECT_FALSE(out.contains(tokens[e])) << "token " << tokens[e] << " twice";
      out[tokens[e]] = {counts[e], flags[e]};
    }
    return out;
  };
  using kernels::cpu::kLogitBanned;
  using kernels::cpu::kLogitInPrompt;
  EXPECT_EQ(entries(), (std::map<int32_t, std::pair<int32_t, int>>{{5, {0, kLogitInPrompt}},
                                                                   {7, {1, kLogitInPrompt}},
                                                                   {9, {1, kLogitBanned}},
                                                                   {11, {0, kLogitBanned}}}));
  batch.AppendToken(*slot, 12);  // the third output: nothing is banned any more
  EXPECT_EQ(entries(),
            (std::map<int32_t, std::pair<int32_t, int>>{
                {5, {0, kLogitInPrompt}}, {7, {1, kLogitInPrompt}}, {9, {1, 0}}, {12, {1, 0}}}));
}

TEST(ModelRunnerTest, SlotsOfFinishedRequestsAreReused) {
  const Goldens g = LoadGoldens();
  RunnerConfig rc;
  rc.max_num_seqs = 2;
  auto engine = MakeTinyEngine({}, nullptr, 256, rc);
  MiniScheduler sched(16, Range(0, 256));
  for (int round = 0; round < 3; ++round) {
    sched.Submit(10 * round, g.prompts[0], 16);
    sched.Submit(10 * round + 1, g.prompts[1], 16);
    sched.RunAll(*engine->runner, false);
    EXPECT_EQ(sched.request(10 * round).outputs, g.continuations[0]);
    EXPECT_EQ(sched.request(10 * round + 1).outputs, g.continuations[1]);
  }
  // The last finished ids are applied on the next step.
  ASSERT_TRUE(engine->runner->ExecuteStep(sched.Next()).ok());
  EXPECT_EQ(engine->runner->batch().num_requests(), 0);
}

TEST(ModelRunnerTest, BadStepInputsAreRejectedBeforeAnythingChanges) {
  const Goldens g = LoadGoldens();
  RunnerConfig rc;
  rc.max_num_batched_tokens = 64;
  rc.max_num_seqs = 4;
  auto engine = MakeTinyEngine({}, nullptr, 32, rc);
  ModelRunner& runner = *engine->runner;
  const auto& prompt = g.prompts[1];  // 7 tokens
  StepInput first;
  first.new_requests.push_back({1, prompt, {0, 31}, 0, MiniScheduler::Greedy()});
  first.scheduled.push_back({1, 7});
  auto out = runner.ExecuteStep(first);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<int32_t> outputs = {out->sampled[0].token};

  auto decode_step = [](int32_t computed) {
    StepInput in;
    in.cached_requests.push_back({1, {}, computed, false});
    in.scheduled.push_back({1, 1});
    return in;
  };
  struct Bad {
    std::string what;
    StepInput input;
    std::string expect;
  };
  std::vector<Bad> bad;
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({1, {5}, {1}, 0, {}});
    bad.push_back({"duplicate", in, "new request 1 is already running"});
  }
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({2, {5, 300}, {1}, 0, {}});
    bad.push_back({"vocab", in, "token 300 outside the vocabulary"});
  }
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({2, {5}, {32}, 0, {}});
    bad.push_back({"block", in, "block 32 outside the KV pool of 32 blocks"});
  }
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({2, {}, {1}, 0, {}});
    bad.push_back({"empty", in, "prompt_token_ids is empty"});
  }
  {
    StepInput in = decode_step(7);
    RunnerSamplingParams p;
    p.top_p = 0.0f;
    in.new_requests.push_back({2, {5}, {1}, 0, p});
    bad.push_back({"top_p", in, "sampling.top_p"});
  }
  {
    StepInput in = decode_step(8);
    bad.push_back({"progress", in, "num_computed_tokens 8 but the runner has computed 7"});
  }
  {
    StepInput in;
    in.scheduled.push_back({42, 1});
    bad.push_back({"unknown", in, "scheduled request 42 is not running"});
  }
  {
    StepInput in;
    in.cached_requests.push_back({1, {}, 7, false});
    in.scheduled.push_back({1, 2});
    bad.push_back({"beyond known", in, "exceeds its 8 known tokens"});
  }
  {
    StepInput in = decode_step(7);
    in.scheduled.push_back({1, 1});
    bad.push_back({"twice", in, "scheduled twice"});
  }
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({2, Range(0, 70), Range(1, 6), 0, {}});
    in.scheduled.push_back({2, 70});
    bad.push_back({"budget", in, "more than max_num_batched_tokens 64"});
  }
  {
    StepInput in = decode_step(7);
    in.new_requests.push_back({2, Range(0, 40), {1, 2}, 0, {}});
    in.scheduled.push_back({2, 40});
    bad.push_back({"blocks", in, "needs 3 blocks for 40 tokens but has 2"});
  }
  {
    StepInput in = decode_step(7);
    for (int i = 2; i < 6; ++i) in.new_requests.push_back({RunnerRequestId(i), {5}, {i}, 0, {}});
    bad.push_back({"seqs", in, "exceeds max_num_seqs 4"});
  }
  for (const Bad& b : bad) {
    auto r = runner.ExecuteStep(b.input);
    ASSERT_FALSE(r.ok()) << b.what;
    EXPECT_NE(std::string(r.status().message()).find(b.expect), std::string::npos)
        << b.what << ": " << r.status();
    EXPECT_EQ(runner.batch().num_requests(), 1) << b.what;
  }
  // Nothing changed: decoding continues exactly as the goldens.
  for (int32_t computed = 7; outputs.size() < 16; ++computed) {
    auto o = runner.ExecuteStep(decode_step(computed));
    ASSERT_TRUE(o.ok()) << o.status();
    outputs.push_back(o->sampled[0].token);
  }
  EXPECT_EQ(outputs, g.continuations[1]);
}

}  // namespace
}  // namespace vamp
