// The qwen3_next model on the CPU reference kernels: weight loading by HF's names and layouts,
// tensor-parallel shards, the recurrent state carried across steps (prefill == token-by-token
// decode, chunked prefill == one step, batch composition changes nothing), the state-slot
// contract, state snapshots (captured inside or at the end of a step, restored bit for bit), and,
// once tests/data/make_tiny_qwen3_next.py has run on a host with transformers, HF's goldens.
#include "engine/model/qwen3_next.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "gtest/gtest.h"
#include "tests/engine/model/tiny_model.h"
#include "tests/engine/model/tiny_qwen3_next.h"

namespace vamp {
namespace {

using testing::LoadCheckpoint;
using testing::LoadDummy;
using testing::LoadedModel;
using testing::SequenceStepper;
using testing::TinyQwen3NextConfig;

std::vector<int32_t> Prompt(int n, int salt = 0) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + 11 + salt * 101) % 256;
  return p;
}

std::map<std::string, std::vector<float>> Weights(const LoadedModel& m) {
  std::map<std::string, std::vector<float>> w;
  m.model->ForEachWeight([&](absl::string_view name, absl::Span<const float> d) {
    w[std::string(name)].assign(d.begin(), d.end());
  });
  return w;
}

// The largest |got - want| / max(1, |want|).
double MaxScaledDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    m = std::max(m, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(double(want[i]))));
  }
  return m;
}

