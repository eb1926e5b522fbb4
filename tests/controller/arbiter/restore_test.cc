// The scheduler's restore path (expert groups back from the KV pool) driven through the arbiter
// hook: the tail is withdrawn, the groups go back once it is free, and a gap meanwhile cancels.
#include <memory>
#include <vector>

#include "controller/arbiter/decision_log.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/arbiter/arbiter_test_util.h"
#include "tests/controller/core/scheduler_test_util.h"

namespace vamp {
namespace {

using testing::Harness;
using testing::Iota;
using testing::Spec;

// Offloads and restores whole groups of `blocks_per_group`.
class RestorableOffloader : public ExpertOffloader {
 public:
  RestorableOffloader(int32_t groups, int32_t blocks_per_group)
      : limit_(groups), blocks_per_group_(blocks_per_group) {}
  int32_t RemainingGroups() const override { return limit_ - offloaded_; }
  int32_t BlocksPerGroup() const override { return blocks_per_group_; }
  absl::StatusOr<int32_t> Offload(int32_t groups) override {
    offloaded_ += groups;
    return groups * blocks_per_group_;
  }
  int32_t OffloadedGroups() const override { return offloaded_; }
  // The remap rides on the plan of the step being scheduled (`scheduler` tells which), which
  // carries the releases the agents apply first; the harness's fake agent checks that nothing
  // it still holds lies past that plan's pool.
  absl::Status Restore(int32_t groups) override {
    offloaded_ -= groups;
    ++restores;
    restore_step = scheduler != nullptr ? scheduler->step() : -1;
    return absl::OkStatus();
  }
  int restores = 0;
  int64_t restore_step = -1;
  const Scheduler* scheduler = nullptr;

 private:
  int32_t limit_;
  int32_t blocks_per_group_;
  int32_t offloaded_ = 0;
};

// Offloads one group per gap (cancelling a pending restore first); asks for `restore` groups
// back at the next step boundary.
class ScriptedArbiter : public MemoryArbiter {
 public:
  absl::string_view name() const override { return "scripted"; }
  ArbiterPlan Decide(const ArbiterContext& context, const MemoryGap& gap) override {
    ArbiterPlan plan;
    if (context.offload().restore_pending) {
      plan.cancel_restore = true;
      plan.choice = "cancel-restore";
    } else if (context.offload().available && context.offload().remaining_groups > 0) {
      plan.offload_groups = 1;
      plan.choice = "offload";
    }
    return plan;
  }
  int32_t OnStepBoundary(const ArbiterContext& context) override {
    last_offloaded = context.offload().offloaded_groups;
    const int32_t r = restore;
    restore = 0;
    return r;
  }
  // Names every running request holding a block of the withdrawn tail (when preempt_holders).
  ArbiterPlan PreemptForRestore(const ArbiterContext& context) override {
    ArbiterPlan plan;
    if (!preempt_holders) return plan;
    for (int32_t i = 0; i < context.num_running(); ++i) {
      const Request& q = context.running(i);
      for (BlockId b : q.block_ids()) {
        if (b >= context.pool().shrink_begin()) {
          plan.preempt.push_back(q.id());
          plan.choice = "restore-preempt";
          break;
        }
      }
    }
    return plan;
  }
  int32_t restore = 0;
  int32_t last_offloaded = -1;
  bool preempt_holders = false;
};

SchedulerConfig SmallConfig() {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 16;
  return c;
}

TEST(RestoreTest, RestoreCommitsOnceTheTailIsFree) {
  RestorableOffloader offloader(4, 4);
  auto owned = std::make_unique<ScriptedArbiter>();
  ScriptedArbiter* arbiter = owned.get();
  Harness h(SmallConfig(), std::move(owned), &offloader);
  offloader.scheduler = &h.scheduler();
  // Two 12-token prompts need 6 blocks, plus decode: the pool grows by a group.
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(12), 2)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(12, 100), 2)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(3, Iota(8, 200), 2)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 12);
  EXPECT_EQ(offloader.OffloadedGroups(), 1);

  arbiter->restore = 1;
  h.Step();  // begins: the tail (blocks 8..11) is free, so it is withdrawn at once
  EXPECT_EQ(arbiter->last_offloaded, 1);
  EXPECT_EQ(h.scheduler().restore_pending_groups(), 1);
  ASSERT_EQ(h.scheduler().step_decisions().size(), 1u);
  EXPECT_EQ(h.scheduler().step_decisions()[0].plan.choice, "restore");
  EXPECT_EQ(h.scheduler().step_decisions()[0].restore_groups, 1);
  EXPECT_EQ(h.scheduler().Stats().num_withdrawn_blocks, 4);
  EXPECT_FALSE(h.scheduler().CommitShrinkPool().ok());  // it belongs to the restore
  h.Step();                                             // commits
  EXPECT_EQ(h.scheduler().restore_pending_groups(), 0);
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 8);
  EXPECT_EQ(offloader.restores, 1);
  EXPECT_EQ(offloader.OffloadedGroups(), 0);
  const SchedulerCounters& c = h.scheduler().counters();
  EXPECT_EQ(c.num_restores_started, 1);
  EXPECT_EQ(c.num_restores, 1);
  EXPECT_EQ(c.num_restored_blocks, 4);
  EXPECT_EQ(c.num_restores_cancelled, 0);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());
}

