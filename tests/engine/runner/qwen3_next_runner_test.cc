// ModelRunner over the tiny qwen3_next (dummy values in an HF-named checkpoint): each request's
// recurrent state lives in its persistent-batch slot across prefill chunks and decodes, slots
// are reused cleanly, preemption recomputes, a prefix-cache hit resumes from a state snapshot the
// runner captured (the same logits as a fresh prefill) and is refused, before anything changes,
// when no snapshot serves it, and a host rank (memory plan, KV region with KV for the
// full-attention layers only) serves it.
#include <cstdio>
#include <cstring>
#include <thread>

#include "engine/runner/comm/host_communicator.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/model/tiny_model.h"
#include "tests/engine/model/tiny_qwen3_next.h"
#include "tests/engine/rank/tiny_rank.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp {
namespace {

using testing::MakeTinyEngine;
using testing::MiniScheduler;
using testing::Range;
using testing::SequenceStepper;

constexpr int64_t kVocab = 256;

const std::string& CheckpointDir() {
  static const std::string dir = testing::WriteQwen3NextCheckpoint(
      "runner-qwen3-next", testing::TinyQwen3NextConfig(), 31, /*fused_experts=*/true);
  return dir;
}

std::vector<std::vector<int32_t>> Prompts() {
  std::vector<std::vector<int32_t>> p = {{7}, {72, 101, 108, 108, 111, 44, 32}, Range(3, 36)};
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 70; ++i) long_prompt.push_back((i * 37 + 11) % 256);
  p.push_back(long_prompt);
  return p;
}

// Every prompt to 12 tokens in one batch with prefill chunks of `chunk`.
MiniScheduler RunAll(int chunk, RunnerConfig rc = {}) {
  auto engine = MakeTinyEngine({}, nullptr, 256, rc, CheckpointDir());
  EXPECT_NE(engine, nullptr);
  MiniScheduler sched(16, Range(0, 256), chunk);
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) sched.Submit(i, prompts[i], 12);
  sched.RunAll(*engine->runner);
  return sched;
}

double MaxScaledDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    m = std::max(m, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(double(want[i]))));
  }
  return m;
}

TEST(Qwen3NextRunnerTest, BatchedRequestsEqualTheModelRunAlone) {
  // The runner batches four requests (prefills, then decodes, in its slots); the model alone
  // runs each: prefill in one step, then its outputs one by one. Same arithmetic per sequence,
  // so the same bits.
  const MiniScheduler sched = RunAll(1 << 20);
  auto m = testing::LoadCheckpoint(CheckpointDir());
  ASSERT_TRUE(m.ok()) << m.status();
  const auto prompts = Prompts();
  SequenceStepper stepper(*m, static_cast<int32_t>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& r = sched.request(i);
    ASSERT_EQ(r.outputs.size(), 12u);
    auto first = stepper.Step({{.seq = static_cast<int32_t>(i), .tokens = prompts[i]}});
    ASSERT_TRUE(first.ok()) << first.status();
    std::vector<float> logits = (*first)[0];
    for (size_t t = 0; t + 1 < r.outputs.size(); ++t) {
      auto step = stepper.Step({{.seq = static_cast<int32_t>(i), .tokens = {r.outputs[t]}}});
      ASSERT_TRUE(step.ok()) << step.status();
      logits.insert(logits.end(), (*step)[0].begin(), (*step)[0].end());
    }
    ASSERT_EQ(logits.size(), r.all_logits.size());
    EXPECT_EQ(0, std::memcmp(logits.data(), r.all_logits.data(), logits.size() * sizeof(float)))
        << "prompt " << i;
  }
}

TEST(Qwen3NextRunnerTest, ChunkedPrefillGivesTheSameTokens) {
  const MiniScheduler one_shot = RunAll(1 << 20);
  // Chunks of 64 keep the delta rule's chunks: bit-identical. Others round differently (the
  // model test bounds that at 1e-4 scaled), which must not change a greedy token here.
  for (int chunk : {64, 5, 16}) {
    const MiniScheduler chunked = RunAll(chunk);
    for (size_t i = 0; i < Prompts().size(); ++i) {
      const auto& a = one_shot.request(i);
      const auto& b = chunked.request(i);
      EXPECT_EQ(a.outputs, b.outputs) << "chunk " << chunk << " prompt " << i;
      if (chunk == 64) {
        EXPECT_EQ(a.all_logits, b.all_logits) << "prompt " << i;
      } else {
        EXPECT_LT(MaxScaledDiff(b.all_logits, a.all_logits), 1e-4) << "chunk " << chunk;
      }
    }
  }
}

