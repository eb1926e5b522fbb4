// Scheduling cost per step of the controller core (Scheduler::Schedule + UpdateFromOutput, plus
// AddRequest for arrivals and the tax model's per-step feed), on one core. The budget is per
// step (< 1 ms with 1,024 running requests on a 1M-token pool), so besides the mean every case
// reports the distribution over its timed steps: p50_us, p99_us and max_us.
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
// BM_DecodeStep/<running>/<arbiter>: all requests decoding, none finishing; 400 steps (64 new
//   blocks per step on average; the pool would run out after ~480).
// BM_ChurnStep/running:N/vamp:A/hash_at_arrival:H: steady state with arrivals: outputs of
//   128..384 tokens; each finished request is replaced by a new one with the same shared prefix
//   and a fresh suffix (≈4 arrivals per step, each hitting the 2,016 shared blocks and prefilling
//   ~512 tokens in chunks under the 8,192-token budget). H 0: the scheduler hashes the prompt's
//   blocks on its thread (lazily, as far as the lookup goes: 2,016+ per arrival); 1: they are
//   hashed where the request arrives (Scheduler::HashPromptBlocks, as the serving engine's Submit
//   does on the frontend's thread) and handed over in RequestSpec::prompt_block_hashes; that
//   hashing is reported as arrival_hash_us per step and not counted in the step.
// BM_PressureStep/running:N/hash_at_arrival:H: the vamp arbiter (tax model, defaults) under
//   steady shortage: each prompt is the shared prefix (31,744 tokens), one of 1,536 documents of
//   512 tokens taken round-robin (so a document comes back after ≈ 1,536 arrivals, often after
//   its blocks were evicted: ghost-list hits) and a 1..16-token question; outputs of 128..384
//   tokens. Finished requests' blocks fill the pool with cached free blocks, so nearly every new
//   block is a gap the arbiter decides (evict, or offload when the measured reuse is worth its
//   tax); the ghost list is full (32,768 hashes = the offload cap); OnStepBoundary runs every
//   step and its restore check (the working-set rule) every 20 steps once offloaded. The offloader
//   stages 32 MiB per group (a small staging tax, so that the arbiter does offload and the restore
//   path runs); 1,000 timed steps after 1,200 warm-up steps.
// BM_IdleCachedCount, BM_RestoreCheck, BM_PreemptForRestoreCheck: the vamp arbiter's periodic
//   checks at their worst, one call per iteration (see each).
// BM_HashPrompt, BM_HashPromptStreaming: hashing one 32k-token prompt (2,048 chained
//   SipHash-2-4-128 blocks) through BlockHasher and through the streaming SipHash128.
//
// The arbiter argument: 0 = static, 1 = vamp with the tax model (ghost list, reuse tracker and
// offload tax fed every step; an offloader that could add 16 groups of 2,048 blocks), so the
// two report side by side what the tax model's bookkeeping costs.
//
// Times are manual, in the benchmark thread's CPU time (ThreadNanos): only the scheduler calls
// count, not this file's fake agent.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/clock.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/scheduler.h"
#include "controller/core/static_arbiter.h"

namespace vamp {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPoolBlocks = 65536;  // 1,048,576 tokens
constexpr int32_t kContextTokens = 32768;
constexpr int32_t kUniqueTokens = 512;
constexpr int32_t kSharedTokens = kContextTokens - kUniqueTokens;
constexpr int32_t kDocuments = 1536;
constexpr int32_t kDocumentTokens = 512;

// This thread's CPU time (ns). Steps are timed in it rather than in wall time: the dev box has 2
// cores shared with builds, and a step descheduled for a few ms by another process would
// otherwise land in p99 and max. (Its own page faults and cache misses still count.)
int64_t ThreadNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// An offloader that never runs out of memory to hand over (no agents behind it).
class BenchOffloader final : public ExpertOffloader {
 public:
  explicit BenchOffloader(int64_t staged_bytes_per_group)
      : staged_bytes_per_group_(staged_bytes_per_group) {}
  int32_t RemainingGroups() const override { return 16 - groups_; }
  int32_t BlocksPerGroup() const override { return 2048; }
  absl::StatusOr<int32_t> Offload(int32_t groups) override {
    groups_ += groups;
    return groups * 2048;
  }
  int32_t ExpertsPerGroup() const override { return 2; }
  int32_t ExpertsPerLayer() const override { return 128; }
  int64_t StagedBytesPerGroup() const override { return staged_bytes_per_group_; }
  int32_t OffloadedGroups() const override { return groups_; }
  absl::Status Restore(int32_t groups) override {
    groups_ -= groups;
    return absl::OkStatus();
  }

