// RemoteOffloader, the controller's offload driver (controller/serving/remote_offloader.h), against
// fake agents on loopback: the pool every rank uses is the cross-rank minimum computed from the
// geometry the ranks declared at Init, with no RPC of its own; the remap rides on the next step,
// which the ranks all refuse when one of them cannot reach the expected count, leaving every rank
// and the offloader's view as before once the rollback (on the step after) ran; a rank that
// reports memory the view does not expect is caught, by name.
#include "controller/serving/remote_offloader.h"

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/serving/fake_agent_service.h"

namespace vamp {
namespace {

using ::testing::ElementsAre;
using testing::FakeAgentGroup;
using testing::FakeRankSpec;
using ::testing::HasSubstr;

FakeRankSpec Rank(int64_t kv_blocks, int64_t blocks_per_group, int32_t max_groups,
                  uint64_t staged_bytes) {
  FakeRankSpec r;
  r.kv_blocks = kv_blocks;
  r.blocks_per_group = blocks_per_group;
  r.max_offload_groups = max_groups;
  r.staged_bytes_per_group = staged_bytes;
  return r;
}

// Two ranks whose memory differs, as ranks of one group do when their devices differ in free
// memory: rank 0 has 64 blocks (+8 a group, 4 groups), rank 1 60 (+6 a group, 3 groups).
class RemoteOffloaderTest : public ::testing::Test {
 protected:
  RemoteOffloaderTest() : agents_({Rank(64, 8, 4, 1 << 20), Rank(60, 6, 3, 3 << 20)}) {}

  void SetUp() override {
    ASSERT_TRUE(agents_.status().ok()) << agents_.status();
    RemoteOffloader::Options options;
    options.retry_after_micros = 1000;
    options.clock = &clock_;
    absl::StatusOr<std::unique_ptr<RemoteOffloader>> o =
        RemoteOffloader::Create(agents_.init_responses(), options);
    ASSERT_TRUE(o.ok()) << o.status();
    offloader_ = *std::move(o);
  }

  // Sends one (otherwise empty) step carrying what the offloader queued, as the engine does.
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> Step() {
    vamp::v1::StepRequest request;
    request.set_step_id(++step_);
    request.set_num_blocks(offloader_->kv_blocks());
    offloader_->AttachTo(&request);
    return agents_.group()->Step(request);
  }
  // Step() and Confirm().
  void StepAndConfirm() {
    absl::StatusOr<std::vector<vamp::v1::StepResponse>> r = Step();
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status confirmed = offloader_->Confirm(*r);
    ASSERT_TRUE(confirmed.ok()) << confirmed;
  }

  // The remap commands rank `r` received, in order.
  std::vector<vamp::v1::RemapCommand> Remaps(int r) {
    std::vector<vamp::v1::RemapCommand> out;
    for (const vamp::v1::StepRequest& s : agents_.agent(r).steps()) {
      out.insert(out.end(), s.remaps().begin(), s.remaps().end());
    }
    return out;
  }
  int64_t Rpcs(int r) {
    return agents_.agent(r).unary_calls() + static_cast<int64_t>(agents_.agent(r).steps().size());
  }

