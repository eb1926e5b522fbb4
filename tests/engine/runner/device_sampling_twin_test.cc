// The contract between ModelRunner and a model that samples on its device, checked on the CPU:
// a host twin of such a model (it checks its arguments with CheckForwardAndSampleArgs, as the
// CUDA model does, and samples with the CPU kernels the CUDA ones are twins of) must give the
// runner exactly what the host path gives, for plain rows, rows with logprobs and alternatives,
// penalised rows and steps in which no row samples (prefill chunks).
#include <cstring>
#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/sampling.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp::testing {
namespace {

class DeviceSamplingTwin final : public CausalLm {
 public:
  explicit DeviceSamplingTwin(CausalLm* inner) : inner_(inner) {}

  const ModelConfig& config() const override { return inner_->config(); }
  const ParallelConfig& parallel() const override { return inner_->parallel(); }
  ExpertShardLayout expert_layout() const override { return inner_->expert_layout(); }
  int64_t kv_heads_per_rank() const override { return inner_->kv_heads_per_rank(); }
  const std::vector<int>& attention_layers() const override { return inner_->attention_layers(); }
  const std::vector<int>& moe_layers() const override { return inner_->moe_layers(); }
  absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                       Communicator* comm, float* logits) override {
    return inner_->Forward(batch, kv, experts, comm, logits);
  }
  void ForEachWeight(const std::function<void(absl::string_view, absl::Span<const float>)>& fn)
      const override {
    inner_->ForEachWeight(fn);
  }

  bool SamplesOnDevice() const override { return true; }
  absl::Status ForwardAndSample(const ForwardBatch& batch, const KvCacheView& kv,
                                ExpertWeights* experts, Communicator* comm,
                                const StepSampling& sampling,
                                const StepSamplingOutput& out) override {
    VAMP_RETURN_IF_ERROR(CheckForwardAndSampleArgs(batch, sampling, out, /*max_rows=*/1024));
    ++calls;
    const int64_t m = static_cast<int64_t>(batch.logits_indices.size());
    const int64_t vocab = config().vocab_size;
    std::vector<float> logits(m * vocab);
    VAMP_RETURN_IF_ERROR(inner_->Forward(batch, kv, experts, comm, logits.data()));
    if (m == 0) return absl::OkStatus();
    std::vector<float> processed;
    if (const StepLogitsProcessing* p = sampling.processing) {
      processed = logits;
      kernels::cpu::ProcessLogits(
          processed.data(), vocab, m, vocab,
          {p->entry_offsets.data(), p->entry_tokens.data(), p->entry_counts.data(),
           p->entry_flags.data(), p->repetition_penalties.data(), p->frequency_penalties.data(),
           p->presence_penalties.data(), p->min_ps.data(), sampling.temperatures.data()});
    }
    const bool separate = sampling.processing != nullptr || sampling.max_top_logprobs > 0;
    std::vector<int32_t> indices(m * vocab);
    std::vector<float> values(m * vocab);
    kernels::cpu::SampleTokens(processed.empty() ? logits.data() : processed.data(), vocab, m,
                               vocab, sampling.temperatures.data(), sampling.top_ks.data(),
                               sampling.top_ps.data(), sampling.seeds.data(),
                               sampling.draw_indices.data(), indices.data(), values.data(),
                               out.tokens, separate ? nullptr : out.logprobs);
    if (separate) {
      kernels::cpu::TopLogprobs(logits.data(), vocab, m, vocab, sampling.top_counts.data(),
                                sampling.max_top_logprobs, out.top_ids, out.top_logprobs,
                                out.tokens, out.logprobs);
    }
    return absl::OkStatus();
  }
  int calls = 0;

 private:
  CausalLm* const inner_;
};


// Three requests with different sampling, prefilled in chunks of 8 tokens (so some steps sample
// nothing), run to 10 tokens each.
MiniScheduler RunThree(ModelRunner& runner) {
  const Goldens g = LoadGoldens();
  RunnerSamplingParams plain;
  RunnerSamplingParams alternatives;
  alternatives.temperature = 0.7f;
  alternatives.seed = 5;
  alternatives.num_top_logprobs = 3;
  RunnerSamplingParams penalised = alternatives;
  penalised.num_top_logprobs = 0;
  penalised.presence_penalty = 1.5f;
  penalised.min_tokens = 2;
  MiniScheduler sched(8, Range(0, 256), 7);
  sched.Submit(1, g.prompts[0], 10, plain);
  sched.Submit(2, g.prompts[1], 10, alternatives);
  sched.Submit(3, g.prompts[2], 10, penalised);
  sched.RunAll(runner, /*all_logits=*/false);  // as the agent runs steps: rows sample only
  return sched;
}

TEST(DeviceSamplingTwinTest, RunnerGivesTheDeviceWhatTheHostPathUses) {
  auto host = MakeTinyEngine();
  ASSERT_NE(host, nullptr);
  const MiniScheduler want = RunThree(*host->runner);

  auto engine = MakeTinyEngine();
  ASSERT_NE(engine, nullptr);
  DeviceSamplingTwin twin(engine->model.get());
  BlockMajorKvLayout kv{RunnerConfig{}.block_size, engine->config.num_hidden_layers,
                        engine->model->kv_heads_per_rank(), engine->config.head_dim};
  KvCacheView view = kv.View(engine->kv_storage.data(), 256, engine->model->attention_layers(),
                             engine->config.num_hidden_layers);
  auto runner = ModelRunner::Create({}, &twin, engine->experts.get(), nullptr, view);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const MiniScheduler got = RunThree(**runner);
  EXPECT_GT(twin.calls, 0);
  for (RunnerRequestId id : {1, 2, 3}) {
    const auto& a = want.request(id);
    const auto& b = got.request(id);
    EXPECT_EQ(b.outputs, a.outputs) << "request " << id;
    EXPECT_EQ(b.logprobs, a.logprobs) << "request " << id;
    EXPECT_EQ(b.top_ids, a.top_ids) << "request " << id;
    EXPECT_EQ(b.top_logprobs, a.top_logprobs) << "request " << id;
  }
  EXPECT_EQ(got.request(2).top_ids.front().size(), 3u);
}

}  // namespace
}  // namespace vamp::testing