TEST(Qwen3NextRunnerTest, ReusedSlotsStartFromAZeroState) {
  // Two slots, three rounds: every round's requests land in slots the previous round used.
  RunnerConfig rc;
  rc.max_num_seqs = 2;
  auto engine = MakeTinyEngine({}, nullptr, 256, rc, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  MiniScheduler sched(16, Range(0, 256));
  const auto prompts = Prompts();
  for (int round = 0; round < 3; ++round) {
    sched.Submit(10 * round, prompts[3], 8);
    sched.Submit(10 * round + 1, prompts[1], 8);
    sched.RunAll(*engine->runner);
    EXPECT_EQ(sched.request(10 * round).all_logits, sched.request(0).all_logits) << round;
    EXPECT_EQ(sched.request(10 * round + 1).all_logits, sched.request(1).all_logits) << round;
  }
}

TEST(Qwen3NextRunnerTest, PreemptedRequestResumesByRecomputation) {
  auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  ModelRunner& runner = *engine->runner;
  const std::vector<int32_t> prompt = Prompts()[2];
  std::vector<int32_t> outputs;
  auto decode = [&](StepInput in) {
    auto out = runner.ExecuteStep(in);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->sampled.size(), 1u);
    outputs.push_back(out->sampled[0].token);
  };
  StepInput first;
  first.new_requests.push_back({9, prompt, {3, 4, 5}, 0, MiniScheduler::Greedy()});
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
  ASSERT_TRUE(runner.ExecuteStep(StepInput{}).ok());  // preempted: a step without it
  // A resume that keeps a computed prefix needs a snapshot of the state there: refused without.
  StepInput keep;
  keep.cached_requests.push_back({9, {40, 41, 42}, 16, true});
  keep.scheduled.push_back({9, 4});
  auto refused = runner.ExecuteStep(keep);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message())
                .find("resumed request 9: num_computed_tokens 16 (a prefix-cache hit) cannot be "
                      "served: it needs restore_state"),
            std::string::npos)
      << refused.status();
  // Resumed from 0 into other blocks, recomputing every known token.
  StepInput resume;
  resume.cached_requests.push_back({9, {40, 41, 42}, 0, true});
  resume.scheduled.push_back({9, static_cast<int32_t>(prompt.size() + outputs.size())});
  decode(resume);
  computed = prompt.size() + outputs.size() - 1;
  while (outputs.size() < 12) {
    StepInput in;
    in.cached_requests.push_back({9, {}, computed, false});
    in.scheduled.push_back({9, 1});
    decode(in);
    ++computed;
  }
  // The same tokens as without the preemption (the recomputation rounds differently: tokens,
  // not bits).
  EXPECT_EQ(outputs, RunAll(1 << 20).request(2).outputs);
}

