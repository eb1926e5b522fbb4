// Builds arbiter inputs by hand: a pool with cached free blocks of chosen ages, running requests
// with chosen block tables and output budgets, and scheduler counters with a chosen hit rate.
#ifndef VAMP_TESTS_CONTROLLER_ARBITER_ARBITER_TEST_UTIL_H_
#define VAMP_TESTS_CONTROLLER_ARBITER_ARBITER_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/kv_block_pool.h"
#include "controller/core/memory_arbiter.h"
#include "controller/core/request.h"
#include "controller/core/scheduler_config.h"
#include "controller/core/scheduler_stats.h"
#include "gtest/gtest.h"

namespace vamp::testing {

// The paper's arbiter (cost model "paper", no restore, no self-calibration): the configuration
// the cost-model tests below were written against.
inline VampArbiterConfig PaperArbiterConfig() {
  VampArbiterConfig c;
  c.cost_model = VampCostModel::kPaper;
  c.restore.enabled = false;
  c.self_calibration.enabled = false;
  return c;
}

class ArbiterFixture {
 public:
  static constexpr int32_t kBlockSize = 16;

  explicit ArbiterFixture(int32_t pool_blocks = 4096) : pool_(pool_blocks, true) {
    config_.block_size = kBlockSize;
    config_.num_blocks = pool_blocks;
    config_.max_model_len = 1 << 20;
  }

  // `n` cached free blocks whose last use was at step `used_at` (callers add them oldest first,
  // as the LRU queue orders them).
  void AddCachedFree(int32_t n, int64_t used_at) {
    pool_.SetStep(used_at);
    std::vector<BlockId> ids;
    pool_.AllocateUncached(n, &ids);
    for (BlockId id : ids) {
      ASSERT_TRUE(pool_.Cache(id, BlockHash{++next_hash_, 7}));
      pool_.Release(id);
    }
  }

  // A running request holding `full_blocks` cached blocks and, when partial_tokens > 0, one
  // uncached partial block with that many computed tokens; it may still produce `budget` tokens.
  Request* AddRunning(RequestId id, int32_t full_blocks, int32_t partial_tokens, int32_t budget) {
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids.assign(full_blocks * kBlockSize + partial_tokens + 1, 1);
    spec.sampling_params.max_tokens = budget;
    auto r = std::make_unique<Request>(std::move(spec), /*arrival_micros=*/id,
                                       /*seq=*/owned_.size());
    std::vector<BlockId>& table = r->mutable_block_ids();
    pool_.AllocateUncached(full_blocks + (partial_tokens > 0 ? 1 : 0), &table);
    for (int32_t i = 0; i < full_blocks; ++i) {
      EXPECT_TRUE(pool_.Cache(table[i], BlockHash{++next_hash_, 9}));
    }
    r->set_num_computed_tokens(full_blocks * kBlockSize + partial_tokens);
    r->set_status(RequestStatus::kRunning);
    running_.push_back(r.get());
    owned_.push_back(std::move(r));
    return running_.back();
  }

  // Cumulative prefix-cache counters giving hit rate `rate` over `requests` admissions.
  void SetHitRate(double rate, int64_t requests = 100) {
    counters_.prefix_cache.requests = requests;
    counters_.prefix_cache.query_tokens = requests * 1000;
    counters_.prefix_cache.hit_tokens = static_cast<int64_t>(rate * requests * 1000);
  }

  static OffloadState OffloadStateOf(int32_t remaining, int32_t blocks_per_group,
                                     int32_t experts_per_group = 2, int32_t experts_per_layer = 512,
                                     int32_t offloaded = 0) {
    OffloadState e;
    e.available = true;
    e.remaining_groups = remaining;
    e.blocks_per_group = blocks_per_group;
    e.experts_per_group = experts_per_group;
    e.experts_per_layer = experts_per_layer;
    e.offloaded_groups = offloaded;
    e.max_groups = offloaded + remaining;
    return e;
  }

  ArbiterContext Context(int64_t step, OffloadState offload = OffloadState()) {
    pool_.SetStep(step);
    // The clock reads the step number as µs: one step per µs.
    return ArbiterContext(pool_, running_, counters_, config_, step, /*now_micros=*/step, offload,
                          num_waiting_);
  }
  // Requests in the waiting queue as the next contexts report it (none by default).
  void set_num_waiting(int32_t n) { num_waiting_ = n; }

  static MemoryGap Gap(int32_t blocks, const Request* requester, bool running) {
    MemoryGap g;
    g.blocks = blocks;
    g.requester = requester;
    g.requester_running = running;
    return g;
  }

  KvBlockPool& pool() { return pool_; }
  SchedulerCounters& counters() { return counters_; }
  SchedulerConfig& config() { return config_; }

 private:
  KvBlockPool pool_;
  SchedulerConfig config_;
  SchedulerCounters counters_;
  std::vector<std::unique_ptr<Request>> owned_;
  std::vector<Request*> running_;
  uint64_t next_hash_ = 0;
  int32_t num_waiting_ = 0;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_CONTROLLER_ARBITER_ARBITER_TEST_UTIL_H_
