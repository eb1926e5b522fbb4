// Randomised property tests: random configurations, workloads, aborts (also while a step is in
// flight), pool growth and shrink, and both the static arbiter and a random one that exercises
// every arbiter action (preempting any running request, evicting arbitrary amounts, offloading).
// After every step:
//  - pool and scheduler invariants hold (reference counts equal block-table holders; no block both
//    free and in use; used + free + withdrawn = total; LRU order; cache map consistent);
//  - every prefix hit in the plan covers blocks cached under the hashes of the request's own
//    tokens, recomputed here independently;
//  - the agent's block tables, rebuilt from plan diffs alone, equal the scheduler's;
//  - no request is lost or duplicated: every added request finishes exactly once or is aborted.
// A second suite runs the same with recurrent state (Qwen3-Next): the fake agent keeps the state
// snapshots the plans capture and refuses any hit that none of exactly its tokens serves.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "controller/core/scheduler.h"
#include "controller/core/static_arbiter.h"
#include "gtest/gtest.h"
#include "tests/controller/core/scheduler_test_util.h"

namespace vamp {
namespace {

using testing::FakeAgent;

class RandomOffloader : public ExpertOffloader {
 public:
  RandomOffloader(int32_t groups, int32_t blocks_per_group)
      : groups_(groups), blocks_per_group_(blocks_per_group) {}
  int32_t RemainingGroups() const override { return groups_; }
  int32_t BlocksPerGroup() const override { return blocks_per_group_; }
  absl::StatusOr<int32_t> Offload(int32_t groups) override {
    EXPECT_LE(groups, groups_);
    groups_ -= groups;
    step_groups += groups;
    step_blocks += groups * blocks_per_group_;
    return groups * blocks_per_group_;
  }
  // Offloaded while planning the current step: what a refusal gives back.
  int32_t step_groups = 0;
  int32_t step_blocks = 0;
  void Refused() { groups_ += step_groups; }

 private:
  int32_t groups_;
  int32_t blocks_per_group_;
};

// Picks arbitrary (valid or not) plans so the scheduler's plan application is exercised broadly.
class RandomArbiter : public MemoryArbiter {
 public:
  explicit RandomArbiter(uint64_t seed) : rng_(seed) {}
  absl::string_view name() const override { return "random"; }
  ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) override {
    ArbiterPlan plan;
    switch (rng_() % 5) {
      case 0:
        return static_.Decide(context, gap);
      case 1:
        plan.evict_blocks = static_cast<int32_t>(rng_() % (gap.blocks + 2));
        break;
      case 2:
        for (int k = 0, n = 1 + rng_() % 2; k < n && context.num_running() > 0; ++k) {
          const RequestId id = context.running(rng_() % context.num_running()).id();
          if (std::find(plan.preempt.begin(), plan.preempt.end(), id) == plan.preempt.end()) {
            plan.preempt.push_back(id);
          }
        }
        break;
      case 3:
        if (context.offload().available && context.offload().remaining_groups > 0) {
          plan.offload_groups = 1 + static_cast<int32_t>(rng_() % 2);
        }
        plan.evict_blocks = static_cast<int32_t>(rng_() % 2);
        break;
      default:
        break;  // no action
    }
    return plan;
  }

 private:
  std::mt19937_64 rng_;
  StaticArbiter static_;
};

// What a run exercised, to check that the random workloads reach every path.
struct Coverage {
  int64_t preemptions = 0;
  int64_t resumes = 0;
  int64_t hit_tokens = 0;
  int64_t evictions = 0;
  int64_t offloads = 0;
  int64_t aborts = 0;
  int64_t in_flight_aborts = 0;
  int64_t shrink_commits = 0;
  int64_t finished = 0;
  int64_t reverts = 0;
  int64_t snapshot_restores = 0;
};

class PropertyRun {
 public:
  explicit PropertyRun(uint64_t seed, bool recurrent = false)
      : seed_(seed), recurrent_(recurrent), rng_(seed * 7919 + 17) {}

