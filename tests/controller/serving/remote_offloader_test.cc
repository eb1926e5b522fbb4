// RemoteOffloader, the controller's offload driver (controller/serving/remote_offloader.h), against
// fake agents on loopback: the pool every rank uses is the cross-rank minimum and every remap
// carries it; a rank whose capacity report is impossible is refused, naming it; a remap that
// fails on one rank is rolled back on all of them, leaving every rank and the offloader where they
// were.
#include "controller/serving/remote_offloader.h"

#include <memory>
#include <string>
#include <vector>

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
  RemoteOffloaderTest()
      : agents_({Rank(64, 8, 4, 1 << 20), Rank(60, 6, 3, 3 << 20)}),
        offloader_(agents_.group(), [this] { return ++step_; }) {}

  void SetUp() override {
    ASSERT_TRUE(agents_.status().ok()) << agents_.status();
    offloader_.SetLimits(agents_.limits());
    ASSERT_TRUE(offloader_.Refresh().ok());
  }

  // The remap commands rank `r` received, in order.
  std::vector<vamp::v1::RemapCommand> Remaps(int r) {
    std::vector<vamp::v1::RemapCommand> out;
    for (const vamp::v1::StepRequest& s : agents_.agent(r).steps()) {
      out.insert(out.end(), s.remaps().begin(), s.remaps().end());
    }
    return out;
  }

  int64_t step_ = 0;
  FakeAgentGroup agents_;
  RemoteOffloader offloader_;
};

TEST_F(RemoteOffloaderTest, EveryRankUsesTheCrossRankMinimum) {
  EXPECT_EQ(offloader_.kv_blocks(), 60);
  EXPECT_EQ(offloader_.BlocksPerGroup(), 6) << "min(64+8, 60+6) - 60";
  EXPECT_EQ(offloader_.max_groups(), 3);
  EXPECT_EQ(offloader_.RemainingGroups(), 3);
  EXPECT_EQ(offloader_.StagedBytesPerGroup(), 3 << 20) << "the largest over ranks";

  absl::StatusOr<int32_t> added = offloader_.Offload(2);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 12);
  EXPECT_EQ(offloader_.kv_blocks(), 72);
  EXPECT_EQ(offloader_.offloaded_groups(), 2);
  EXPECT_EQ(offloader_.RemainingGroups(), 1);
  for (int r = 0; r < 2; ++r) {
    const std::vector<vamp::v1::RemapCommand> remaps = Remaps(r);
    ASSERT_EQ(remaps.size(), 1u) << "rank " << r;
    EXPECT_EQ(remaps[0].action(), vamp::v1::RemapCommand::ACTION_OFFLOAD);
    EXPECT_EQ(remaps[0].num_groups(), 2);
    EXPECT_EQ(remaps[0].expected_kv_blocks(), 72) << "rank " << r << ": min(64+16, 60+12)";
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 2);
    EXPECT_EQ(agents_.agent(r).kv_blocks(), 72) << "rank " << r << " keeps the shared table";
  }
  // Both ranks saw the same remap at the same step.
  EXPECT_EQ(Remaps(0)[0].remap_id(), Remaps(1)[0].remap_id());
}

TEST_F(RemoteOffloaderTest, RestoreCarriesTheReleasesAndGivesTheBlocksBack) {
  ASSERT_TRUE(offloader_.Offload(1).ok());
  EXPECT_EQ(offloader_.BlocksRemovedByRestore(1), 6);
  PendingReleases releases;
  releases.finished = {41};
  releases.preempted = {42};
  ASSERT_TRUE(offloader_.Restore(1, releases).ok());
  EXPECT_EQ(offloader_.kv_blocks(), 60);
  EXPECT_EQ(offloader_.offloaded_groups(), 0);
  for (int r = 0; r < 2; ++r) {
    const vamp::v1::StepRequest last = agents_.agent(r).steps().back();
    ASSERT_EQ(last.remaps_size(), 1);
    EXPECT_EQ(last.remaps(0).action(), vamp::v1::RemapCommand::ACTION_RESTORE);
    EXPECT_THAT(last.finished_request_ids(), ElementsAre(41u)) << "dropped before the remap";
    EXPECT_THAT(last.preempted_request_ids(), ElementsAre(42u));
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 0);
  }
}

TEST_F(RemoteOffloaderTest, AFailedRemapIsRolledBackOnEveryRank) {
  agents_.agent(1).FailNextRemap("no free pages in the expert region");
  absl::StatusOr<int32_t> added = offloader_.Offload(1);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(std::string(added.status().message()), HasSubstr("agent rank 1"));
  EXPECT_THAT(std::string(added.status().message()), HasSubstr("no free pages"));
  // Rank 0 had applied it; the rollback of that remap id went to both ranks.
  const std::string id = Remaps(0).at(0).remap_id();
  EXPECT_THAT(agents_.agent(0).rollbacks(), ElementsAre(id));
  EXPECT_THAT(agents_.agent(1).rollbacks(), ElementsAre(id));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agents_.agent(r).offloaded_groups(), 0) << "rank " << r;
  }
  EXPECT_EQ(offloader_.offloaded_groups(), 0);
  EXPECT_EQ(offloader_.kv_blocks(), 60);
  EXPECT_TRUE(agents_.group()->healthy()) << "a refused remap leaves the agents in step";

  // The next offload works as if nothing had happened.
  absl::StatusOr<int32_t> again = offloader_.Offload(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 6);
  EXPECT_EQ(agents_.agent(0).offloaded_groups(), 1);
  EXPECT_EQ(agents_.agent(1).offloaded_groups(), 1);
}

TEST_F(RemoteOffloaderTest, ARankClaimingImpossibleCapacityIsRefusedByName) {
  agents_.agent(1).ReportKvBlocksNow(int64_t{1} << 31);
  absl::Status s = offloader_.Refresh();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("kv_blocks_now"));
  // Every remap re-reads the reports: the liar fails it too, by name.
  absl::StatusOr<int32_t> added = offloader_.Offload(1);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(std::string(added.status().message()), HasSubstr("agent rank 1"));
}

TEST_F(RemoteOffloaderTest, WithoutInitLimitsTheHardCeilingStillApplies) {
  RemoteOffloader unlimited(agents_.group(), [this] { return ++step_; });
  agents_.agent(0).ReportKvBlocksNow(0);
  absl::Status s = unlimited.Refresh();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("agent rank 0 reported kv_blocks_now = 0"));
}

TEST_F(RemoteOffloaderTest, RefusesMoreThanTheCapAndNothing) {
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_.Offload(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_.Offload(4).status())) << "3 remain under the cap";
  EXPECT_TRUE(absl::IsInvalidArgument(offloader_.Restore(1, {}))) << "nothing is offloaded";
  EXPECT_TRUE(Remaps(0).empty());
}

}  // namespace
}  // namespace vamp