// Three 9-token prompts decoding two more tokens each need 3 blocks apiece: the pool grows to 12
// and the third request holds block 8, in the tail a restore of one group takes. Then the restore
// begins and waits for it.
void StartRestoreWaitingForAHolder(Harness& h, ScriptedArbiter* arbiter) {
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(1, Iota(9), 3)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(2, Iota(9, 100), 3)).ok());
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(3, Iota(9, 200), 3)).ok());
  h.Step();
  ASSERT_EQ(h.scheduler().pool().num_blocks(), 12);
  arbiter->restore = 1;
  h.Step();
  ASSERT_EQ(h.scheduler().restore_pending_groups(), 1);
  ASSERT_GT(h.scheduler().pool().shrink_outstanding(), 0);
}

// An offload forced between steps, then a restore the arbiter begins at the next boundary
// (withdrawing the new tail), and the agents refuse the step that carried the offload: the
// restore is given up and the pool is back where it was.
TEST(RestoreTest, ARefusedOffloadTakesARestoreBegunOverItsTailWithIt) {
  RestorableOffloader offloader(4, 4);
  auto owned = std::make_unique<ScriptedArbiter>();
  ScriptedArbiter* arbiter = owned.get();
  Harness h(SmallConfig(), std::move(owned), &offloader);
  offloader.scheduler = &h.scheduler();
  Scheduler& s = h.scheduler();
  absl::StatusOr<int32_t> added = s.OffloadGroups(1);
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_EQ(*added, 4);
  EXPECT_EQ(s.pool().num_blocks(), 12);
  arbiter->restore = 1;
  ASSERT_TRUE(s.Schedule().ok());
  ASSERT_EQ(s.restore_pending_groups(), 1) << "the restore withdrew the offloaded tail";
  ASSERT_TRUE(s.RevertStep(*added).ok());
  EXPECT_EQ(s.restore_pending_groups(), 0);
  EXPECT_EQ(s.counters().num_restores_cancelled, 1);
  EXPECT_FALSE(s.pool().shrink_pending());
  EXPECT_EQ(s.pool().num_blocks(), 8);
  EXPECT_TRUE(s.CheckInvariants().ok());
}

SchedulerConfig LongerConfig() {
  SchedulerConfig config = SmallConfig();
  config.max_model_len = 32;
  return config;
}

TEST(RestoreTest, GapCancelsAPendingRestore) {
  RestorableOffloader offloader(4, 4);
  auto owned = std::make_unique<ScriptedArbiter>();
  ScriptedArbiter* arbiter = owned.get();
  Harness h(LongerConfig(), std::move(owned), &offloader);
  offloader.scheduler = &h.scheduler();
  StartRestoreWaitingForAHolder(h, arbiter);
  if (HasFatalFailure()) return;
  // A fourth request needs blocks: the gap cancels the restore and the withdrawn blocks serve it.
  ASSERT_TRUE(h.scheduler().AddRequest(Spec(4, Iota(8, 300), 1)).ok());
  auto s = h.Step();
  EXPECT_EQ(s.plan.new_requests.size(), 1u);
  ASSERT_GE(h.scheduler().step_decisions().size(), 1u);
  EXPECT_EQ(h.scheduler().step_decisions()[0].plan.choice, "cancel-restore");
  EXPECT_EQ(h.scheduler().restore_pending_groups(), 0);
  EXPECT_EQ(h.scheduler().counters().num_restores_cancelled, 1);
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 12);
  EXPECT_EQ(offloader.restores, 0);
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler().counters().num_finished, 4);
}