  void Run() {
    SchedulerConfig c;
    c.block_size = std::vector<int32_t>{1, 2, 4, 16}[rng_() % 4];
    c.max_model_len = 32 + static_cast<int32_t>(rng_() % 129);
    const int32_t min_blocks = (c.max_model_len + c.block_size - 1) / c.block_size;
    c.num_blocks = min_blocks + static_cast<int32_t>(rng_() % (3 * min_blocks));
    c.max_num_batched_tokens = 8 + static_cast<int32_t>(rng_() % 249);
    c.enable_chunked_prefill = rng_() % 4 != 0;
    if (!c.enable_chunked_prefill) {
      c.max_num_batched_tokens = std::max(c.max_num_batched_tokens, c.max_model_len);
    }
    c.max_num_seqs = 1 + static_cast<int32_t>(rng_() % 12);
    c.long_prefill_token_threshold = rng_() % 3 == 0 ? 1 + static_cast<int32_t>(rng_() % 32) : 0;
    c.policy = rng_() % 2 ? SchedulingPolicy::kFcfs : SchedulingPolicy::kPriority;
    c.enable_prefix_caching = rng_() % 5 != 0;
    if (recurrent_) {
      c.recurrent_state_blocks = 1 + static_cast<int32_t>(seed_ % 3);
      c.snapshot_outputs = seed_ % 4 != 0;
    }
    config_ = c;
    hasher_ = BlockHasher(c.prefix_cache_hash_key0, c.prefix_cache_hash_key1);
    std::unique_ptr<MemoryArbiter> arbiter;
    if (seed_ % 2 == 0) {
      arbiter = std::make_unique<StaticArbiter>();
    } else {
      arbiter = std::make_unique<RandomArbiter>(seed_);
      offloader_ = std::make_unique<RandomOffloader>(static_cast<int32_t>(rng_() % 20),
                                                     1 + static_cast<int32_t>(rng_() % 4));
    }
    auto s = Scheduler::Create(c, &clock_, std::move(arbiter), offloader_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(s).value();
    agent_ = std::make_unique<FakeAgent>([this](RequestId id, int32_t pos) {
      return static_cast<TokenId>((id * 2654435761u + pos * 40503u + seed_) % kVocab);
    });
    agent_->set_recurrent(recurrent_);
    for (int p = 0; p < 4; ++p) {
      std::vector<TokenId> prefix(rng_() % (c.max_model_len / 2 + 1));
      for (TokenId& t : prefix) t = static_cast<TokenId>(rng_() % kVocab);
      prefixes_.push_back(prefix);
    }

    for (int step = 0; step < 400; ++step) {
      ASSERT_NO_FATAL_FAILURE(MaybeAddRequests());
      ASSERT_NO_FATAL_FAILURE(MaybeAbort());
      ASSERT_NO_FATAL_FAILURE(MaybeChangeCapacity());
      ASSERT_NO_FATAL_FAILURE(Step(/*abort_in_flight=*/rng_() % 25 == 0));
    }
    if (sched_->pool().shrink_pending()) {
      ASSERT_TRUE(sched_->CancelShrinkPool().ok());
    }
    for (int step = 0; step < 5000 && sched_->has_unfinished_requests(); ++step) {
      ASSERT_NO_FATAL_FAILURE(Step(false));
    }
    ASSERT_FALSE(sched_->has_unfinished_requests()) << "requests stuck, seed " << seed_;
    EXPECT_TRUE(live_.empty());
    EXPECT_EQ(finished_.size() + aborted_.size(), static_cast<size_t>(next_id_ - 1));
    for (RequestId id = 1; id < next_id_; ++id) {
      EXPECT_NE(finished_.count(id) + aborted_.count(id), 0u) << "request " << id << " lost";
    }
    EXPECT_EQ(sched_->Stats().num_used_blocks, 0);
    ASSERT_TRUE(sched_->CheckInvariants().ok());
    const SchedulerCounters& k = sched_->counters();
    coverage_.preemptions = k.num_preemptions;
    coverage_.resumes = k.num_resumed;
    coverage_.hit_tokens = k.prefix_cache.hit_tokens + k.prefix_cache.preempted_hit_tokens;
    coverage_.evictions = k.num_evicted_blocks;
    coverage_.offloads = k.num_offloads;
    coverage_.aborts = k.num_aborted;
    coverage_.finished = k.num_finished;
    coverage_.reverts = k.num_reverted_steps;
    coverage_.snapshot_restores = agent_->num_restores();
  }

  const Coverage& coverage() const { return coverage_; }

 private:
  static constexpr uint32_t kVocab = 40;
  static constexpr TokenId kEos = 0;

  void MaybeAddRequests() {
    const int n = rng_() % 3 == 0 ? static_cast<int>(rng_() % 3) : 0;
    for (int i = 0; i < n; ++i) {
      RequestSpec spec;
      spec.id = next_id_;
      spec.prompt_token_ids = prefixes_[rng_() % prefixes_.size()];
      const int32_t room =
          config_.max_model_len - 1 - static_cast<int32_t>(spec.prompt_token_ids.size());
      const int32_t suffix = 1 + static_cast<int32_t>(rng_() % std::max(1, std::min(room, 40)));
      for (int k = 0; k < suffix; ++k) spec.prompt_token_ids.push_back(rng_() % kVocab);
      spec.sampling_params.max_tokens = 1 + static_cast<int32_t>(rng_() % 30);
      spec.sampling_params.min_tokens =
          static_cast<int32_t>(rng_() % 3) % (*spec.sampling_params.max_tokens + 1);
      spec.sampling_params.ignore_eos = rng_() % 2 == 0;
      for (int k = 0, m = rng_() % 3; k < m; ++k) {
        spec.sampling_params.stop_token_ids.push_back(rng_() % kVocab);
      }
      spec.eos_token_id = kEos;
      spec.priority = static_cast<int32_t>(rng_() % 4);
      spec.cache_salt = rng_() % 8 == 0 ? "tenant-b" : "";
      salts_[spec.id] = spec.cache_salt;
      const bool fits = static_cast<int32_t>(spec.prompt_token_ids.size()) < config_.max_model_len;
      absl::Status st = sched_->AddRequest(std::move(spec));
      ASSERT_EQ(st.ok(), fits) << st;
      if (st.ok()) {
        live_.insert(next_id_);
      } else {
        aborted_.insert(next_id_);  // rejected: accounted for
      }
      ++next_id_;
    }
  }

  void AbortRandom() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, rng_() % live_.size());
    const RequestId id = *it;
    ASSERT_TRUE(sched_->AbortRequest(id).ok());
    live_.erase(id);
    aborted_.insert(id);
  }

