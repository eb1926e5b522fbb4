// Test harness of the runner suites: the tiny model on a plain KV buffer, and a miniature
// scheduler producing StepInputs the way the controller does (new requests once, then deltas;
// prefill in chunks, then decodes; blocks appended as sequences grow).
#ifndef VAMP_TESTS_ENGINE_RUNNER_RUNNER_TEST_UTIL_H_
#define VAMP_TESTS_ENGINE_RUNNER_RUNNER_TEST_UTIL_H_

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "engine/model/model_loader.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/model/tiny_model.h"

namespace vamp::testing {

// The tiny model with all-resident experts in host buffers and a contiguous KV buffer.
struct TinyEngine {
  ModelConfig config;
  std::unique_ptr<HostExpertBuffers> experts;
  std::unique_ptr<CausalLm> model;
  std::vector<float> kv_storage;
  std::unique_ptr<ModelRunner> runner;
};

inline std::unique_ptr<TinyEngine> MakeTinyEngine(ParallelConfig parallel = {},
                                                  Communicator* comm = nullptr,
                                                  int64_t num_blocks = 256,
                                                  RunnerConfig runner_config = {},
                                                  const std::string& dir = TinyModelDir()) {
  auto engine = std::make_unique<TinyEngine>();
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  engine->config = *config;
  auto layout = ExpertLayoutFor(engine->config, parallel);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return nullptr;
  engine->experts = std::make_unique<HostExpertBuffers>(engine->config.num_hidden_layers,
                                                        engine->config.num_experts, *layout);
  LoadOptions options;
  options.model_path = dir;
  options.parallel = parallel;
  auto model = LoadModel(engine->config, options, *engine->experts);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  engine->model = std::move(*model);
  BlockMajorKvLayout kv{runner_config.block_size, engine->config.num_hidden_layers,
                        engine->model->kv_heads_per_rank(), engine->config.head_dim};
  engine->kv_storage.assign(num_blocks * kv.BlockElements(), 0.0f);
  KvCacheView view = kv.View(engine->kv_storage.data(), num_blocks,
                             engine->model->attention_layers(), engine->config.num_hidden_layers);
  auto runner =
      ModelRunner::Create(runner_config, engine->model.get(), engine->experts.get(), comm, view);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  engine->runner = std::move(*runner);
  return engine;
}

// A miniature scheduler: every submitted request runs to max_new_tokens; prefill proceeds in
// chunks of at most `chunk` tokens per request per step; blocks come from a list and are never
// reused (so finished requests' blocks can be shared as a prefix cache).
class MiniScheduler {
 public:
  struct Request {
    RunnerRequestId id = 0;
    std::vector<int32_t> tokens;
    int32_t num_prompt = 0;
    int32_t num_computed = 0;
    int32_t max_new_tokens = 0;
    RunnerSamplingParams sampling;
    std::vector<int32_t> blocks;
    bool sent = false;  // the runner knows it
    bool finished = false;
    int32_t initial_computed = 0;
    std::vector<int32_t> outputs;
    // Per output: its logprob, and its alternatives' ids and logprobs (SampledToken's).
    std::vector<float> logprobs;
    std::vector<std::vector<int32_t>> top_ids;
    std::vector<std::vector<float>> top_logprobs;
    // The logits row of each sampled token (needs return_all_logits).
    std::vector<std::vector<float>> sampled_logits;
    // The logits of every computed position, in order (needs return_all_logits).
    std::vector<float> all_logits;
    // Models with recurrent state: the snapshot a prefix-cache hit restores (sent with the new
    // request), and one to capture in the step whose range reaches capture.num_tokens.
    StateSnapshotBlocks restore;
    StateSnapshotBlocks capture;
  };

  MiniScheduler(int64_t block_size, std::vector<int32_t> free_blocks, int chunk = 1 << 20)
      : block_size_(block_size), free_(free_blocks.begin(), free_blocks.end()), chunk_(chunk) {}

  // `cached_blocks` hold the KV of the first `num_cached` tokens (a prefix-cache hit).
  void Submit(RunnerRequestId id, std::vector<int32_t> prompt, int32_t max_new_tokens,
              RunnerSamplingParams sampling = Greedy(), std::vector<int32_t> cached_blocks = {},
              int32_t num_cached = 0) {
    Request r;
    r.id = id;
    r.tokens = std::move(prompt);
    r.num_prompt = static_cast<int32_t>(r.tokens.size());
    r.max_new_tokens = max_new_tokens;
    r.sampling = sampling;
    r.blocks = std::move(cached_blocks);
    r.num_computed = num_cached;
    r.initial_computed = num_cached;
    order_.push_back(id);
    requests_[id] = std::move(r);
  }