TEST(RestoreTest, HoldersTheArbiterNamesArePreemptedAndTheRestoreCommits) {
  RestorableOffloader offloader(4, 4);
  auto owned = std::make_unique<ScriptedArbiter>();
  ScriptedArbiter* arbiter = owned.get();
  Harness h(LongerConfig(), std::move(owned), &offloader);
  offloader.scheduler = &h.scheduler();
  StartRestoreWaitingForAHolder(h, arbiter);
  if (HasFatalFailure()) return;
  arbiter->preempt_holders = true;
  auto s = h.Step();  // the holder is preempted at the step boundary; the restore commits there
  ASSERT_GE(h.scheduler().step_decisions().size(), 1u);
  EXPECT_EQ(h.scheduler().step_decisions()[0].plan.choice, "restore-preempt");
  EXPECT_EQ(h.scheduler().step_decisions()[0].requests_preempted, 1);
  // The agents learn of the preemption on the step that carries the restore, before they unmap
  // the tail the holder used (the fake agent would have failed the step otherwise).
  EXPECT_EQ(offloader.restore_step, s.plan.step);
  EXPECT_EQ(s.plan.preempted_ids, std::vector<RequestId>{3});
  EXPECT_EQ(s.plan.num_blocks, 8);
  EXPECT_EQ(h.scheduler().restore_pending_groups(), 0);
  EXPECT_EQ(h.scheduler().pool().num_blocks(), 8);
  EXPECT_EQ(offloader.restores, 1);
  EXPECT_EQ(h.scheduler().counters().num_preemptions, 1);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());
  arbiter->preempt_holders = false;
  h.RunToCompletion();  // the preempted request resumes and finishes in the smaller pool
  EXPECT_EQ(h.scheduler().counters().num_finished, 3);
}

// The restore commits at the boundary after the holder's last step, before any step request has
// told the agents it finished: the plan whose step carries the restore delivers that too, and
// the agents drop the request before they unmap its blocks.
TEST(RestoreTest, RequestsFinishedSinceTheLastPlanRideOnTheRestore) {
  RestorableOffloader offloader(4, 4);
  auto owned = std::make_unique<ScriptedArbiter>();
  ScriptedArbiter* arbiter = owned.get();
  Harness h(LongerConfig(), std::move(owned), &offloader);
  offloader.scheduler = &h.scheduler();
  StartRestoreWaitingForAHolder(h, arbiter);
  if (HasFatalFailure()) return;
  for (int i = 0; i < 10 && offloader.restores == 0; ++i) {
    auto s = h.Step();
    if (offloader.restores == 1) {
      EXPECT_EQ(offloader.restore_step, s.plan.step);
      EXPECT_THAT(s.plan.finished_ids, ::testing::Contains(3));
      EXPECT_TRUE(s.plan.preempted_ids.empty());
      EXPECT_EQ(s.plan.num_blocks, 8);
    }
  }
  ASSERT_EQ(offloader.restores, 1);
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler().counters().num_finished, 3);
}

TEST(RestoreTest, VampArbiterRestoresAfterPressureAndLogsIt) {
  VampArbiterConfig config = testing::PaperArbiterConfig();
  config.offload_step_groups = 1;
  config.restore.enabled = true;
  config.restore.quiet_steps = 5;
  config.restore.cold_age_steps = 3;
  config.restore.check_interval_steps = 1;
  config.costs.c_eff_micros = 0.01;                      // offloading is always cheapest here,
  config.restore.benefit_horizon_steps = 1'000'000'000;  // and so is restoring
  RestorableOffloader offloader(4, 4);
  Harness h(SmallConfig(), std::make_unique<VampArbiter>(config), &offloader);
  offloader.scheduler = &h.scheduler();
  DecisionLog log(16);
  SchedulerConfig c = SmallConfig();
  // Turn 1 of three sessions, then their second turns: reuse makes the arbiter offload.
  for (RequestId id = 1; id <= 3; ++id) {
    ASSERT_TRUE(h.scheduler().AddRequest(Spec(id, Iota(8, 100 * id), 4)).ok());
  }
  int steps = 0;
  while (h.scheduler().has_unfinished_requests() && steps++ < 100) {
    h.Step();
    log.AppendAll(h.clock().NowMicros(), h.scheduler().step_decisions());
  }
  for (RequestId id = 1; id <= 3; ++id) {
    ASSERT_TRUE(h.scheduler().AddRequest(Spec(10 + id, Iota(12, 100 * id), 2)).ok());
  }
  while (h.scheduler().has_unfinished_requests() && steps++ < 200) {
    h.Step();
    log.AppendAll(h.clock().NowMicros(), h.scheduler().step_decisions());
  }
  const int32_t offloaded = offloader.OffloadedGroups();
  ASSERT_GT(offloaded, 0) << "the workload should have needed an offload";
  // Idle steps: once quiet and the cached blocks are cold, groups go back one at a time.
  for (int i = 0; i < 60; ++i) {
    h.scheduler().Schedule().IgnoreError();  // nothing runs: empty plans
    log.AppendAll(h.clock().NowMicros(), h.scheduler().step_decisions());
  }
  EXPECT_EQ(offloader.OffloadedGroups(), 0);
  EXPECT_EQ(h.scheduler().pool().num_blocks(), c.num_blocks);
  const DecisionCounts counts = log.Counts();
  EXPECT_EQ(counts.by_choice.at("restore"), offloaded);
  EXPECT_GE(counts.by_choice.at("offload"), 1);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());
}

}  // namespace
}  // namespace vamp
