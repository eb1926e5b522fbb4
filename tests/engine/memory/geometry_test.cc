#include "engine/memory/geometry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPage = 2 * kMiB;  // H100/H200 VMM granularity

OffloadConfig Cap(double ratio) {
  OffloadConfig c;
  c.max_offload_ratio = ratio;
  return c;
}

// shared/DESIGN.md, "Memory model": groups of 2, 2, 4 experts; 18, 6, 6 MiB.
TEST(ExpertGeometryTest, Qwen3_30B_A3B_Tp1) {
  auto g = ComputeExpertGeometry(Qwen3_30B_A3B_Shape(), 1, kPage, Cap(0.15));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->w13_bytes, 6 * kMiB);
  EXPECT_EQ(g->w2_bytes, 3 * kMiB);
  EXPECT_EQ(g->expert_bytes, 9 * kMiB);
  EXPECT_EQ(g->group_experts, 2);
  EXPECT_EQ(g->group_bytes, 18 * kMiB);
  EXPECT_EQ(g->group_pages, 9);
  EXPECT_EQ(g->region_pages, 576);  // 128 x 9 MiB
  EXPECT_EQ(g->lead_bytes, 0u);
  EXPECT_EQ(g->eligible_layers.size(), 47u);
  EXPECT_EQ(g->eligible_layers.front(), 1);
  // floor(0.15 x 128) = 19 experts -> 9 whole groups.
  EXPECT_EQ(g->max_groups, 9);
  EXPECT_EQ(g->max_offload_experts, 18);
  EXPECT_EQ(g->staging_buffer_experts, 18);
  EXPECT_EQ(g->pages_per_group(), 9 * 47);
}

TEST(ExpertGeometryTest, Qwen3Next_80B_Tp2) {
  auto g = ComputeExpertGeometry(Qwen3Next_80B_A3B_Shape(), 2, kPage, Cap(0.15));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->expert_bytes, 3 * kMiB);
  EXPECT_EQ(g->group_experts, 2);
  EXPECT_EQ(g->group_bytes, 6 * kMiB);
  EXPECT_EQ(g->group_pages, 3);
  EXPECT_EQ(g->region_pages, 768);
  // VAMP-15: floor(76.8) = 76 experts = 38 groups in 47 layers = 10.46 GiB, the paper's
  // "reclaimed 10.5 GiB/GPU" (Table II).
  EXPECT_EQ(g->max_groups, 38);
  EXPECT_EQ(g->max_offload_pages(), 38 * 3 * 47);
  EXPECT_NEAR(static_cast<double>(g->max_offload_pages() * kPage) / (1 << 30), 10.5, 0.05);
}

TEST(ExpertGeometryTest, Qwen3Next_80B_Tp4) {
  auto g = ComputeExpertGeometry(Qwen3Next_80B_A3B_Shape(), 4, kPage, Cap(0.15));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->expert_bytes, 3 * kMiB / 2);
  EXPECT_EQ(g->group_experts, 4);
  EXPECT_EQ(g->group_bytes, 6 * kMiB);
  EXPECT_EQ(g->group_pages, 3);
  EXPECT_EQ(g->max_groups, 19);  // 76 experts
}

TEST(ExpertGeometryTest, ExpertCountNotAMultipleOfTheGroupPadsTheRegionFront) {
  ModelShape s = Qwen3Next_80B_A3B_Shape();
  s.num_experts = 5;
  s.num_experts_per_token = 2;
  auto g = ComputeExpertGeometry(s, 2, kPage, Cap(1.0));
  ASSERT_TRUE(g.ok()) << g.status();
  // 5 x 3 MiB = 15 MiB in 8 pages, 1 MiB of lead padding: the region ends on a page boundary.
  EXPECT_EQ(g->region_pages, 8);
  EXPECT_EQ(g->lead_bytes, 1 * kMiB);
  EXPECT_EQ(g->ExpertOffset(5), g->region_bytes());
  // Offloadable boundaries E - k*g start on page boundaries.
  EXPECT_EQ(g->ExpertOffset(3) % kPage, 0u);
  EXPECT_EQ(g->ExpertOffset(1) % kPage, 0u);
  EXPECT_EQ(g->max_groups, 2);
}

TEST(ExpertGeometryTest, StagingBufferBoundsTheOffloadableExperts) {
  OffloadConfig c = Cap(0.15);
  c.staging_buffer_experts = 5;
  auto g = ComputeExpertGeometry(Qwen3Next_80B_A3B_Shape(), 2, kPage, c);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->staging_buffer_experts, 5);
  EXPECT_EQ(g->max_offload_experts, 4);
  EXPECT_EQ(g->max_groups, 2);
}