  void MaybeAbort() {
    if (rng_() % 20 == 0) AbortRandom();
  }

  void MaybeChangeCapacity() {
    if (rng_() % 15 != 0) return;
    if (!sched_->pool().shrink_pending()) {
      if (rng_() % 2) {
        ASSERT_TRUE(sched_->GrowPool(1 + static_cast<int32_t>(rng_() % 4)).ok());
      } else {
        (void)sched_->BeginShrinkPool(1 + static_cast<int32_t>(rng_() % 3));  // may be refused
      }
    } else if (sched_->pool().shrink_outstanding() == 0) {
      ASSERT_TRUE(sched_->CommitShrinkPool().ok());
      ++coverage_.shrink_commits;
    } else if (rng_() % 3 == 0) {
      ASSERT_TRUE(sched_->CancelShrinkPool().ok());
    }
  }

  // Hashes of the leading `n` full blocks of `tokens`, computed independently of the scheduler.
  std::vector<BlockHash> ChainHashes(const std::vector<TokenId>& tokens, int32_t n,
                                     const std::string& salt) const {
    std::vector<BlockHash> out;
    BlockHash parent;
    const int32_t bs = config_.block_size;
    for (int32_t i = 0; i < n; ++i) {
      std::vector<TokenId> block(tokens.begin() + i * bs, tokens.begin() + (i + 1) * bs);
      parent = hasher_.Hash(parent, block, i == 0 ? salt : "");
      out.push_back(parent);
    }
    return out;
  }