 private:
  int64_t staged_bytes_per_group_;
  int32_t groups_ = 0;
};

enum class Mix {
  kDecode,     // nobody finishes
  kChurn,      // finished requests are replaced: shared prefix + fresh suffix
  kDocuments,  // finished requests are replaced: shared prefix + a recurring document + question
};

class Workload {
 public:
  Workload(int32_t num_requests, Mix mix, bool vamp, bool hash_at_arrival,
           int64_t staged_bytes_per_group = int64_t{846} << 20)
      : mix_(mix), hash_at_arrival_(hash_at_arrival), offloader_(staged_bytes_per_group) {
    config_.block_size = kBlockSize;
    config_.num_blocks = kPoolBlocks;
    config_.max_num_seqs = num_requests;
    config_.max_num_batched_tokens = 8192;
    config_.max_model_len = 40960;
    std::unique_ptr<MemoryArbiter> arbiter;
    if (vamp) {
      auto v = std::make_unique<VampArbiter>(VampArbiterConfig{});
      vamp_ = v.get();
      arbiter = std::move(v);
    } else {
      arbiter = std::make_unique<StaticArbiter>();
    }
    sched_ = std::move(Scheduler::Create(config_, &clock_, std::move(arbiter),
                                         vamp ? &offloader_ : nullptr))
                 .value();
    const int32_t shared =
        mix == Mix::kDocuments ? kContextTokens - kDocumentTokens : kSharedTokens;
    shared_.resize(shared);
    for (int32_t i = 0; i < shared; ++i) shared_[i] = (i * 7919) % 150000;
    for (int32_t i = 0; i < num_requests; ++i) Add();
  }

  // Adds one request. Returns the nanoseconds AddRequest took (scheduling thread); `hash_ns` gets
  // those of hashing at arrival (frontend thread) when that is on.
  int64_t Add(int64_t* hash_ns = nullptr) {
    const RequestId id = next_id_++;
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids = shared_;
    if (mix_ == Mix::kDocuments) {
      const int64_t doc = static_cast<int64_t>(id % kDocuments);
      for (int32_t i = 0; i < kDocumentTokens; ++i) {
        spec.prompt_token_ids.push_back(static_cast<TokenId>((doc * 100003 + i * 37) % 150000));
      }
      const int32_t question = kBlockSize - static_cast<int32_t>(id % kBlockSize);
      for (int32_t i = 0; i < question; ++i) {
        spec.prompt_token_ids.push_back(static_cast<TokenId>((id * 1000003 + i * 31) % 150000));
      }
    } else {
      const int32_t unique = kUniqueTokens - static_cast<int32_t>(id % kBlockSize);
      for (int32_t i = 0; i < unique; ++i) {
        spec.prompt_token_ids.push_back(static_cast<TokenId>((id * 1000003 + i * 31) % 150000));
      }
    }
    spec.sampling_params.ignore_eos = true;
    spec.sampling_params.max_tokens =
        mix_ == Mix::kDecode ? 40960 - kContextTokens : 128 + static_cast<int32_t>((id * 37) % 257);
    if (hash_at_arrival_) {
      const int64_t h0 = ThreadNanos();
      spec.prompt_block_hashes =
          Scheduler::HashPromptBlocks(config_, spec.prompt_token_ids, spec.cache_salt);
      if (hash_ns != nullptr) *hash_ns += ThreadNanos() - h0;
    }
    const int64_t t0 = ThreadNanos();
    const absl::Status s = sched_->AddRequest(std::move(spec));
    const int64_t t1 = ThreadNanos();
    if (!s.ok()) std::abort();
    return t1 - t0;
  }