std::vector<float> Concat(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Logits of every position of `prompt` fed in steps of the given sizes to sequence `seq`.
std::vector<float> RunInSteps(SequenceStepper& stepper, int32_t seq,
                              const std::vector<int32_t>& prompt, std::vector<int> step_sizes) {
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (int size : step_sizes) {
    std::vector<int32_t> tokens(prompt.begin() + at, prompt.begin() + at + size);
    at += size;
    auto r = stepper.Step({{.seq = seq, .tokens = tokens}});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    out.push_back((*r)[0]);
  }
  EXPECT_EQ(at, prompt.size());
  return Concat(out);
}

TEST(Qwen3NextTest, LayersKvAndStateFollowTheLayout) {
  auto m = LoadDummy(TinyQwen3NextConfig(), 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model->attention_layers(), (std::vector<int>{1, 3}));
  EXPECT_EQ(m->model->moe_layers(), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(m->model->kv_heads_per_rank(), 2);
  // Two linear-attention layers, each: conv state [K - 1 = 3, 2 * 32 + 32] + delta-rule state
  // [4 value heads, v_dim 8, k_dim 16].
  EXPECT_EQ(m->model->RecurrentStateFloatsPerSlot(), 2 * (3 * 96 + 4 * 8 * 16));
  const ModelShape shape = m->config.ToModelShape(4);
  EXPECT_TRUE(shape.Validate().ok()) << shape.Validate();
  EXPECT_EQ(shape.attention_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(shape.KvBytesPerTokenPerRank(1), 2 * 2 * 2 * 32 * 4);
}

TEST(Qwen3NextTest, CheckpointByHfNamesLoadsToTheDummyWeightsAndIgnoresMtp) {
  auto dummy = LoadDummy(TinyQwen3NextConfig(), 5);
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  const auto want = Weights(*dummy);
  for (bool fused : {false, true}) {
    const std::string dir = testing::WriteQwen3NextCheckpoint(
        fused ? "next-fused" : "next-per-expert", TinyQwen3NextConfig(), 5, fused,
        {{"mtp.fc.weight", {64, 128}}, {"mtp.layers.0.input_layernorm.weight", {64}}});
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto source = OpenSafetensorsCheckpoint(dir);
    ASSERT_TRUE(source.ok()) << source.status();
    auto m = testing::LoadFrom(*config, **source);
    ASSERT_TRUE(m.ok()) << m.status();
    // Every HF tensor was read; only the multi-token-prediction head is left.
    EXPECT_EQ((*source)->UnreadTensors(),
              (std::vector<std::string>{"mtp.fc.weight", "mtp.layers.0.input_layernorm.weight"}));
    EXPECT_EQ(Weights(*m), want) << "fused " << fused;
    if (!fused) {
      // The dummy source names experts in the fused layout, so per-expert tensors hold other
      // values: check that one shard is [gate | up | down] of its expert's tensors.
      std::vector<float> shard;
      for (const auto& [proj, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"gate_proj", {24, 64}}, {"up_proj", {24, 64}}, {"down_proj", {64, 24}}}) {
        const auto v =
            testing::DummyValues(5, "model.layers.3.mlp.experts.5." + proj + ".weight", shape);
        shard.insert(shard.end(), v.begin(), v.end());
      }
      EXPECT_EQ(0,
                std::memcmp(m->experts->shard(3, 5), shard.data(), shard.size() * sizeof(float)));
      continue;
    }
    for (int l : m->model->moe_layers()) {
      for (int e = 0; e < 16; ++e) {
        ASSERT_EQ(0, std::memcmp(m->experts->shard(l, e), dummy->experts->shard(l, e),
                                 m->experts->layout().Bytes()))
            << l << " " << e;
      }
    }
    SequenceStepper a(*m, 1), b(*dummy, 1);
    auto la = a.Step({{.seq = 0, .tokens = Prompt(9)}});
    auto lb = b.Step({{.seq = 0, .tokens = Prompt(9)}});
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_EQ(*la, *lb);
  }
}

TEST(Qwen3NextTest, WeightsAreRegroupedFromHfLayouts) {
  // The loader's fused matrices against rows of HF's tensors (dummy values, seed 3).
  auto m = LoadDummy(TinyQwen3NextConfig(), 3);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto w = Weights(*m);
  const int64_t H = 64, dk = 16, dv = 8, group = 2, hd = 32;
  auto row = [&](const std::vector<float>& t, int64_t r) {
    return std::vector<float>(t.begin() + r * H, t.begin() + (r + 1) * H);
  };
  const auto qkvz = testing::DummyValues(3, "model.layers.0.linear_attn.in_proj_qkvz.weight",
                                         {2 * 32 + 2 * 32, H});
  const auto ba = testing::DummyValues(3, "model.layers.0.linear_attn.in_proj_ba.weight", {8, H});
  const auto& in_proj = w.at("model.layers.0.linear_attn.in_proj.weight");
  // HF groups per key head g: [q (16) | k (16) | v (2 x 8) | z (2 x 8)], 64 rows per group; the
  // engine's matrix is [q (32) | k (32) | v (32) | z (32) | b (4) | a (4)].
  const int64_t g1 = 1 * (2 * dk + 2 * group * dv);
  EXPECT_EQ(row(in_proj, 16 + 3), row(qkvz, g1 + 3));            // q, key head 1, dim 3
  EXPECT_EQ(row(in_proj, 32 + 16 + 3), row(qkvz, g1 + dk + 3));  // k, key head 1
  EXPECT_EQ(row(in_proj, 64 + 3 * dv + 5), row(qkvz, g1 + 2 * dk + dv + 5));  // v, value head 3
  EXPECT_EQ(row(in_proj, 96 + 3 * dv + 5),
            row(qkvz, g1 + 2 * dk + group * dv + dv + 5));               // z, value head 3
  EXPECT_EQ(row(in_proj, 128 + 3), row(ba, 1 * 2 * group + 1));          // b, value head 3
  EXPECT_EQ(row(in_proj, 132 + 3), row(ba, 1 * 2 * group + group + 1));  // a, value head 3
  // conv1d channels are already [q | k | v]; [96, 1, 4] -> [96, 4].
  EXPECT_EQ(w.at("model.layers.0.linear_attn.conv1d.weight"),
            testing::DummyValues(3, "model.layers.0.linear_attn.conv1d.weight", {96, 1, 4}));
  // q_proj holds per head [query (32) | gate (32)]; the engine's matrix is
  // [query heads | gate heads | k | v].
  const auto q_proj = testing::DummyValues(3, "model.layers.1.self_attn.q_proj.weight", {256, H});
  const auto& qkv = w.at("model.layers.1.self_attn.qkv_proj.weight");
  EXPECT_EQ(row(qkv, 2 * hd + 7), row(q_proj, 2 * 2 * hd + 7));                // query of head 2
  EXPECT_EQ(row(qkv, 4 * hd + 2 * hd + 7), row(q_proj, 2 * 2 * hd + hd + 7));  // gate of head 2
  // RMSNorm1p weights are stored as applied (the dummy norm weight 1 gives 2); the gated norm's
  // weight is plain.
  EXPECT_EQ(w.at("model.norm.weight"), std::vector<float>(64, 2.0f));
  EXPECT_EQ(w.at("model.layers.1.self_attn.q_norm.weight"), std::vector<float>(32, 2.0f));
  EXPECT_EQ(w.at("model.layers.0.linear_attn.norm.weight"), std::vector<float>(8, 1.0f));
}

TEST(Qwen3NextTest, PrefillLogitsEqualTokenByTokenDecode) {
  // 80 tokens: the prefill's chunked delta rule spans a full and a partial chunk, the decode
  // runs the recurrent form, and the full-attention layers read 5 KV blocks.
  auto m = LoadDummy(TinyQwen3NextConfig(), 11);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto prompt = Prompt(80);
  SequenceStepper stepper(*m, 2);
  const auto prefill = RunInSteps(stepper, 0, prompt, {80});
  const auto decode = RunInSteps(stepper, 1, prompt, std::vector<int>(80, 1));
  // The two forms of the delta rule round differently (kernels: ~1e-7 on unit inputs); through
  // 4 layers and the LM head the logits differ by 2.6e-5 scaled (measured, printed below). The
  // bound is the golden tolerance, 1e-4 of max(1, |want|).
  const double diff = MaxScaledDiff(decode, prefill);
  std::printf("prefill vs token-by-token decode: max scaled logit difference %.3g\n", diff);
  EXPECT_LT(diff, 1e-4);
  stepper.Restart(1);
  EXPECT_GT(MaxScaledDiff(decode, RunInSteps(stepper, 1, Prompt(80, 1), {80})), 1e-2)
      << "another prompt gives other logits";
}

TEST(Qwen3NextTest, ChunkedPrefillEqualsOneStep) {
  auto m = LoadDummy(TinyQwen3NextConfig(), 12);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto prompt = Prompt(100);
  SequenceStepper stepper(*m, 3);
  const auto whole = RunInSteps(stepper, 0, prompt, {100});
  // Split at the delta rule's chunk size: every chunk is the same, so bit-identical.
  EXPECT_EQ(RunInSteps(stepper, 1, prompt, {64, 36}), whole);
  // Split elsewhere: the chunks differ, so float32 rounding (see the decode test).
  const double diff = MaxScaledDiff(RunInSteps(stepper, 2, prompt, {37, 27, 1, 35}), whole);
  std::printf("prefill in steps 37/27/1/35 vs one step: max scaled logit difference %.3g\n", diff);
  EXPECT_LT(diff, 1e-4);
}

TEST(Qwen3NextTest, BatchCompositionChangesNothing) {
  // Three sequences in one step (a fresh prefill, a decode, a continued prefill chunk) give the
  // bits each gives alone: every kernel treats sequences independently.
  // Two instances of the model: each holds its own recurrent states.
  auto m1 = LoadDummy(TinyQwen3NextConfig(), 13);
  auto m2 = LoadDummy(TinyQwen3NextConfig(), 13);
  ASSERT_TRUE(m1.ok() && m2.ok());
  SequenceStepper together(*m1, 3), alone(*m2, 3);
  for (SequenceStepper* s : {&together, &alone}) {
    ASSERT_TRUE(s->Step({{.seq = 1, .tokens = Prompt(10, 1)}}).ok());
    ASSERT_TRUE(s->Step({{.seq = 2, .tokens = Prompt(20, 2)}}).ok());
  }
  const std::vector<SequenceStepper::Work> work = {
      {.seq = 0, .tokens = Prompt(17)},
      {.seq = 1, .tokens = {42}},
      {.seq = 2, .tokens = Prompt(9, 3)},
  };
  auto batched = together.Step(work);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < work.size(); ++i) {
    auto single = alone.Step({work[i]});
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ((*single)[0], (*batched)[i]) << "sequence " << i;
  }
}

TEST(Qwen3NextTest, StateSlotsAreChecked) {
  auto m = LoadDummy(TinyQwen3NextConfig(), 14);
  ASSERT_TRUE(m.ok()) << m.status();
  SequenceStepper stepper(*m, 2);
  ASSERT_TRUE(stepper.Step({{.seq = 0, .tokens = Prompt(5)}}).ok());
  ASSERT_TRUE(stepper.Step({{.seq = 1, .tokens = Prompt(3, 1)}}).ok());
  auto expect_error = [&](const std::vector<SequenceStepper::Work>& work, const std::string& msg) {
    auto r = stepper.Step(work);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(msg), std::string::npos) << r.status();
  };
  // Sequence 1 (3 tokens of context) continuing from sequence 0's slot (5 tokens).
  expect_error({{.seq = 1, .tokens = {7}, .state_slot = 0}},
               "continues after 3 tokens of context from recurrent-state slot 0, which holds the "
               "state after 5 tokens");
  expect_error({{.seq = 0, .tokens = {7}, .state_slot = 2}}, "outside the 2 reserved");
  expect_error({{.seq = 0, .tokens = {7}}, {.seq = 1, .tokens = {7}, .state_slot = 0}},
               "slot 0 is named by two sequences");
  // A sequence that starts over may take any slot; the slot then holds its context.
  stepper.Restart(1);
  ASSERT_TRUE(stepper.Step({{.seq = 1, .tokens = Prompt(4), .state_slot = 0}}).ok());
  expect_error({{.seq = 0, .tokens = {7}}}, "holds the state after 4 tokens");
  // The errors changed nothing: sequence 1 continues from slot 0.
  EXPECT_TRUE(stepper.Step({{.seq = 1, .tokens = {9}, .state_slot = 0}}).ok());
  // A step without slots.
  ForwardBatch batch;
  const std::vector<int32_t> tokens = {1}, qsl = {0, 1}, lens = {1};
  const std::vector<int64_t> pos = {0};
  batch.token_ids = tokens;
  batch.positions = pos;
  batch.slot_mapping = pos;
  batch.query_start_loc = qsl;
  batch.seq_lens = lens;
  KvCacheView view;
  view.k.assign(4, nullptr);
  view.v.assign(4, nullptr);
  const absl::Status s = m->model->Forward(batch, view, m->experts.get(), nullptr, nullptr);
  EXPECT_NE(std::string(s.message()).find("names 0 recurrent-state slots for 1 sequences"),
            std::string::npos)
      << s;
}