// A snapshot of one request's state, captured by the runner into a spare block, lets a later
// request with the same prefix start there (a prefix-cache hit): the same logits as a fresh
// prefill. At a multiple of the delta rule's chunk size (64) even the capture's own split leaves
// every chunk as it was, so hit, capture and plain prefill agree bit for bit; elsewhere (32) the
// hit continues the capturing request's bits and differs from a plain prefill by rounding only.
TEST(Qwen3NextRunnerTest, PrefixHitFromASnapshotEqualsAFreshPrefill) {
  auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  ModelRunner& runner = *engine->runner;
  ASSERT_EQ(runner.snapshot_blocks(), 1);            // 6,400 bytes of state in a block of the pool
  const std::vector<int32_t> prompt = Prompts()[3];  // 70 tokens
  MiniScheduler sched(16, Range(0, 200));
  sched.Submit(1, prompt, 8);
  sched.mutable_request(1).capture = {64, {250}};
  sched.Submit(2, prompt, 8);
  sched.mutable_request(2).capture = {32, {251}};
  sched.RunAll(runner);
  EXPECT_EQ(runner.num_snapshots(), 2u);
  // `tokens` prefilled in one step, then 8 decodes, on a fresh runner without snapshots.
  auto fresh = [](const std::vector<int32_t>& tokens) {
    auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
    MiniScheduler plain(16, Range(0, 200));
    plain.Submit(1, tokens, 8);
    plain.RunAll(*engine->runner);
    return plain.request(1);
  };
  const MiniScheduler::Request plain = fresh(prompt);
  EXPECT_EQ(sched.request(1).all_logits, plain.all_logits);
  EXPECT_LT(MaxScaledDiff(sched.request(2).all_logits, plain.all_logits), 1e-4);
  EXPECT_EQ(sched.request(2).outputs, plain.outputs);

  // The same prompt again, hitting 64 and 32 tokens: request 1's KV blocks and snapshots.
  const auto& first = sched.request(1).blocks;
  sched.Submit(11, prompt, 8, MiniScheduler::Greedy(), {first.begin(), first.begin() + 4}, 64);
  sched.mutable_request(11).restore = {64, {250}};
  const auto& second = sched.request(2).blocks;
  sched.Submit(12, prompt, 8, MiniScheduler::Greedy(), {second.begin(), second.begin() + 2}, 32);
  sched.mutable_request(12).restore = {32, {251}};
  // A second turn: the prompt, request 1's answer and three more tokens, from 64 tokens on.
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), sched.request(1).outputs.begin(), sched.request(1).outputs.end());
  turn2.insert(turn2.end(), {65, 66, 67});
  sched.Submit(13, turn2, 8, MiniScheduler::Greedy(), {first.begin(), first.begin() + 4}, 64);
  sched.mutable_request(13).restore = {64, {250}};
  sched.RunAll(runner);
  constexpr int64_t V = kVocab;
  auto rows_from = [&](const std::vector<float>& logits, int64_t first_row) {
    return std::vector<float>(logits.begin() + first_row * V, logits.end());
  };
  EXPECT_EQ(sched.request(11).all_logits, rows_from(sched.request(1).all_logits, 64));
  EXPECT_EQ(sched.request(11).outputs, sched.request(1).outputs);
  EXPECT_EQ(sched.request(12).all_logits, rows_from(sched.request(2).all_logits, 32));
  EXPECT_EQ(sched.request(12).outputs, sched.request(2).outputs);
  // The second turn prefilled afresh in one step: the delta rule's chunks [0, 64) and [64, 81)
  // are the hit's too, so the same bits.
  const MiniScheduler::Request turn2_fresh = fresh(turn2);
  EXPECT_EQ(sched.request(13).all_logits, rows_from(turn2_fresh.all_logits, 64));
  EXPECT_EQ(sched.request(13).outputs, turn2_fresh.outputs);
}

