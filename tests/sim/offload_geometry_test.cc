// The simulator's restatement of the expert/KV geometry against shared/DESIGN.md's numbers, and
// the simulated offloader built on it.
#include "sim/offload_geometry.h"

#include "gtest/gtest.h"
#include "sim/sim_offloader.h"

namespace vamp::sim {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kKiB = 1 << 10;

OffloadGeometry NextTp2(double ratio, int32_t staging_buffer_experts = 0) {
  absl::StatusOr<Calibration> c = CalibrationPreset("qwen3-next-80b-a3b-tp2");
  EXPECT_TRUE(c.ok());
  OffloadOptions o;
  o.cap = *OffloadCap::FromRatio(ratio, "ratio");
  o.staging_buffer_experts = staging_buffer_experts;
  absl::StatusOr<OffloadGeometry> g = ComputeOffloadGeometry(c->model, o);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

TEST(OffloadGeometryTest, QwenNextTp2MatchesDesign) {
  const OffloadGeometry g = NextTp2(0.25);
  EXPECT_EQ(g.expert_bytes, 3 * kMiB);
  EXPECT_EQ(g.experts_per_group, 2);
  EXPECT_EQ(g.group_bytes, 6 * kMiB);
  EXPECT_EQ(g.eligible_layers, 47);
  EXPECT_EQ(g.bytes_per_group(), 282 * kMiB);
  EXPECT_EQ(g.kv_block_bytes, 192 * kKiB);  // 12 KiB per token per rank × 16
  EXPECT_EQ(g.base_blocks(), 43690);        // 8 GiB / 192 KiB
  EXPECT_EQ(g.BlocksWithGroups(1) - g.BlocksWithGroups(0), 1504);
  EXPECT_EQ(g.max_offload_experts, 128);
  EXPECT_EQ(g.max_groups, 64);
}

TEST(OffloadGeometryTest, CapIsTheRatioOrTheStagingBufferInWholeGroups) {
  EXPECT_EQ(NextTp2(0.10).max_groups, 25);  // floor(51.2) = 51 experts → 25 groups
  EXPECT_EQ(NextTp2(0.15).max_groups, 38);  // 76 experts
  EXPECT_EQ(NextTp2(0.20).max_groups, 51);  // 102 experts
  EXPECT_EQ(NextTp2(0.25, /*staging_buffer_experts=*/65).max_groups, 32);  // E_buffer 65 → 64
  EXPECT_EQ(NextTp2(0).max_groups, 0);
  // The paper's Table II: VAMP-15 reclaims 10.5 GiB per GPU (38 groups × 282 MiB = 10.47 GiB).
  const OffloadGeometry g = NextTp2(0.15);
  EXPECT_NEAR(g.max_groups * g.bytes_per_group() / static_cast<double>(1LL << 30), 10.5, 0.05);
}

TEST(OffloadGeometryTest, Qwen30bGroupsOfTwo) {
  OffloadOptions o;
  o.cap = OffloadCap::Constant(0.25);
  absl::StatusOr<OffloadGeometry> g = ComputeOffloadGeometry(SimModelShape{}, o);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->experts_per_group, 2);  // 2 × 9 MiB
  EXPECT_EQ(g->group_bytes, 18 * kMiB);
  EXPECT_EQ(g->max_groups, 16);
}

TEST(OffloadGeometryTest, BadOptionsNameTheOption) {
  OffloadOptions o;
  o.cap = OffloadCap::Constant(0.1);
  o.base_kv_bytes = 10;
  EXPECT_FALSE(ComputeOffloadGeometry(SimModelShape{}, o).ok());
}

TEST(SimOffloaderTest, OffloadsRestoresAndChargesRemapTime) {
  const OffloadGeometry g = NextTp2(0.15);
  RemapCosts costs;
  costs.per_group_layer_micros = 100;
  costs.h2d_bytes_per_s = 6e9;
  SimOffloader x(g, costs);
  EXPECT_EQ(x.RemainingGroups(), 38);
  EXPECT_EQ(x.BlocksPerGroup(), 1504);
  EXPECT_EQ(x.ExpertsPerGroup(), 2);
  EXPECT_EQ(x.ExpertsPerLayer(), 512);
  absl::StatusOr<int32_t> added = x.Offload(4);
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(*added, 4 * 1504);
  EXPECT_EQ(x.offloaded_experts_per_layer(), 8);
  EXPECT_EQ(x.OffloadedGroups(), 4);
  EXPECT_DOUBLE_EQ(x.TakeRemapMicros(), 4 * 47 * 100.0);
  EXPECT_DOUBLE_EQ(x.TakeRemapMicros(), 0);
  EXPECT_FALSE(x.Offload(35).ok());  // 34 left
  EXPECT_EQ(x.BlocksRemovedByRestore(2), 2 * 1504);
  ASSERT_TRUE(x.Restore(2).ok());
  EXPECT_EQ(x.OffloadedGroups(), 2);
  // Remap plus copying 2 × 47 groups of 6 MiB back at 6 GB/s.
  EXPECT_NEAR(x.TakeRemapMicros(), 2 * 47 * (100.0 + 1e6 * 6 * kMiB / 6e9), 1e-6);
  EXPECT_FALSE(x.Restore(3).ok());
  EXPECT_EQ(x.max_groups_reached(), 4);
}

}  // namespace
}  // namespace vamp::sim