// Storage for one snapshot in chunks of an odd size, so that floats straddle chunks as they may
// straddle KV blocks.
struct SnapshotStore {
  SnapshotStore(int64_t bytes, int64_t chunk_bytes)
      : data((bytes / chunk_bytes + 1) * chunk_bytes) {
    view.chunk_bytes = chunk_bytes;
    for (size_t at = 0; at < data.size(); at += chunk_bytes) view.chunks.push_back(&data[at]);
  }
  std::vector<uint8_t> data;
  StateSnapshotView view;
};

std::vector<float> Rows(const std::vector<float>& logits, int64_t first, int64_t count) {
  constexpr int64_t V = 256;
  return std::vector<float>(logits.begin() + first * V, logits.begin() + (first + count) * V);
}

// A capture taken inside a step (past its first K - 1 tokens, or within them, where the conv state
// comes from before the step) or at its end, restored into another sequence's slot with the KV of
// the blocks before it (a prefix-cache hit), continues with the very bits of the sequence it was
// taken from. Against the same steps without captures, logits differ by float32 rounding only.
TEST(Qwen3NextTest, SnapshotsLetAnotherSequenceContinueBitForBit) {
  auto m = LoadDummy(TinyQwen3NextConfig(), 15);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->model->SupportsStateSnapshots());
  const int64_t bytes = m->model->RecurrentStateFloatsPerSlot() * 4;
  SnapshotStore at32(bytes, 1002), at48(bytes, 1002), at96(bytes, 4096);
  const auto prompt = Prompt(100);
  auto slice = [&](int begin, int end) {
    return std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end);
  };
  SequenceStepper stepper(*m, 4);
  auto step = [&](const std::vector<SequenceStepper::Work>& work) {
    auto r = stepper.Step(work);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0] : std::vector<float>{};
  };
  // Sequence 0: tokens [0, 30); [30, 80) captured after 2 of them (at 32, inside the conv's
  // history); [80, 96) captured at its end; [96, 100). Sequence 3: the same steps, no captures.
  step({{.seq = 0, .tokens = slice(0, 30)}});
  const auto b0 =
      step({{.seq = 0, .tokens = slice(30, 80), .capture_after = 2, .capture = &at32.view}});
  const auto c0 =
      step({{.seq = 0, .tokens = slice(80, 96), .capture_after = 16, .capture = &at96.view}});
  const auto d0 = step({{.seq = 0, .tokens = slice(96, 100)}});
  const auto plain = RunInSteps(stepper, 3, prompt, {30, 50, 16, 4});
  EXPECT_LT(MaxScaledDiff(Concat({b0, c0, d0}), Rows(plain, 30, 70)), 1e-4);

  ASSERT_TRUE(stepper.ContinueFrom(1, 0, 32, at32.view).ok());
  EXPECT_EQ(step({{.seq = 1, .tokens = slice(32, 80)}}), Rows(b0, 2, 48));
  ASSERT_TRUE(stepper.ContinueFrom(2, 0, 96, at96.view).ok());
  EXPECT_EQ(step({{.seq = 2, .tokens = slice(96, 100)}}), d0);

  // A capture past the step's first K - 1 tokens, splitting one 80-token prefill at 48.
  stepper.Restart(0);
  const auto whole =
      step({{.seq = 0, .tokens = slice(0, 80), .capture_after = 48, .capture = &at48.view}});
  ASSERT_TRUE(stepper.ContinueFrom(1, 0, 48, at48.view).ok());
  EXPECT_EQ(step({{.seq = 1, .tokens = slice(48, 80)}}), Rows(whole, 48, 32));
  // Both continue alike: one decode token each.
  EXPECT_EQ(step({{.seq = 1, .tokens = {7}}}), step({{.seq = 0, .tokens = {7}}}));

  // A sequence that starts in the step, captured within its first K - 1 tokens (blocks of 2).
  SequenceStepper small(*m, 2, 64, 2);
  SnapshotStore at2(bytes, 1002);
  auto first =
      small.Step({{.seq = 0, .tokens = slice(0, 20), .capture_after = 2, .capture = &at2.view}});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(small.ContinueFrom(1, 0, 2, at2.view).ok());
  auto rest = small.Step({{.seq = 1, .tokens = slice(2, 20)}});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ((*rest)[0], Rows((*first)[0], 2, 18));
}