TEST(Qwen3NextRunnerTest, HitsNoSnapshotServesAreRefusedBeforeAnythingChanges) {
  auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  ModelRunner& runner = *engine->runner;
  MiniScheduler sched(16, Range(0, 200));
  sched.Submit(1, Prompts()[3], 2);
  sched.mutable_request(1).capture = {64, {250}};
  sched.Submit(2, Prompts()[2], 2);  // 33 other tokens
  sched.mutable_request(2).capture = {32, {251}};
  sched.RunAll(runner);
  const std::vector<int32_t> shared(sched.request(1).blocks.begin(),
                                    sched.request(1).blocks.begin() + 4);
  auto expect_refused = [&](RunnerRequestId id, int32_t hit, StateSnapshotBlocks restore,
                            const std::string& message) {
    sched.Submit(id, Prompts()[3], 2, MiniScheduler::Greedy(),
                 {shared.begin(), shared.begin() + hit / 16}, hit);
    sched.mutable_request(id).restore = std::move(restore);
    const int before = runner.batch().num_requests();
    auto out = runner.ExecuteStep(sched.Next());
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
    EXPECT_NE(std::string(out.status().message())
                  .find(absl::StrCat("new request ", id, ": num_computed_tokens ", hit,
                                     " (a prefix-cache hit) cannot be served: ", message)),
              std::string::npos)
        << out.status();
    // Nothing changed (not even the finished ids the step carried are applied).
    EXPECT_EQ(runner.batch().num_requests(), before);
    sched.mutable_request(id).finished = true;
  };
  expect_refused(3, 64, {}, "it needs restore_state");
  // The hit goes beyond the last snapshot (at 64 tokens): no snapshot of 48 tokens exists.
  expect_refused(
      4, 48, {48, {250}},
      "the snapshot in blocks [250] holds the state after 64 tokens of another context, not "
      "after these 48");
  expect_refused(5, 64, {64, {249}}, "blocks [249] hold no snapshot");
  // Request 2's snapshot is of other tokens.
  expect_refused(6, 32, {32, {251}},
                 "the snapshot in blocks [251] holds the state after 32 tokens of another context");
  // Once its block is handed to a request, a snapshot is gone.
  sched.Submit(7, Prompts()[1], 2, MiniScheduler::Greedy(), {251});
  sched.RunAll(runner);
  EXPECT_EQ(runner.num_snapshots(), 1u);
  expect_refused(8, 32, {32, {251}}, "blocks [251] hold no snapshot");
  // And the snapshot that is still there serves.
  sched.Submit(9, Prompts()[3], 2, MiniScheduler::Greedy(), shared, 64);
  sched.mutable_request(9).restore = {64, {250}};
  sched.RunAll(runner);
  EXPECT_EQ(sched.request(9).outputs, sched.request(1).outputs);
}

TEST(Qwen3NextRunnerTest, CapturesAreChecked) {
  auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  auto expect_error = [&](StateSnapshotBlocks capture, absl::StatusCode code,
                          const std::string& message) {
    StepInput in;
    in.new_requests.push_back({1, Prompts()[3], {0, 1, 2, 3, 4}, 0, MiniScheduler::Greedy()});
    in.scheduled.push_back({1, 70, std::move(capture)});
    auto out = engine->runner->ExecuteStep(in);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), code) << out.status();
    EXPECT_NE(std::string(out.status().message()).find(message), std::string::npos) << out.status();
  };
  expect_error({71, {9}}, absl::StatusCode::kOutOfRange,
               "capture_state after 71 tokens is outside the step's (0, 70]");
  expect_error({16, {256}}, absl::StatusCode::kOutOfRange, "outside the KV pool of 256 blocks");
  expect_error({16, {}}, absl::StatusCode::kInvalidArgument, "a snapshot takes 1");
  EXPECT_EQ(engine->runner->batch().num_requests(), 0);
  // A model without recurrent state keeps no snapshots and takes none.
  auto moe = MakeTinyEngine();
  ASSERT_NE(moe, nullptr);
  EXPECT_EQ(moe->runner->snapshot_blocks(), 0);
  StepInput in;
  in.new_requests.push_back({1, Prompts()[3], {0, 1, 2, 3, 4}, 0, MiniScheduler::Greedy()});
  in.scheduled.push_back({1, 70, {16, {9}}});
  EXPECT_TRUE(absl::IsFailedPrecondition(moe->runner->ExecuteStep(in).status()));
  in.scheduled[0].capture_state = {};
  in.new_requests[0].restore_state = {16, {9}};
  EXPECT_TRUE(absl::IsInvalidArgument(moe->runner->ExecuteStep(in).status()));
}

// A shrinking pool takes the snapshots stored in its tail with it.
TEST(Qwen3NextRunnerTest, SnapshotsLeaveWithTheirBlocks) {
  auto engine = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_NE(engine, nullptr);
  ModelRunner& runner = *engine->runner;
  MiniScheduler sched(16, Range(0, 200));
  sched.Submit(1, Prompts()[3], 2);
  sched.mutable_request(1).capture = {64, {250}};
  sched.Submit(2, Prompts()[2], 2);
  sched.mutable_request(2).capture = {32, {210}};
  sched.RunAll(runner);
  ASSERT_EQ(runner.num_snapshots(), 2u);
  KvCacheView smaller = runner.kv_cache();
  smaller.num_blocks = 240;
  ASSERT_TRUE(runner.SetKvCache(smaller).ok());
  EXPECT_EQ(runner.num_snapshots(), 1u);
  sched.Submit(3, Prompts()[3], 2, MiniScheduler::Greedy(),
               {sched.request(1).blocks.begin(), sched.request(1).blocks.begin() + 4}, 64);
  sched.mutable_request(3).restore = {64, {250}};
  EXPECT_TRUE(absl::IsFailedPrecondition(runner.ExecuteStep(sched.Next()).status()));
}