TEST(ExpertGeometryTest, NothingIsOffloadableWithOneMoeLayerOrNoCap) {
  ModelShape s = Qwen3_30B_A3B_Shape();
  s.moe_layers = {5};
  s.dense_intermediate_size = 6144;
  auto one = ComputeExpertGeometry(s, 1, kPage, Cap(0.5));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->eligible_layers.empty());
  EXPECT_EQ(one->max_groups, 0);
  auto none = ComputeExpertGeometry(Qwen3_30B_A3B_Shape(), 1, kPage, Cap(0.0));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->max_groups, 0);
  EXPECT_EQ(none->staging_buffer_bytes(), 0u);
}

TEST(ExpertGeometryTest, RejectsBadSettings) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      ComputeExpertGeometry(Qwen3_30B_A3B_Shape(), 5, kPage, Cap(0.1)).status()));  // 768 % 5
  EXPECT_TRUE(absl::IsInvalidArgument(
      ComputeExpertGeometry(Qwen3_30B_A3B_Shape(), 0, kPage, Cap(0.1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ComputeExpertGeometry(Qwen3_30B_A3B_Shape(), 1, kPage, Cap(1.5)).status()));
  ModelShape bad = Qwen3_30B_A3B_Shape();
  bad.moe_layers = {3, 2};
  absl::Status s = ComputeExpertGeometry(bad, 1, kPage, Cap(0.1)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("moe_layers"));
}

TEST(KvBlockGeometryTest, PerTokenBytesMatchTheDesign) {
  // shared/DESIGN.md "Model shapes": 96 KiB and 24 KiB per token over all layers (all ranks).
  EXPECT_EQ(Qwen3_30B_A3B_Shape().KvBytesPerTokenPerRank(1), 96 * 1024);
  EXPECT_EQ(Qwen3Next_80B_A3B_Shape().KvBytesPerTokenPerRank(1), 24 * 1024);
  // Two KV heads over TP2 or TP4: one head per rank (replicated under TP4).
  EXPECT_EQ(Qwen3Next_80B_A3B_Shape().KvBytesPerTokenPerRank(2), 12 * 1024);
  EXPECT_EQ(Qwen3Next_80B_A3B_Shape().KvBytesPerTokenPerRank(4), 12 * 1024);
}

TEST(KvBlockGeometryTest, BlockMajorOffsets) {
  auto kv = ComputeKvBlockGeometry(Qwen3Next_80B_A3B_Shape(), 2, 16);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->layer_part_bytes, 16u * 256 * 2);
  EXPECT_EQ(kv->block_bytes, 192u * 1024);
  EXPECT_FALSE(kv->HasKv(0));  // Gated DeltaNet layer
  ASSERT_TRUE(kv->HasKv(3));
  EXPECT_EQ(kv->KOffset(3), 0u);
  EXPECT_EQ(kv->VOffset(3), kv->layer_part_bytes);
  EXPECT_EQ(kv->KOffset(7), 2 * kv->layer_part_bytes);
  EXPECT_EQ(kv->VOffset(47), kv->block_bytes - kv->layer_part_bytes);
  EXPECT_EQ(kv->BlocksIn(kPage), 10);  // 2 MiB / 192 KiB = 10.67: the rest waits for a page
  EXPECT_TRUE(
      absl::IsInvalidArgument(ComputeKvBlockGeometry(Qwen3Next_80B_A3B_Shape(), 2, 0).status()));
}

TEST(ModelShapeTest, PresetsValidateAndEstimateTheirSize) {
  for (const ModelShape& s : {Qwen3_30B_A3B_Shape(), Qwen3Next_80B_A3B_Shape()}) {
    ASSERT_TRUE(s.Validate().ok()) << s.name << ": " << s.Validate();
  }
  // Whole-model parameter counts: ~30.5B and ~80B.
  auto params = [](const ModelShape& s) {
    const double experts = static_cast<double>(s.moe_layers.size()) *
                           static_cast<double>(s.num_experts) *
                           static_cast<double>(s.ExpertBytesPerRank(1));
    return (experts + static_cast<double>(s.NonExpertWeightBytesPerRank(1))) / s.dtype_bytes;
  };
  EXPECT_NEAR(params(Qwen3_30B_A3B_Shape()) / 1e9, 30.5, 0.5);
  EXPECT_NEAR(params(Qwen3Next_80B_A3B_Shape()) / 1e9, 80.0, 1.0);
}

}  // namespace
}  // namespace vamp