TEST(Qwen3NextTest, StateCapturesAndRestoresAreChecked) {
  auto m = LoadDummy(TinyQwen3NextConfig(), 16);
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t bytes = m->model->RecurrentStateFloatsPerSlot() * 4;
  SnapshotStore store(bytes, 1024), small(bytes / 2, 1024);
  SequenceStepper stepper(*m, 2);
  auto expect_invalid = [&](const std::vector<SequenceStepper::Work>& work,
                            const std::string& msg) {
    auto r = stepper.Step(work);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(msg), std::string::npos) << r.status();
  };
  expect_invalid({{.seq = 0, .tokens = Prompt(5), .capture_after = 6, .capture = &store.view}},
                 "state capture 0 after 6 tokens of sequence 0, whose step has 5");
  expect_invalid({{.seq = 0, .tokens = Prompt(5), .capture_after = 0, .capture = &store.view}},
                 "after 0 tokens");
  expect_invalid({{.seq = 0, .tokens = Prompt(5), .capture_after = 5, .capture = &small.view}},
                 "cannot hold a slot of 6400");
  // Nothing ran: the sequence still starts at context 0.
  ASSERT_TRUE(
      stepper.Step({{.seq = 0, .tokens = Prompt(5), .capture_after = 5, .capture = &store.view}})
          .ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m->model->RestoreRecurrentState(2, store.view, 5)));
  EXPECT_TRUE(absl::IsInvalidArgument(m->model->RestoreRecurrentState(1, store.view, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(m->model->RestoreRecurrentState(1, small.view, 5)));
  // A restored slot continues after the snapshot's tokens, and only there: not after the 3 of
  // the sequence that held it.
  ASSERT_TRUE(stepper.Step({{.seq = 1, .tokens = Prompt(3)}}).ok());
  ASSERT_TRUE(m->model->RestoreRecurrentState(1, store.view, 5).ok());
  auto r = stepper.Step({{.seq = 1, .tokens = {3}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("which holds the state after 5 tokens"),
            std::string::npos)
      << r.status();
}

TEST(Qwen3NextTest, TensorParallelShardsPartitionTheFullWeights) {
  auto full = LoadDummy(TinyQwen3NextConfig(), 21);
  ASSERT_TRUE(full.ok()) << full.status();
  const auto w = Weights(*full);
  const int64_t H = 64;
  for (int r = 0; r < 2; ++r) {
    auto shard = LoadDummy(TinyQwen3NextConfig(), 21, ParallelConfig{r, 2});
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->model->RecurrentStateFloatsPerSlot(), 2 * (3 * 48 + 2 * 8 * 16));
    const auto s = Weights(*shard);
    // in_proj: each part holds this rank's heads (1 key head of 16, 2 value heads of 8).
    const auto& full_in = w.at("model.layers.2.linear_attn.in_proj.weight");
    const auto& in = s.at("model.layers.2.linear_attn.in_proj.weight");
    const struct {
      int64_t full_begin, local_begin, rows;
    } parts[] = {{r * 16, 0, 16},       {32 + r * 16, 16, 16}, {64 + r * 16, 32, 16},
                 {96 + r * 16, 48, 16}, {128 + r * 2, 64, 2},  {132 + r * 2, 66, 2}};
    for (const auto& p : parts) {
      EXPECT_EQ(0, std::memcmp(in.data() + p.local_begin * H, full_in.data() + p.full_begin * H,
                               p.rows * H * sizeof(float)))
          << "rank " << r << " rows at " << p.full_begin;
    }
    EXPECT_EQ(s.at("model.layers.2.linear_attn.A_log"),
              std::vector<float>(w.at("model.layers.2.linear_attn.A_log").begin() + 2 * r,
                                 w.at("model.layers.2.linear_attn.A_log").begin() + 2 * r + 2));
    // out_proj: the columns of this rank's value heads.
    const auto& full_out = w.at("model.layers.2.linear_attn.out_proj.weight");
    const auto& out = s.at("model.layers.2.linear_attn.out_proj.weight");
    for (int64_t row = 0; row < H; ++row) {
      ASSERT_EQ(0, std::memcmp(out.data() + row * 16, full_out.data() + row * 32 + r * 16, 64));
    }
    // The shared expert: gate rows [r * 20, (r + 1) * 20) of 40; its gate replicated.
    EXPECT_EQ(0, std::memcmp(s.at("model.layers.0.mlp.shared_expert.gate_up_proj.weight").data(),
                             w.at("model.layers.0.mlp.shared_expert.gate_up_proj.weight").data() +
                                 r * 20 * H,
                             20 * H * sizeof(float)));
    EXPECT_EQ(s.at("model.layers.0.mlp.shared_expert_gate.weight"),
              w.at("model.layers.0.mlp.shared_expert_gate.weight"));
  }
  // Sizes that do not split: the error names the field.
  for (const auto& [tp, field] : std::vector<std::pair<int, std::string>>{
           {3, "num_attention_heads"}, {4, "linear_num_key_heads"}}) {
    auto bad = LoadDummy(TinyQwen3NextConfig(), 21, ParallelConfig{0, tp});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(std::string(bad.status().message()).find("config field '" + field + "'"),
              std::string::npos)
        << bad.status();
  }
}

TEST(Qwen3NextTest, DummyWeightsAreSeededAndGiveSensibleLogits) {
  auto a = LoadDummy(TinyQwen3NextConfig(), 7);
  auto b = LoadDummy(TinyQwen3NextConfig(), 7);
  auto c = LoadDummy(TinyQwen3NextConfig(), 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(Weights(*a), Weights(*b));
  EXPECT_NE(Weights(*a), Weights(*c));
  SequenceStepper stepper(*a, 1);
  auto logits = stepper.Step({{.seq = 0, .tokens = Prompt(12)}});
  ASSERT_TRUE(logits.ok()) << logits.status();
  for (float v : (*logits)[0]) ASSERT_TRUE(std::isfinite(v) && std::abs(v) < 100) << v;
}

// ---- HF goldens (tests/data/make_tiny_qwen3_next.py) ----

TEST(Qwen3NextTest, LogitsAndGreedyContinuationsMatchHfTransformersGoldens) {
  const std::string data = testing::TestDataDir();
  const std::vector<std::string> files = {
      testing::TinyQwen3NextDir() + "/config.json",
      testing::TinyQwen3NextDir() + "/model.safetensors",
      data + "/tiny-qwen3-next-goldens.json",
      data + "/tiny-qwen3-next-goldens.safetensors",
  };
  int present = 0;
  for (const std::string& f : files) present += std::filesystem::exists(f) ? 1 : 0;
  if (present == 0) {
    GTEST_SKIP() << "no HF goldens for qwen3_next yet: run tests/data/make_tiny_qwen3_next.py "
                    "where torch and transformers are installed (the GPU host) and commit "
                    "its outputs";
  }
  ASSERT_EQ(present, 4) << "some but not all golden files exist: rerun the script";
  const auto goldens =
      testing::LoadGoldens("tiny-qwen3-next-goldens.safetensors", "tiny-qwen3-next-goldens.json");
  ASSERT_FALSE(goldens.prompts.empty());
  auto m = LoadCheckpoint(testing::TinyQwen3NextDir());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->config.vocab_size, goldens.vocab);
  const int32_t num = static_cast<int32_t>(goldens.prompts.size());
  SequenceStepper stepper(*m, num, 512);
  double max_err = 0;
  for (int32_t i = 0; i < num; ++i) {
    const auto& prompt = goldens.prompts[i];
    auto r = stepper.Step({{.seq = i, .tokens = prompt}});
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<float>& logits = (*r)[0];
    ASSERT_EQ(logits.size(), goldens.logits[i].size());
    EXPECT_TRUE(testing::LogitsMatch(logits.data(), goldens.logits[i].data(), logits.size()))
        << "prompt " << i;
    max_err = std::max(max_err, MaxScaledDiff(logits, goldens.logits[i]));
    // Greedy decoding, one token per step (the recurrent form), from the prompt's last logits.
    const int64_t V = m->config.vocab_size;
    std::vector<float> last(logits.end() - V, logits.end());
    std::vector<int32_t> generated;
    for (size_t t = 0; t < goldens.continuations[i].size(); ++t) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      generated.push_back(next);
      auto step = stepper.Step({{.seq = i, .tokens = {next}}});
      ASSERT_TRUE(step.ok()) << step.status();
      last = (*step)[0];
    }
    EXPECT_EQ(generated, goldens.continuations[i]) << "prompt " << i;
  }
  RecordProperty("max_scaled_error", std::to_string(max_err));
  std::printf("max |got - want| / max(1, |want|) over all golden logits: %.3g\n", max_err);
}

}  // namespace
}  // namespace vamp