  static RunnerSamplingParams Greedy() {
    RunnerSamplingParams p;
    p.temperature = 0.0f;
    return p;
  }

  bool Done() const {
    for (const auto& [id, r] : requests_) {
      if (!r.finished) return false;
    }
    return true;
  }

  // The next step: every unfinished request gets its next chunk or one decode token.
  StepInput Next(bool all_logits = true) {
    StepInput in;
    in.return_all_logits = all_logits;
    in.finished_ids = std::move(to_finish_);
    to_finish_.clear();
    for (RunnerRequestId id : order_) {
      Request& r = requests_[id];
      if (r.finished) continue;
      const int32_t known = static_cast<int32_t>(r.tokens.size());
      const int32_t n = std::min<int32_t>(chunk_, known - r.num_computed);
      std::vector<int32_t> added;
      while (static_cast<int64_t>(r.blocks.size()) * block_size_ < r.num_computed + n) {
        EXPECT_FALSE(free_.empty()) << "MiniScheduler ran out of blocks";
        r.blocks.push_back(free_.front());
        added.push_back(free_.front());
        free_.pop_front();
      }
      if (!r.sent) {
        NewRequestData nr;
        nr.id = id;
        nr.prompt_token_ids = r.tokens;
        nr.block_ids = r.blocks;
        nr.num_computed_tokens = r.num_computed;
        nr.sampling = r.sampling;
        nr.restore_state = r.restore;
        in.new_requests.push_back(std::move(nr));
        r.sent = true;
      } else {
        in.cached_requests.push_back({id, added, r.num_computed, false});
      }
      ScheduledRequest& scheduled = in.scheduled.emplace_back(ScheduledRequest{id, n});
      if (r.capture.num_tokens > r.num_computed && r.capture.num_tokens <= r.num_computed + n) {
        scheduled.capture_state = r.capture;
      }
    }
    return in;
  }

  // Records the step's results.
  void OnOutput(const StepInput& in, const StepOutput& out) {
    for (size_t i = 0; i < in.scheduled.size(); ++i) {
      Request& r = requests_[in.scheduled[i].id];
      r.num_computed += in.scheduled[i].num_tokens;
      if (in.return_all_logits) {
        r.all_logits.insert(r.all_logits.end(), out.logits[i].begin(), out.logits[i].end());
      }
    }
    for (const SampledToken& s : out.sampled) {
      Request& r = requests_[s.id];
      r.tokens.push_back(s.token);
      r.outputs.push_back(s.token);
      r.logprobs.push_back(s.logprob);
      r.top_ids.push_back(s.top_token_ids);
      r.top_logprobs.push_back(s.top_logprobs);
      if (in.return_all_logits) {
        for (size_t i = 0; i < in.scheduled.size(); ++i) {
          if (in.scheduled[i].id != s.id) continue;
          const auto& l = out.logits[i];
          const size_t vocab = l.size() / in.scheduled[i].num_tokens;
          r.sampled_logits.emplace_back(l.end() - vocab, l.end());
        }
      }
      if (static_cast<int32_t>(r.outputs.size()) >= r.max_new_tokens) {
        r.finished = true;
        to_finish_.push_back(s.id);
      }
    }
  }

  // Runs every request to completion on `runner`.
  void RunAll(ModelRunner& runner, bool all_logits = true) {
    for (int step = 0; !Done() && step < 10000; ++step) {
      StepInput in = Next(all_logits);
      auto out = runner.ExecuteStep(in);
      ASSERT_TRUE(out.ok()) << out.status();
      OnOutput(in, *out);
    }
  }

  const Request& request(RunnerRequestId id) const { return requests_.at(id); }
  Request& mutable_request(RunnerRequestId id) { return requests_.at(id); }

 private:
  int64_t block_size_;
  std::deque<int32_t> free_;
  int chunk_;
  std::vector<RunnerRequestId> order_;
  std::map<RunnerRequestId, Request> requests_;
  std::vector<RunnerRequestId> to_finish_;
};

inline std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> v;
  for (int32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

}  // namespace vamp::testing

#endif  // VAMP_TESTS_ENGINE_RUNNER_RUNNER_TEST_UTIL_H_