  int64_t step_ = 0;
  ManualClock clock_;
  FakeAgentGroup agents_;
  std::unique_ptr<RemoteOffloader> offloader_;
};

TEST_F(RemoteOffloaderTest, SizesFromTheDeclaredGeometryWithoutAskingAndRidesTheNextStep) {
  const int64_t rpcs[2] = {Rpcs(0), Rpcs(1)};
  EXPECT_EQ(offloader_->kv_blocks(), 60);
  EXPECT_EQ(offloader_->BlocksPerGroup(), 6) << "min(64 + 8, 60 + 6) - 60";
  EXPECT_EQ(offloader_->max_groups(), 3);
  EXPECT_EQ(offloader_->RemainingGroups(), 3);
  EXPECT_EQ(offloader_->StagedBytesPerGroup(), 3 << 20) << "the largest over ranks";
  EXPECT_EQ(offloader_->BlocksRemovedByRestore(1), 0) << "nothing offloaded yet";

  absl::StatusOr<int32_t> added = offloader_->Offload(2);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 12);
  EXPECT_EQ(offloader_->kv_blocks(), 72);
  EXPECT_EQ(offloader_->OffloadedGroups(), 2);
  EXPECT_EQ(offloader_->RemainingGroups(), 1);
  EXPECT_EQ(offloader_->BlocksRemovedByRestore(2), 12);
  EXPECT_EQ(offloader_->BlocksRemovedByRestore(1), 6) << "rank 1: 72 -> 66";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Rpcs(r), rpcs[r]) << "rank " << r << ": sized without asking";
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 0) << "not before the next step";
  }
  EXPECT_TRUE(offloader_->has_queued());
  const std::string id = offloader_->last_remap_id();
  EXPECT_FALSE(offloader_->Outcome(id).has_value());

  StepAndConfirm();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Rpcs(r), rpcs[r] + 1) << "rank " << r << ": the offload took one step round";
    const std::vector<vamp::v1::RemapCommand> remaps = Remaps(r);
    ASSERT_EQ(remaps.size(), 1u) << "rank " << r;
    EXPECT_EQ(remaps[0].action(), vamp::v1::RemapCommand::ACTION_OFFLOAD);
    EXPECT_EQ(remaps[0].num_groups(), 2);
    EXPECT_EQ(remaps[0].expected_kv_blocks(), 72) << "rank " << r << ": min(64+16, 60+12)";
    EXPECT_EQ(remaps[0].remap_id(), id);
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 2);
    EXPECT_EQ(agents_.agent(r).kv_blocks(), 72) << "rank " << r << " keeps the shared table";
  }
  ASSERT_TRUE(offloader_->Outcome(id).has_value());
  EXPECT_TRUE(offloader_->Outcome(id)->ok());
  EXPECT_FALSE(offloader_->has_queued());

  // Restore one group: rank 1 limits the pool to 66.
  ASSERT_TRUE(offloader_->Restore(1).ok());
  EXPECT_EQ(offloader_->kv_blocks(), 66);
  StepAndConfirm();
  EXPECT_EQ(Remaps(0).back().action(), vamp::v1::RemapCommand::ACTION_RESTORE);
  EXPECT_EQ(Remaps(0).back().expected_kv_blocks(), 66);
  EXPECT_EQ(agents_.agent(0).kv_blocks(), 66);
  EXPECT_EQ(agents_.agent(1).kv_blocks(), 66);
}