TEST(Qwen3NextRunnerTest, AHostRankPlansKvForTheFullAttentionLayersOnly) {
  absl::StatusOr<std::unique_ptr<Rank>> rank =
      testing::BuildHostRank(CheckpointDir(), 4096, /*kv_pages=*/64, /*ratio=*/0.5);
  ASSERT_TRUE(rank.ok()) << rank.status();
  // 2 of 4 layers hold K and V: 2 layers x 2 (K, V) x 16 tokens x 2 heads x 32 x 4 bytes.
  EXPECT_EQ((*rank)->plan.kv.block_bytes, 2u * 2 * 16 * 2 * 32 * 4);
  const KvCacheView& kv = (*rank)->runner->kv_cache();
  EXPECT_EQ(kv.k[0], nullptr);
  EXPECT_NE(kv.k[1], nullptr);
  EXPECT_EQ(kv.k[2], nullptr);
  EXPECT_NE(kv.k[3], nullptr);
  MiniScheduler sched(16, Range(0, static_cast<int32_t>(kv.num_blocks)), 16);
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) sched.Submit(i, prompts[i], 12);
  sched.RunAll(*(*rank)->runner);
  const MiniScheduler reference = RunAll(16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(sched.request(i).all_logits, reference.request(i).all_logits) << "prompt " << i;
  }
}

TEST(Qwen3NextRunnerTest, Tp2EqualsTp1WithinFloatTolerance) {
  // Ranks as threads: one key-head group of Gated DeltaNet, 2 attention heads, 1 KV head, half
  // of every MLP per rank. The ranks agree bit for bit; against TP=1 only the order of the sums
  // over ranks differs (measured 1.7e-5 scaled; bound: the golden tolerance).
  auto group = HostCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  auto rank0 = MakeTinyEngine({0, 2}, (*group)->rank(0), 256, {}, CheckpointDir());
  auto rank1 = MakeTinyEngine({1, 2}, (*group)->rank(1), 256, {}, CheckpointDir());
  auto tp1 = MakeTinyEngine({}, nullptr, 256, {}, CheckpointDir());
  ASSERT_TRUE(rank0 && rank1 && tp1);
  EXPECT_EQ(rank0->model->RecurrentStateFloatsPerSlot(),
            tp1->model->RecurrentStateFloatsPerSlot() - 2 * (3 * 48 + 2 * 8 * 16));
  MiniScheduler sched(16, Range(0, 256), 9), sched_tp1(16, Range(0, 256), 9);
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    sched.Submit(i, prompts[i], 12);
    sched_tp1.Submit(i, prompts[i], 12);
  }
  double max_rel = 0;
  for (int step = 0; !sched.Done(); ++step) {
    ASSERT_LT(step, 1000);
    const StepInput in = sched.Next();
    absl::StatusOr<StepOutput> out0, out1;
    std::thread t1([&] { out1 = rank1->runner->ExecuteStep(in); });
    out0 = rank0->runner->ExecuteStep(in);
    t1.join();
    ASSERT_TRUE(out0.ok()) << out0.status();
    ASSERT_TRUE(out1.ok()) << out1.status();
    const StepInput in1 = sched_tp1.Next();
    auto ref = tp1->runner->ExecuteStep(in1);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (size_t i = 0; i < out0->logits.size(); ++i) {
      ASSERT_EQ(out0->logits[i], out1->logits[i]);
      max_rel = std::max(max_rel, MaxScaledDiff(out0->logits[i], ref->logits[i]));
    }
    sched.OnOutput(in, *out0);
    sched_tp1.OnOutput(in1, *ref);
  }
  std::printf("TP=2 vs TP=1: max scaled logit difference %.3g\n", max_rel);
  EXPECT_LT(max_rel, 1e-4);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(sched.request(i).outputs, sched_tp1.request(i).outputs) << "prompt " << i;
  }
}

}  // namespace
}  // namespace vamp