  void CheckHit(RequestId id, const std::vector<TokenId>& tokens, const std::vector<BlockId>& table,
                int32_t computed, int64_t step) {
    const int32_t bs = config_.block_size;
    ASSERT_EQ(computed % bs, 0) << "step " << step << " request " << id;
    const int32_t n = computed / bs;
    ASSERT_LT(computed, static_cast<int32_t>(tokens.size()));
    ASSERT_LE(n, static_cast<int32_t>(table.size()));
    const std::vector<BlockHash> want = ChainHashes(tokens, n, salts_[id]);
    for (int32_t i = 0; i < n; ++i) {
      const KvBlock& b = sched_->pool().block(table[i]);
      ASSERT_TRUE(b.cached) << "step " << step << " request " << id << " hit block " << i;
      ASSERT_EQ(b.hash, want[i]) << "step " << step << " request " << id << " hit block " << i;
    }
  }

  void Step(bool abort_in_flight) {
    if (offloader_ != nullptr) offloader_->step_groups = offloader_->step_blocks = 0;
    absl::StatusOr<StepPlan> plan = sched_->Schedule();
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::Status inv = sched_->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "seed " << seed_ << " step " << plan->step << ": " << inv;
    for (const NewRequestPlan& p : plan->new_requests) {
      ASSERT_NO_FATAL_FAILURE(CheckHit(p.request_id, p.prompt_token_ids, p.block_ids,
                                       p.num_computed_tokens, plan->step));
    }
    for (const CachedRequestPlan& p : plan->cached_requests) {
      if (!p.resumed) continue;
      const auto& agent_state = agent_->requests().at(p.request_id);
      ASSERT_NO_FATAL_FAILURE(CheckHit(p.request_id, agent_state.tokens, p.new_block_ids,
                                       p.num_computed_tokens, plan->step));
    }
    if (abort_in_flight && !live_.empty()) {
      ASSERT_NO_FATAL_FAILURE(AbortRandom());
      ++coverage_.in_flight_aborts;
    }
    // The agents refuse the step now and then (as if a remap it carried had failed): it is undone
    // and planned again; the agent never saw it.
    if (rng_() % 12 == 0) {
      int32_t delta = 0;
      if (offloader_ != nullptr) {
        delta = offloader_->step_blocks;
        offloader_->Refused();
      }
      const int32_t blocks_before = sched_->pool().num_blocks() - delta;
      absl::Status reverted = sched_->RevertStep(delta);
      ASSERT_TRUE(reverted.ok()) << "seed " << seed_ << " step " << plan->step << ": " << reverted;
      ASSERT_EQ(sched_->pool().num_blocks(), blocks_before);
      EXPECT_FALSE(sched_->RevertStep(0).ok()) << "reverted twice";
      ++coverage_.reverts;
      inv = sched_->CheckInvariants();
      ASSERT_TRUE(inv.ok()) << "seed " << seed_ << " after reverting " << plan->step << ": " << inv;
      ASSERT_NO_FATAL_FAILURE(CheckAgentTables());
      clock_.AdvanceMicros(1 + rng_() % 2000);
      return;
    }
    absl::StatusOr<StepOutput> out = agent_->Execute(*plan, config_.block_size);
    ASSERT_TRUE(out.ok()) << "seed " << seed_ << ": " << out.status();
    if (!plan->empty()) {
      auto outputs = sched_->UpdateFromOutput(*out);
      ASSERT_TRUE(outputs.ok()) << outputs.status();
      for (const RequestOutput& o : *outputs) {
        ASSERT_TRUE(live_.count(o.request_id)) << "output for dead request " << o.request_id;
        if (o.finish_reason != FinishReason::kNone) {
          ASSERT_TRUE(finished_.insert(o.request_id).second) << "finished twice";
          live_.erase(o.request_id);
        }
      }
      inv = sched_->CheckInvariants();
      ASSERT_TRUE(inv.ok()) << "seed " << seed_ << " after step " << plan->step << ": " << inv;
    }
    ASSERT_NO_FATAL_FAILURE(CheckAgentTables());
    clock_.AdvanceMicros(1 + rng_() % 2000);
  }