TEST_F(RemoteOffloaderTest, ARemapOneRankRefusesIsRefusedByAllAndRolledBackOnTheNextStep) {
  agents_.agent(1).FailNextRemap("no free pages in the expert region");
  ASSERT_TRUE(offloader_->Offload(1).ok());
  const std::string id = offloader_->last_remap_id();
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> r = Step();
  ASSERT_TRUE(absl::IsAborted(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("agent rank 1"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no free pages"));
  EXPECT_TRUE(agents_.group()->healthy()) << "a refused step leaves the agents in step";
  EXPECT_EQ(agents_.agent(0).offloaded_groups(), 1) << "rank 0 applied it, until the rollback";
  EXPECT_EQ(agents_.agent(1).offloaded_groups(), 0);

  absl::StatusOr<int32_t> delta = offloader_->Refused(r.status());
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(*delta, 6) << "the blocks the scheduler gives back";
  EXPECT_EQ(offloader_->OffloadedGroups(), 0);
  EXPECT_EQ(offloader_->kv_blocks(), 60);
  ASSERT_TRUE(offloader_->Outcome(id).has_value());
  EXPECT_THAT(std::string(offloader_->Outcome(id)->message()), HasSubstr("no free pages"));
  EXPECT_FALSE(offloader_->Ready()) << "no remap until the rollback ran";
  EXPECT_TRUE(absl::IsFailedPrecondition(offloader_->Offload(1).status()));
  ASSERT_TRUE(offloader_->has_queued()) << "the rollback waits for a step";

  StepAndConfirm();  // the rollback step
  EXPECT_THAT(agents_.agent(0).rollbacks(), ElementsAre(id));
  EXPECT_THAT(agents_.agent(1).rollbacks(), ElementsAre(id));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(agents_.agent(rank).offloaded_groups(), 0) << "rank " << rank;
    EXPECT_EQ(agents_.agent(rank).kv_blocks(), rank == 0 ? 64 : 60)
        << "rank " << rank << ": as before";
  }
  EXPECT_FALSE(offloader_->Ready()) << "retry_after_micros = 1000";
  clock_.AdvanceMicros(999);
  EXPECT_FALSE(offloader_->Ready());
  clock_.AdvanceMicros(1);
  EXPECT_TRUE(offloader_->Ready());

  // The next offload works as if nothing had happened.
  absl::StatusOr<int32_t> again = offloader_->Offload(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 6);
  StepAndConfirm();
  EXPECT_EQ(agents_.agent(0).offloaded_groups(), 1);
  EXPECT_EQ(agents_.agent(1).offloaded_groups(), 1);
}

TEST_F(RemoteOffloaderTest, ARefusedRollbackIsNotRecoverable) {
  agents_.agent(1).FailNextRemap("cannot map");
  ASSERT_TRUE(offloader_->Offload(1).ok());
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> r = Step();
  ASSERT_TRUE(absl::IsAborted(r.status()));
  ASSERT_TRUE(offloader_->Refused(r.status()).ok());
  clock_.AdvanceMicros(1000);
  EXPECT_FALSE(offloader_->Ready()) << "not before the rollback was answered";
  // The step carrying the rollback is refused too (as if a rank could not undo it).
  vamp::v1::StepRequest rollback;
  offloader_->AttachTo(&rollback);
  ASSERT_EQ(rollback.rollback_remap_ids_size(), 1);
  absl::StatusOr<int32_t> again = offloader_->Refused(absl::AbortedError("rank 0: cannot unmap"));
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("rolling back remap"));
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("may differ"));
}

TEST_F(RemoteOffloaderTest, ARankReportingOtherMemoryThanTheViewIsCaughtByName) {
  ASSERT_TRUE(offloader_->Offload(1).ok());
  // Rank 1 applies the remap but claims another pool (a buggy or lying agent).
  agents_.agent(1).ReportKvBlocks(70);
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> r = Step();
  ASSERT_TRUE(r.ok()) << r.status();
  absl::Status confirmed = offloader_->Confirm(*r);
  EXPECT_TRUE(absl::IsInternal(confirmed)) << confirmed;
  EXPECT_THAT(std::string(confirmed.message()), HasSubstr("agent rank 1"));
  EXPECT_THAT(std::string(confirmed.message()), HasSubstr("memory.kv_blocks = 70"));
}

TEST_F(RemoteOffloaderTest, RefusesMoreThanTheCapAndNothing) {
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_->Offload(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_->Offload(4).status())) << "3 remain under the cap";
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_->Restore(1))) << "nothing is offloaded";
  EXPECT_FALSE(offloader_->has_queued());
}

TEST(RemoteOffloaderCreateTest, RanksThatDisagreeOnTheOffloadedGroupsAreRefused) {
  vamp::v1::InitResponse a, b;
  a.mutable_memory()->set_offloaded_groups(1);
  b.mutable_memory()->set_offloaded_groups(2);
  absl::StatusOr<std::unique_ptr<RemoteOffloader>> o = RemoteOffloader::Create({a, b}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << o.status();
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("rank 1 has 2"));
}

}  // namespace
}  // namespace vamp
