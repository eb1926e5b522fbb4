// Scheduling cost per step of the controller core (Scheduler::Schedule + UpdateFromOutput, plus
// AddRequest for arrivals), on one core.
//
// The target scenario is 1,024 running requests with 32k-token contexts on a 1M-token pool
// (65,536 blocks of 16 tokens). 1,024 × 32k = 32M tokens cannot all be resident in 1M tokens, so
// the contexts share a 32,256-token prefix (2,016 blocks, e.g. one long system prompt or document)
// and each has its own 512-token suffix (minus 0..15 tokens so that requests cross block
// boundaries on different steps, as they would in practice). Resident: 2,016 + 1,024 × 32 =
// 34,784 blocks, leaving ~30,750 for decode growth. Every request still carries a full 32k-token
// context: its own token list, 2,048 block hashes and a 2,048-entry block table, so any per-step
// work that scaled with context length would show.
//
// BM_DecodeStep: all requests decoding, none finishing; 400 steps (64 new blocks per step on
//   average; the pool would run out after ~480).
// BM_ChurnStep: steady state with arrivals: outputs of 128..384 tokens; each finished request is
//   replaced by a new one with the same shared prefix and a fresh suffix (≈4 arrivals per step,
//   each hashing its 2,048 blocks, hitting the 2,016 shared ones and prefilling ~512 tokens in
//   chunks under the 8,192-token budget).
// BM_HashPrompt: hashing one 32k-token prompt (2,048 chained SipHash-2-4-128 blocks).
//
// The second argument picks the memory arbiter: 0 = static, 1 = vamp with the tax model (ghost
// list, reuse tracker and offload tax fed every step; a pool expander that could add 16 groups of
// 2,048 blocks), so the two report side by side what the tax model's bookkeeping costs.
//
// Times are manual: only the scheduler calls count, not this file's fake agent.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/clock.h"
#include "controller/core/scheduler.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/static_arbiter.h"