  // The agent's tables, rebuilt from diffs, match the scheduler's.
  void CheckAgentTables() {
    for (int32_t i = 0; i < sched_->num_running(); ++i) {
      const Request& r = sched_->running(i);
      auto it = agent_->requests().find(r.id());
      ASSERT_NE(it, agent_->requests().end());
      ASSERT_EQ(it->second.table, r.block_ids()) << "seed " << seed_ << " request " << r.id();
      ASSERT_EQ(it->second.computed, r.num_computed_tokens());
    }
    ASSERT_EQ(static_cast<size_t>(sched_->num_running() + sched_->num_waiting()), live_.size());
  }

  const uint64_t seed_;
  const bool recurrent_;
  std::mt19937_64 rng_;
  SchedulerConfig config_;
  BlockHasher hasher_;
  ManualClock clock_;
  std::unique_ptr<RandomOffloader> offloader_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<FakeAgent> agent_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<RequestId, std::string> salts_;
  std::set<RequestId> live_, finished_, aborted_;
  RequestId next_id_ = 1;
  Coverage coverage_;
};

class SchedulerPropertyTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(SchedulerPropertyTest, InvariantsHoldUnderRandomWorkloads) {
  PropertyRun run(GetParam());
  run.Run();
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerPropertyTest, ::testing::Range<uint64_t>(0, 100));

class RecurrentSchedulerPropertyTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RecurrentSchedulerPropertyTest, InvariantsHoldAndEveryHitHasItsSnapshot) {
  PropertyRun run(GetParam(), /*recurrent=*/true);
  run.Run();
}

INSTANTIATE_TEST_SUITE_P(Seeds, RecurrentSchedulerPropertyTest, ::testing::Range<uint64_t>(0, 50));

TEST(SchedulerPropertyCoverageTest, RecurrentWorkloadsHitFromSnapshots) {
  int64_t restores = 0, hit_tokens = 0, preemptions = 0, evictions = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    PropertyRun run(seed, /*recurrent=*/true);
    ASSERT_NO_FATAL_FAILURE(run.Run());
    restores += run.coverage().snapshot_restores;
    hit_tokens += run.coverage().hit_tokens;
    preemptions += run.coverage().preemptions;
    evictions += run.coverage().evictions;
  }
  EXPECT_GT(restores, 100);
  EXPECT_GT(hit_tokens, 1000);
  EXPECT_GT(preemptions, 20);
  EXPECT_GT(evictions, 20);
  std::cout << "recurrent, over 20 seeds: snapshot restores " << restores << ", hit tokens "
            << hit_tokens << ", preemptions " << preemptions << ", evictions " << evictions << "\n";
}

TEST(SchedulerPropertyCoverageTest, RandomWorkloadsReachEveryPath) {
  Coverage total;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    PropertyRun run(seed);
    ASSERT_NO_FATAL_FAILURE(run.Run());
    const Coverage& c = run.coverage();
    total.preemptions += c.preemptions;
    total.resumes += c.resumes;
    total.hit_tokens += c.hit_tokens;
    total.evictions += c.evictions;
    total.offloads += c.offloads;
    total.aborts += c.aborts;
    total.in_flight_aborts += c.in_flight_aborts;
    total.shrink_commits += c.shrink_commits;
    total.finished += c.finished;
    total.reverts += c.reverts;
  }
  EXPECT_GT(total.preemptions, 20);
  EXPECT_GT(total.resumes, 20);
  EXPECT_GT(total.hit_tokens, 1000);
  EXPECT_GT(total.evictions, 20);
  EXPECT_GT(total.offloads, 5);
  EXPECT_GT(total.aborts, 20);
  EXPECT_GT(total.in_flight_aborts, 5);
  EXPECT_GT(total.shrink_commits, 5);
  EXPECT_GT(total.finished, 500);
  EXPECT_GT(total.reverts, 100);
  std::cout << "coverage over 20 seeds: preemptions " << total.preemptions << ", resumes "
            << total.resumes << ", hit tokens " << total.hit_tokens << ", evictions "
            << total.evictions << ", offloads " << total.offloads << ", aborts " << total.aborts
            << " (in flight " << total.in_flight_aborts << "), shrink commits "
            << total.shrink_commits << ", finished " << total.finished << ", refused steps "
            << total.reverts << "\n";
}

}  // namespace
}  // namespace vamp