  struct StepTimes {
    int64_t schedule_ns = 0;
    int64_t update_ns = 0;
    int64_t add_ns = 0;
    int64_t arrival_hash_ns = 0;  // off the scheduling thread: not part of the step
    int32_t arrivals = 0;
    int64_t tokens = 0;
    int64_t total_ns() const { return schedule_ns + update_ns + add_ns; }
  };

  StepTimes Step() {
    StepTimes t;
    const int64_t t0 = ThreadNanos();
    StepPlan plan = std::move(sched_->Schedule()).value();
    t.schedule_ns = ThreadNanos() - t0;
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
    const int64_t t2 = ThreadNanos();
    std::vector<RequestOutput> outputs = std::move(sched_->UpdateFromOutput(out)).value();
    if (vamp_ != nullptr) {
      // The engine's per-step feed of the tax model (timed: it runs on the scheduling thread).
      StepTiming timing;
      timing.end_micros = clock_.NowMicros();
      timing.step_micros = 20000;
      timing.decode_tokens = plan.total_num_scheduled_tokens;
      vamp_->ObserveStep(timing);
    }
    t.update_ns = ThreadNanos() - t2;
    for (const RequestOutput& o : outputs) {
      if (o.finish_reason != FinishReason::kNone && mix_ != Mix::kDecode) {
        t.add_ns += Add(&t.arrival_hash_ns);
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
  const BenchOffloader& offloader() const { return offloader_; }
  VampArbiter* vamp() { return vamp_; }

 private:
  Mix mix_;
  bool hash_at_arrival_;
  SchedulerConfig config_;
  ManualClock clock_;
  BenchOffloader offloader_;
  VampArbiter* vamp_ = nullptr;  // owned by the scheduler
  std::unique_ptr<Scheduler> sched_;
  std::vector<TokenId> shared_;
  RequestId next_id_ = 0;
};

// Per-step totals of a timed run and their distribution.
class StepLog {
 public:
  void Add(const Workload::StepTimes& t) {
    steps_.push_back(t.total_ns());
    schedule_ns_ += t.schedule_ns;
    update_ns_ += t.update_ns;
    add_ns_ += t.add_ns;
    arrival_hash_ns_ += t.arrival_hash_ns;
    arrivals_ += t.arrivals;
    tokens_ += t.tokens;
  }

  void Report(benchmark::State& state, Workload& w) {
    const double n = static_cast<double>(steps_.size());
    std::vector<int64_t> sorted = steps_;
    std::sort(sorted.begin(), sorted.end());
    // Nearest rank: the smallest step time that at least a share q of the steps do not exceed.
    auto quantile = [&](double q) {
      const size_t rank = static_cast<size_t>(std::max(1.0, std::ceil(q * n)));
      return static_cast<double>(sorted[std::min(rank, sorted.size()) - 1]) / 1e3;
    };
    state.counters["p50_us"] = quantile(0.50);
    state.counters["p99_us"] = quantile(0.99);
    state.counters["max_us"] = static_cast<double>(sorted.back()) / 1e3;
    state.counters["schedule_us"] = schedule_ns_ / n / 1e3;
    state.counters["update_us"] = update_ns_ / n / 1e3;
    state.counters["add_us"] = add_ns_ / n / 1e3;
    state.counters["arrival_hash_us"] = arrival_hash_ns_ / n / 1e3;
    state.counters["arrivals"] = arrivals_ / n;
    state.counters["tokens"] = tokens_ / n;
    const Scheduler& s = w.scheduler();
    const SchedulerStats stats = s.Stats();
    state.counters["running"] = stats.num_running;
    state.counters["kv_usage"] = stats.kv_usage;
    state.counters["hit_rate"] = stats.counters.prefix_cache.HitRate();
    state.counters["preempt"] = static_cast<double>(stats.counters.num_preemptions);
    state.counters["evicted"] = static_cast<double>(stats.counters.num_evicted_blocks);
    state.counters["offloaded"] = static_cast<double>(stats.counters.num_offloaded_blocks);
    state.counters["restores"] = static_cast<double>(stats.counters.num_restores_started);
    state.counters["arbiter_calls"] = static_cast<double>(stats.counters.num_arbiter_calls);
    state.counters["offloaded"] = w.offloader().OffloadedGroups();
    if (w.vamp() != nullptr) {
      state.counters["ghosts"] = static_cast<double>(w.vamp()->reuse_tracker()->ghosts().size());
    }
  }

 private:
  std::vector<int64_t> steps_;
  int64_t schedule_ns_ = 0, update_ns_ = 0, add_ns_ = 0, arrival_hash_ns_ = 0;
  int64_t arrivals_ = 0, tokens_ = 0;
};

void RunTimed(benchmark::State& state, Workload& w) {
  StepLog log;
  for (auto _ : state) {
    const Workload::StepTimes t = w.Step();
    log.Add(t);
    state.SetIterationTime(t.total_ns() * 1e-9);
  }
  log.Report(state, w);
}

void BM_DecodeStep(benchmark::State& state) {
  Workload w(static_cast<int32_t>(state.range(0)), Mix::kDecode, state.range(1) != 0,
             /*hash_at_arrival=*/false);
  w.WarmUpToDecode();
  RunTimed(state, w);
}
BENCHMARK(BM_DecodeStep)
    ->Args({256, 0})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Iterations(400)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_ChurnStep(benchmark::State& state) {
  Workload w(static_cast<int32_t>(state.range(0)), Mix::kChurn, state.range(1) != 0,
             state.range(2) != 0);
  w.WarmUpToDecode();
  for (int i = 0; i < 400; ++i) w.Step();  // past the first finishes: steady arrivals
  RunTimed(state, w);
}
BENCHMARK(BM_ChurnStep)
    ->ArgNames({"running", "vamp", "hash_at_arrival"})
    ->Args({1024, 0, 0})
    ->Args({1024, 0, 1})
    ->Args({1024, 1, 0})
    ->Args({1024, 1, 1})
    ->Iterations(1000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_PressureStep(benchmark::State& state) {
  Workload w(static_cast<int32_t>(state.range(0)), Mix::kDocuments, /*vamp=*/true,
             state.range(1) != 0, /*staged_bytes_per_group=*/int64_t{32} << 20);
  w.WarmUpToDecode();
  for (int i = 0; i < 1200; ++i) w.Step();  // ghost list full, evidence window past min steps
  RunTimed(state, w);
}
BENCHMARK(BM_PressureStep)
    ->ArgNames({"running", "hash_at_arrival"})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Iterations(1000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// A pool of `num_blocks` blocks, all cached, free and idle: filled and then released in a
// scattered order (as requests finish), 96 blocks per step over steps 1, 2, ... so that the LRU
// queue jumps around the block array and holds num_blocks / 96 distinct last-use steps.
void FillIdlePool(KvBlockPool& pool) {
  std::vector<BlockId> ids;
  pool.SetStep(1);
  pool.AllocateUncached(pool.num_free_uncached(), &ids);
  for (BlockId id : ids) pool.Cache(id, BlockHash{static_cast<uint64_t>(id) + 1, 7});
  std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
  for (size_t i = 0; i < ids.size(); ++i) {
    pool.SetStep(1 + static_cast<int64_t>(i / 96));
    pool.Release(ids[i]);
  }
}

// The working-set rule's count of idle cached blocks (those last used before a step), over a
// pool of state.range(0) blocks that are all idle (the worst case: the count covers them all).
// Method 0: the walk from the LRU end that RestoreTax did before (one random access per block);
// 1: KvBlockPool::CountCachedFreeUsedBefore (the LRU step index, one pass over the runs).
void BM_IdleCachedCount(benchmark::State& state) {
  KvBlockPool pool(static_cast<int32_t>(state.range(0)), /*enable_caching=*/true);
  FillIdlePool(pool);
  const int64_t before = pool.step() + 1;
  int64_t idle = 0;
  for (auto _ : state) {
    const int64_t t0 = ThreadNanos();
    if (state.range(1) == 0) {
      idle = 0;
      pool.ForEachCachedFree([&](const KvBlock& b) {
        if (b.last_used_step >= before) return false;
        ++idle;
        return true;
      });
    } else {
      idle = pool.CountCachedFreeUsedBefore(before);
    }
    benchmark::DoNotOptimize(idle);
    state.SetIterationTime((ThreadNanos() - t0) * 1e-9);
  }
  state.counters["idle"] = static_cast<double>(idle);
}
BENCHMARK(BM_IdleCachedCount)
    ->ArgNames({"blocks", "index"})
    ->Args({98304, 0})
    ->Args({98304, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The tax model's restore check (VampArbiter::OnStepBoundary, as it runs every 20 steps while
// groups are offloaded) at its worst: every block of a pool at the offload cap (65,536 + 16 × 2,048
// = 98,304 blocks) is cached, free and idle (FillIdlePool), so the working-set rule counts them
// all.
void BM_RestoreCheck(benchmark::State& state) {
  KvBlockPool pool(static_cast<int32_t>(state.range(0)), /*enable_caching=*/true);
  FillIdlePool(pool);
  VampArbiter arbiter{VampArbiterConfig{}};
  ManualClock clock;
  for (int i = 0; i < 300; ++i) {  // past min_evidence_steps
    clock.AdvanceMicros(20000);
    StepTiming t;
    t.end_micros = clock.NowMicros();
    t.step_micros = 20000;
    t.decode_tokens = 1024;
    arbiter.ObserveStep(t);
  }
  SchedulerConfig config;
  SchedulerCounters counters;
  const std::vector<Request*> running;
  OffloadState e;
  e.available = true;
  e.blocks_per_group = 2048;
  e.offloaded_groups = 16;
  e.max_groups = 16;
  e.experts_per_group = 2;
  e.experts_per_layer = 128;
  e.staged_bytes_per_group = int64_t{32} << 20;
  int64_t step = pool.step() + 1000;
  int32_t groups = 0;
  for (auto _ : state) {
    const ArbiterContext context(pool, running, counters, config, step, clock.NowMicros(), e, 0);
    const int64_t t0 = ThreadNanos();
    groups = arbiter.OnStepBoundary(context);
    state.SetIterationTime((ThreadNanos() - t0) * 1e-9);
    step += 20;  // restore.check_interval_steps: every call checks
  }
  state.counters["groups"] = groups;
}
BENCHMARK(BM_RestoreCheck)->Arg(98304)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The tax model's check for a pending restore (VampArbiter::PreemptForRestore, every 20 steps
// while a restore waits for its tail blocks): it looks for the running requests that hold blocks
// of the withdrawn tail. Here 1,024 decoding requests hold 2,048 blocks each (a shared 2,016-block
// prefix and 32 blocks of their own) in a pool of 98,304 blocks whose last 8 groups (16,384
// blocks) are being withdrawn; every 64th request holds one tail block, so the check scans all
// tables to find 16 holders.
void BM_PreemptForRestoreCheck(benchmark::State& state) {
  constexpr int32_t kRunning = 1024;
  constexpr int32_t kPool = 98304;
  constexpr int32_t kTail = 8 * 2048;
  KvBlockPool pool(kPool, /*enable_caching=*/true);
  std::vector<BlockId> shared;
  pool.AllocateUncached(2016, &shared);
  std::vector<std::unique_ptr<Request>> owned;
  std::vector<Request*> running;
  for (int32_t i = 0; i < kRunning; ++i) {
    RequestSpec spec;
    spec.id = static_cast<RequestId>(i);
    spec.prompt_token_ids.assign(kContextTokens, 1);
    spec.sampling_params.max_tokens = 256 + i % 128;
    auto r = std::make_unique<Request>(std::move(spec), 0, static_cast<uint64_t>(i));
    std::vector<BlockId>& table = r->mutable_block_ids();
    table = shared;
    for (BlockId id : shared) pool.Acquire(id);
    pool.AllocateUncached(i % 64 == 0 ? 31 : 32, &table);
    r->set_num_computed_tokens(kContextTokens);
    r->set_status(RequestStatus::kRunning);
    running.push_back(r.get());
    owned.push_back(std::move(r));
  }
  // The holders' last block: one from the tail.
  std::vector<BlockId> tail;
  pool.AllocateUncached(pool.num_free_uncached(), &tail);
  for (int32_t i = 0; i < kRunning; i += 64) {
    running[i]->mutable_block_ids().push_back(tail.back());
    tail.pop_back();
  }
  for (BlockId id : tail) pool.Release(id);
  if (!pool.BeginShrink(kTail).ok()) std::abort();
  VampArbiter arbiter{VampArbiterConfig{}};
  ManualClock clock;
  for (int i = 0; i < 300; ++i) {
    clock.AdvanceMicros(20000);
    StepTiming t;
    t.end_micros = clock.NowMicros();
    t.step_micros = 20000;
    t.decode_tokens = kRunning;
    arbiter.ObserveStep(t);
  }
  SchedulerConfig config;
  config.max_model_len = 40960;
  SchedulerCounters counters;
  OffloadState e;
  e.blocks_per_group = 2048;
  e.offloaded_groups = 16;
  e.max_groups = 16;
  e.staged_bytes_per_group = int64_t{846} << 20;
  e.restore_pending = true;
  e.restore_pending_groups = 8;
  {  // the tax geometry (OnStepBoundary sets it; with a restore pending it changes nothing else)
    const ArbiterContext context(pool, running, counters, config, 1, clock.NowMicros(), e, 0);
    arbiter.OnStepBoundary(context);
  }
  int64_t step = 1000;
  size_t preempted = 0;
  for (auto _ : state) {
    const ArbiterContext context(pool, running, counters, config, step, clock.NowMicros(), e, 0);
    const int64_t t0 = ThreadNanos();
    const ArbiterPlan plan = arbiter.PreemptForRestore(context);
    state.SetIterationTime((ThreadNanos() - t0) * 1e-9);
    preempted = plan.preempt.size();
    step += 20;  // restore.check_interval_steps: every call checks
  }
  state.counters["preempt"] = static_cast<double>(preempted);
}
BENCHMARK(BM_PreemptForRestoreCheck)->UseManualTime()->Unit(benchmark::kMicrosecond);

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

// The same chain through the streaming SipHash128 (the byte-stream path, which BlockHasher::Hash
// used for every block before its register-resident fast path): the two give the same hashes.
void BM_HashPromptStreaming(benchmark::State& state) {
  std::vector<TokenId> tokens(kContextTokens);
  for (int32_t i = 0; i < kContextTokens; ++i) tokens[i] = (i * 7919) % 150000;
  for (auto _ : state) {
    BlockHash parent;
    for (int32_t b = 0; b < kContextTokens / kBlockSize; ++b) {
      SipHash128 h(BlockHasher::kDefaultKey0, BlockHasher::kDefaultKey1);
      h.AddU64(parent.lo);
      h.AddU64(parent.hi);
      for (int32_t i = 0; i < kBlockSize; i += 2) {
        const size_t k = static_cast<size_t>(b) * kBlockSize + i;
        h.AddU64(static_cast<uint64_t>(static_cast<uint32_t>(tokens[k])) |
                 (static_cast<uint64_t>(static_cast<uint32_t>(tokens[k + 1])) << 32));
      }
      h.AddU32(0);  // extra length
      parent = h.Finish();
    }
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations() * (kContextTokens / kBlockSize));
}
BENCHMARK(BM_HashPromptStreaming)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vamp

BENCHMARK_MAIN();