namespace vamp {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPoolBlocks = 65536;  // 1,048,576 tokens
constexpr int32_t kContextTokens = 32768;
constexpr int32_t kUniqueTokens = 512;
constexpr int32_t kSharedTokens = kContextTokens - kUniqueTokens;

using Clock = std::chrono::steady_clock;

int64_t Nanos(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// A pool expander that never runs out of memory to hand over (no agents behind it).
class BenchExpander final : public PoolExpander {
 public:
  int32_t RemainingGroups() const override { return 16 - groups_; }
  int32_t BlocksPerGroup() const override { return 2048; }
  absl::StatusOr<int32_t> Expand(int32_t groups) override {
    groups_ += groups;
    return groups * 2048;
  }
  int32_t ExpertsPerGroup() const override { return 2; }
  int32_t ExpertsPerLayer() const override { return 128; }
  int64_t StagedBytesPerGroup() const override { return int64_t{846} << 20; }
  int32_t OffloadedGroups() const override { return groups_; }
  absl::Status Restore(int32_t groups, const PendingReleases& /*releases*/) override {
    groups_ -= groups;
    return absl::OkStatus();
  }

 private:
  int32_t groups_ = 0;
};

class Workload {
 public:
  Workload(int32_t num_requests, bool churn, bool vamp)
      : num_requests_(num_requests), churn_(churn) {
    SchedulerConfig c;
    c.block_size = kBlockSize;
    c.num_blocks = kPoolBlocks;
    c.max_num_seqs = num_requests;
    c.max_num_batched_tokens = 8192;
    c.max_model_len = 40960;
    std::unique_ptr<MemoryArbiter> arbiter;
    if (vamp) {
      auto v = std::make_unique<VampArbiter>(VampArbiterConfig{});
      vamp_ = v.get();
      arbiter = std::move(v);
    } else {
      arbiter = std::make_unique<StaticArbiter>();
    }
    sched_ = std::move(Scheduler::Create(c, &clock_, std::move(arbiter), vamp ? &expander_ : nullptr))
                 .value();
    shared_.resize(kSharedTokens);
    for (int32_t i = 0; i < kSharedTokens; ++i) shared_[i] = (i * 7919) % 150000;
    for (int32_t i = 0; i < num_requests; ++i) Add();
  }

  // Adds one request; returns the nanoseconds AddRequest took.
  int64_t Add() {
    const RequestId id = next_id_++;
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids = shared_;
    const int32_t unique = kUniqueTokens - static_cast<int32_t>(id % kBlockSize);
    for (int32_t i = 0; i < unique; ++i) {
      spec.prompt_token_ids.push_back(static_cast<TokenId>((id * 1000003 + i * 31) % 150000));
    }
    spec.sampling_params.ignore_eos = true;
    spec.sampling_params.max_tokens =
        churn_ ? 128 + static_cast<int32_t>((id * 37) % 257) : 40960 - kContextTokens;
    const auto t0 = Clock::now();
    const absl::Status s = sched_->AddRequest(std::move(spec));
    const auto t1 = Clock::now();
    if (!s.ok()) std::abort();
    return Nanos(t0, t1);
  }

  struct StepTimes {
    int64_t schedule_ns = 0;
    int64_t update_ns = 0;
    int64_t add_ns = 0;
    int32_t arrivals = 0;
    int64_t tokens = 0;
  };

  StepTimes Step() {
    StepTimes t;
    const auto t0 = Clock::now();
    StepPlan plan = std::move(sched_->Schedule()).value();
    const auto t1 = Clock::now();
    t.schedule_ns = Nanos(t0, t1);
    t.tokens = plan.total_num_scheduled_tokens;
    if (plan.empty()) return t;
    // The fake agents: one token for every request that reached the end of its tokens.
    StepOutput out;
    out.step = plan.step;
    out.sampled.reserve(plan.new_requests.size() + plan.cached_requests.size());
    for (const NewRequestPlan& n : plan.new_requests) {
      if (n.num_computed_tokens + n.num_scheduled_tokens ==
          static_cast<int32_t>(n.prompt_token_ids.size())) {
        out.sampled.push_back({n.request_id, {static_cast<TokenId>(n.request_id % 1000)}});
      }
    }
    for (const CachedRequestPlan& c : plan.cached_requests) {
      const Request* r = sched_->FindRequest(c.request_id);
      if (r->num_computed_tokens() == r->num_tokens()) {
        out.sampled.push_back({c.request_id, {static_cast<TokenId>(r->num_tokens() % 1000)}});
      }
    }
    const auto t2 = Clock::now();
    std::vector<RequestOutput> outputs = std::move(sched_->UpdateFromOutput(out)).value();
    if (vamp_ != nullptr) {
      // The engine's per-step feed of the tax model (timed: it runs on the scheduling thread).
      StepTiming timing;
      timing.end_micros = clock_.NowMicros();
      timing.step_micros = 20000;
      timing.decode_tokens = plan.total_num_scheduled_tokens;
      vamp_->ObserveStep(timing);
    }
    const auto t3 = Clock::now();
    t.update_ns = Nanos(t2, t3);
    for (const RequestOutput& o : outputs) {
      if (o.finish_reason != FinishReason::kNone && churn_) {
        t.add_ns += Add();
        ++t.arrivals;
      }
    }
    clock_.AdvanceMicros(20000);
    return t;
  }

  // Steps until every request decodes (no prefill left, nobody waiting).
  void WarmUpToDecode() {
    for (;;) {
      const StepTimes t = Step();
      if (sched_->num_waiting() == 0 && t.tokens == sched_->num_running()) return;
    }
  }

  Scheduler& scheduler() { return *sched_; }

 private:
  int32_t num_requests_;
  bool churn_;
  ManualClock clock_;
  BenchExpander expander_;
  VampArbiter* vamp_ = nullptr;  // owned by the scheduler
  std::unique_ptr<Scheduler> sched_;
  std::vector<TokenId> shared_;
  RequestId next_id_ = 0;
};

void Report(benchmark::State& state, Workload& w, int64_t schedule_ns, int64_t update_ns,
            int64_t add_ns, int64_t arrivals, int64_t tokens) {
  const double n = static_cast<double>(state.iterations());
  state.counters["schedule_us"] = schedule_ns / n / 1e3;
  state.counters["update_us"] = update_ns / n / 1e3;
  state.counters["add_us"] = add_ns / n / 1e3;
  state.counters["arrivals"] = arrivals / n;
  state.counters["tokens"] = tokens / n;
  const SchedulerStats s = w.scheduler().Stats();
  state.counters["running"] = s.num_running;
  state.counters["kv_usage"] = s.kv_usage;
  state.counters["hit_rate"] = s.counters.prefix_cache.HitRate();
  state.counters["preempt"] = static_cast<double>(s.counters.num_preemptions);
  state.counters["evicted"] = static_cast<double>(s.counters.num_evicted_blocks);
  state.counters["expanded"] = static_cast<double>(s.counters.num_expanded_blocks);
}

void BM_DecodeStep(benchmark::State& state) {
  Workload w(static_cast<int32_t>(state.range(0)), /*churn=*/false, state.range(1) != 0);
  w.WarmUpToDecode();
  int64_t sched_ns = 0, update_ns = 0, tokens = 0;
  for (auto _ : state) {
    const Workload::StepTimes t = w.Step();
    sched_ns += t.schedule_ns;
    update_ns += t.update_ns;
    tokens += t.tokens;
    state.SetIterationTime((t.schedule_ns + t.update_ns) * 1e-9);
  }
  Report(state, w, sched_ns, update_ns, 0, 0, tokens);
}
BENCHMARK(BM_DecodeStep)
    ->Args({256, 0})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Iterations(400)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_ChurnStep(benchmark::State& state) {
  Workload w(static_cast<int32_t>(state.range(0)), /*churn=*/true, state.range(1) != 0);
  w.WarmUpToDecode();
  for (int i = 0; i < 400; ++i) w.Step();  // past the first finishes: steady arrivals
  int64_t sched_ns = 0, update_ns = 0, add_ns = 0, arrivals = 0, tokens = 0;
  for (auto _ : state) {
    const Workload::StepTimes t = w.Step();
    sched_ns += t.schedule_ns;
    update_ns += t.update_ns;
    add_ns += t.add_ns;
    arrivals += t.arrivals;
    tokens += t.tokens;
    state.SetIterationTime((t.schedule_ns + t.update_ns + t.add_ns) * 1e-9);
  }
  Report(state, w, sched_ns, update_ns, add_ns, arrivals, tokens);
}
BENCHMARK(BM_ChurnStep)
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Iterations(1000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_HashPrompt(benchmark::State& state) {
  std::vector<TokenId> tokens(kContextTokens);
  for (int32_t i = 0; i < kContextTokens; ++i) tokens[i] = (i * 7919) % 150000;
  const BlockHasher hasher;
  const absl::Span<const TokenId> span(tokens);
  for (auto _ : state) {
    BlockHash parent;
    for (int32_t b = 0; b < kContextTokens / kBlockSize; ++b) {
      parent = hasher.Hash(parent, span.subspan(b * kBlockSize, kBlockSize), "");
    }
    benchmark::DoNotOptimize(parent);
  }
  // items = blocks: items_per_second gives the per-block cost.
  state.SetItemsProcessed(state.iterations() * (kContextTokens / kBlockSize));
}
BENCHMARK(BM_HashPrompt)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vamp

BENCHMARK_MAIN();
