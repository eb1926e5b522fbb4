#include "controller/core/static_arbiter.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class StaticArbiterTest : public ::testing::Test {
 protected:
  StaticArbiterTest() : pool_(8, true) { config_.num_blocks = 8; }

  Request* AddRunning(RequestId id, int32_t priority, int64_t arrival) {
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids = {1, 2, 3};
    spec.priority = priority;
    owned_.push_back(std::make_unique<Request>(std::move(spec), arrival, owned_.size()));
    running_.push_back(owned_.back().get());
    return running_.back();
  }
  // Makes `n` cached free blocks.
  void MakeCachedFree(int n) {
    std::vector<BlockId> ids;
    pool_.AllocateUncached(n, &ids);
    for (BlockId id : ids) {
      ASSERT_TRUE(pool_.Cache(id, BlockHash{static_cast<uint64_t>(id) + 1, 0}));
      pool_.Release(id);
    }
  }
  ArbiterPlan Decide(int32_t gap, const Request* requester, bool running) {
    ArbiterContext context(pool_, running_, counters_, config_, 1, /*now_micros=*/1, OffloadState(),
                           /*num_waiting=*/0);
    MemoryGap g;
    g.blocks = gap;
    g.requester = requester;
    g.requester_running = running;
    return arbiter_.Decide(context, g);
  }

  KvBlockPool pool_;
  SchedulerConfig config_;
  SchedulerCounters counters_;
  std::vector<std::unique_ptr<Request>> owned_;
  std::vector<Request*> running_;
  StaticArbiter arbiter_;
};

TEST_F(StaticArbiterTest, EvictsWhenCachedBlocksCoverTheGap) {
  MakeCachedFree(3);
  Request* r = AddRunning(1, 0, 0);
  const ArbiterPlan plan = Decide(2, r, true);
  EXPECT_EQ(plan.evict_blocks, 2);
  EXPECT_THAT(plan.preempt, IsEmpty());
  EXPECT_EQ(plan.offload_groups, 0);
  EXPECT_EQ(plan.choice, "evict");
  EXPECT_EQ(arbiter_.name(), "static");
}

TEST_F(StaticArbiterTest, EvictsAllThenPreemptsTheNewestRunningRequest) {
  MakeCachedFree(1);
  Request* oldest = AddRunning(1, 0, 0);
  AddRunning(2, 0, 1);
  AddRunning(3, 0, 2);
  const ArbiterPlan plan = Decide(3, oldest, true);
  EXPECT_EQ(plan.evict_blocks, 1);
  EXPECT_THAT(plan.preempt, ElementsAre(3));
  EXPECT_EQ(plan.choice, "evict+preempt");
}

TEST_F(StaticArbiterTest, NewestRequesterPreemptsItself) {
  AddRunning(1, 0, 0);
  Request* newest = AddRunning(2, 0, 1);
  const ArbiterPlan plan = Decide(1, newest, true);
  EXPECT_THAT(plan.preempt, ElementsAre(2));
  EXPECT_EQ(plan.choice, "preempt");
}

TEST_F(StaticArbiterTest, WaitingRequesterNeverPreempts) {
  AddRunning(1, 0, 0);
  RequestSpec spec;
  spec.id = 9;
  spec.prompt_token_ids = {1};
  Request waiting(std::move(spec), 5, 99);
  const ArbiterPlan plan = Decide(4, &waiting, false);
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.choice, "wait");
}

TEST_F(StaticArbiterTest, PriorityPolicyPreemptsTheLargestKey) {
  config_.policy = SchedulingPolicy::kPriority;
  AddRunning(1, 5, 0);  // low priority (large value), oldest
  AddRunning(2, 0, 1);
  Request* requester = AddRunning(3, 1, 2);
  EXPECT_THAT(Decide(1, requester, true).preempt, ElementsAre(1));
  // Equal priorities: the later arrival goes first.
  running_.erase(running_.begin());
  AddRunning(4, 1, 3);
  EXPECT_THAT(Decide(1, requester, true).preempt, ElementsAre(4));
}

}  // namespace
}  // namespace vamp
