#include "engine/memory/memory_plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kH100Bytes = 81559 * kMiB;   // H100 80 GB as the driver reports it
constexpr uint64_t kH200Bytes = 143771 * kMiB;  // H200 141 GB

MemoryPlanConfig Config(int tp_size, uint64_t device_bytes) {
  MemoryPlanConfig c;
  c.tp_size = tp_size;
  c.device_memory_bytes = device_bytes;
  return c;
}

// Every byte of the budget is in exactly one bucket, whole pages go to the KV pool, and the block
// counts follow from the pages.
void ExpectConsistent(const MemoryPlan& plan) {
  const uint64_t page = plan.config.page_bytes;
  EXPECT_LT(plan.slack_bytes(), page);
  EXPECT_EQ(plan.kv_baseline_blocks,
            static_cast<int64_t>(plan.kv_baseline_pages * page / plan.kv.block_bytes));
  EXPECT_EQ(plan.kv_max_pages, plan.kv_baseline_pages + plan.experts.max_kv_offload_pages());
  EXPECT_EQ(plan.kv_max_blocks,
            static_cast<int64_t>(plan.kv_max_pages * page / plan.kv.block_bytes));
  EXPECT_EQ(plan.pool_pages(), plan.experts.total_pages() + plan.experts.reserved_staging_pages() +
                                   plan.kv_baseline_pages);
  EXPECT_EQ(plan.reserved_staging_bytes, plan.experts.reserved_staging_pages() * page);
}

TEST(MemoryPlanTest, Qwen3_30B_A3B_OnOneH100) {
  auto plan = PlanMemory(Qwen3_30B_A3B_Shape(), Config(1, kH100Bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectConsistent(*plan);
  EXPECT_EQ(plan->expert_weight_bytes, 54 * kGiB);
  // Embeddings, LM head, attention and routers: ~1.54B parameters in bf16.
  EXPECT_NEAR(static_cast<double>(plan->other_weight_bytes) / kGiB, 2.87, 0.05);
  // Two staging buffers of 18 experts, carved out of the offloaded pages: none at start-up.
  EXPECT_EQ(plan->experts.num_staging_buffers, 2);
  EXPECT_TRUE(plan->experts.staging_carved);
  EXPECT_EQ(plan->experts.staging_buffer_bytes(), 18 * 9 * kMiB);
  EXPECT_EQ(plan->reserved_staging_bytes, 0u);
  EXPECT_EQ(plan->kv.block_bytes, 16 * 96 * 1024u);
  // Roughly 12 GiB of KV left: ~8k blocks.
  EXPECT_GT(plan->kv_baseline_blocks, 7000);
  EXPECT_LT(plan->kv_baseline_blocks, 9500);
  // 9 groups x 9 pages x 47 layers = 7.4 GiB leave the experts; the staging buffers take 2 x 9
  // pages of every group, the KV cache the rest.
  EXPECT_EQ(plan->experts.max_offload_pages(), 9 * 9 * 47);
  EXPECT_EQ(plan->experts.max_kv_offload_pages(), 9 * 9 * 45);

  const std::string summary = plan->Summary();
  EXPECT_THAT(summary, HasSubstr("Qwen3-30B-A3B, TP rank 0 of 1"));
  EXPECT_THAT(summary, HasSubstr("groups of 2 experts = 18.0 MiB"));
  EXPECT_THAT(summary, HasSubstr("KV cache: "));
  EXPECT_THAT(summary, HasSubstr(" tokens"));
  EXPECT_THAT(summary, HasSubstr("VAMP-r can add"));
}

TEST(MemoryPlanTest, Qwen3Next_80B_Tp2_OnH200) {
  MemoryPlanConfig c = Config(2, kH200Bytes);
  c.tp_rank = 1;
  auto plan = PlanMemory(Qwen3Next_80B_A3B_Shape(), c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectConsistent(*plan);
  EXPECT_EQ(plan->expert_weight_bytes, 72 * kGiB);
  EXPECT_EQ(plan->kv.block_bytes, 192 * 1024u);
  // VAMP-15 reclaims 5,358 pages (10.46 GiB); the two staging buffers take 2 x 114 of them, and
  // the other 5,130 add floor(5130 x 2 MiB / 192 KiB) blocks (+-1 for the baseline's partial
  // block).
  EXPECT_EQ(plan->experts.max_offload_pages(), 5358);
  EXPECT_EQ(plan->experts.max_kv_offload_pages(), 5358 - 2 * 114);
  EXPECT_NEAR(static_cast<double>(plan->vamp_extra_blocks()), 5130.0 * 2 * 1024 / 192, 1.0);
  EXPECT_THAT(plan->Summary(), HasSubstr("TP rank 1 of 2"));
}

// Qwen3-Next's 36 Gated DeltaNet layers keep, per sequence and layer, a conv state of 3 inputs of
// 8,192 channels and 32 delta-rule matrices of 128 x 128, float32: 2.09 MiB a layer, 75.4 MiB a
// sequence, half of it per rank under TP2. The plan reserves max_num_seqs of them before the KV
// pool, and a snapshot of one fills whole KV blocks.
TEST(MemoryPlanTest, Qwen3NextRecurrentStateIsPlannedBeforeTheKvPool) {
  const ModelShape shape = Qwen3Next_80B_A3B_Shape();
  constexpr int64_t kPerLayer = (3 * 8192 + 32 * 128 * 128) * 4;
  EXPECT_EQ(shape.RecurrentStateBytesPerSeqPerRank(1), 36 * kPerLayer);
  EXPECT_EQ(shape.RecurrentStateBytesPerSeqPerRank(2), 36 * kPerLayer / 2);
  EXPECT_EQ(Qwen3_30B_A3B_Shape().RecurrentStateBytesPerSeqPerRank(1), 0);

  MemoryPlanConfig c = Config(2, kH200Bytes);
  c.max_num_seqs = 64;
  auto few = PlanMemory(shape, c);
  c.max_num_seqs = 128;
  auto many = PlanMemory(shape, c);
  ASSERT_TRUE(few.ok() && many.ok()) << few.status() << many.status();
  ExpectConsistent(*few);
  ExpectConsistent(*many);
  EXPECT_EQ(few->recurrent_state_bytes_per_seq, uint64_t{36 * kPerLayer / 2});
  EXPECT_EQ(few->recurrent_state_bytes, 64 * few->recurrent_state_bytes_per_seq);
  // 64 more slots (and their activations) come out of the KV pool.
  const uint64_t more = 64 * few->recurrent_state_bytes_per_seq +
                        (many->activation_bytes - few->activation_bytes);
  EXPECT_NEAR(static_cast<double>(few->kv_baseline_pages - many->kv_baseline_pages),
              static_cast<double>(more) / (2 * kMiB), 1.0);
  // 37.7 MiB per rank in blocks of 192 KiB: 201 blocks.
  EXPECT_EQ(few->snapshot_blocks(), 201);
  EXPECT_THAT(few->Summary(),
              HasSubstr("recurrent state:  2.36 GiB = 64 sequences x 37.7 MiB (conv + delta-rule "
                        "state of the linear-attention layers); a prefix-cache snapshot of one "
                        "takes 201 KV blocks"));

  // An attention-only model plans none and says nothing about it.
  auto dense = PlanMemory(Qwen3_30B_A3B_Shape(), Config(1, kH100Bytes));
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->recurrent_state_bytes, 0u);
  EXPECT_EQ(dense->snapshot_blocks(), 0);
  EXPECT_THAT(dense->Summary(), Not(HasSubstr("recurrent state")));
}

// Too many sequences' state for the device is an error that names it.
TEST(MemoryPlanTest, RecurrentStateOverTheBudgetSaysSo) {
  MemoryPlanConfig c = Config(2, kH200Bytes);
  c.max_num_seqs = 2048;  // 75 GiB of state per rank
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Qwen3Next_80B_A3B_Shape(), c);
  ASSERT_TRUE(absl::IsResourceExhausted(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("recurrent state 75.38 GiB"));
  EXPECT_THAT(plan.status().message(), HasSubstr("max_num_seqs"));
}

TEST(MemoryPlanTest, WeightsOverTheBudgetSayWhatDoesNotFitAndByHowMuch) {
  // Qwen3-Next-80B in bf16 needs ~74 GiB per rank under TP2: more than 0.9 x 80 GB.
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Qwen3Next_80B_A3B_Shape(), Config(2, kH100Bytes));
  ASSERT_TRUE(absl::IsResourceExhausted(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("experts 72.00 GiB"));
  EXPECT_THAT(plan.status().message(), HasSubstr("do not fit in the budget of 71.68 GiB"));
  EXPECT_THAT(plan.status().message(), HasSubstr("short by"));
  // And on one GPU, far more.
  plan = PlanMemory(Qwen3Next_80B_A3B_Shape(), Config(1, kH200Bytes));
  EXPECT_TRUE(absl::IsResourceExhausted(plan.status()));
}

TEST(MemoryPlanTest, MaxModelLenThatTheBaselineCannotHoldIsAnError) {
  MemoryPlanConfig c = Config(1, kH100Bytes);
  c.max_model_len = 40 * 1000 * 1000;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  ASSERT_TRUE(absl::IsResourceExhausted(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("max_model_len 40,000,000"));
  EXPECT_THAT(plan.status().message(), HasSubstr("short by"));
  c.max_model_len = 32768;
  EXPECT_TRUE(PlanMemory(Qwen3_30B_A3B_Shape(), c).ok());
}

TEST(MemoryPlanTest, MeasuredActivationsReplaceTheEstimate) {
  MemoryPlanConfig c = Config(1, kH100Bytes);
  auto estimated = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  c.activation_bytes = 4 * kGiB;
  auto measured = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  ASSERT_TRUE(estimated.ok() && measured.ok());
  EXPECT_EQ(measured->activation_bytes, 4 * kGiB);
  EXPECT_LT(measured->kv_baseline_pages, estimated->kv_baseline_pages);
}

TEST(MemoryPlanTest, NoOffloadMeansNoStagingBuffers) {
  MemoryPlanConfig c = Config(1, kH100Bytes);
  c.offload.max_offload_ratio = 0;
  auto plan = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->experts.num_staging_buffers, 0);
  EXPECT_EQ(plan->reserved_staging_bytes, 0u);
  EXPECT_EQ(plan->vamp_extra_blocks(), 0);
  EXPECT_THAT(plan->Summary(), HasSubstr("VAMP-r can add 0 blocks"));
}

// Carved staging buffers cost nothing before the first offload: VAMP starts with the KV pool a
// static split has.
TEST(MemoryPlanTest, CarvedStagingGivesVampTheStaticSplitsKvPool) {
  MemoryPlanConfig c = Config(1, kH200Bytes);
  c.offload.max_offload_ratio = 0;
  auto static_plan = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  c.offload.max_offload_ratio = 0.25;
  auto vamp_plan = PlanMemory(Qwen3_30B_A3B_Shape(), c);
  ASSERT_TRUE(static_plan.ok() && vamp_plan.ok());
  EXPECT_EQ(vamp_plan->kv_baseline_pages, static_plan->kv_baseline_pages);
  EXPECT_EQ(vamp_plan->kv_baseline_blocks, static_plan->kv_baseline_blocks);
  EXPECT_GT(vamp_plan->vamp_extra_blocks(), 0);
  EXPECT_THAT(vamp_plan->Summary(), HasSubstr("carved out of the offloaded expert pages"));
}

// A model with no more eligible layers than staging buffers cannot carve them (a group step would
// free no more pages than the buffers take): they are reserved at start-up.
TEST(MemoryPlanTest, TooFewMoeLayersReserveTheStagingBuffers) {
  ModelShape shape = Qwen3_30B_A3B_Shape();
  shape.num_layers = 3;
  shape.moe_layers = {0, 1, 2};
  shape.attention_layers = {0, 1, 2};
  MemoryPlanConfig c = Config(1, kH200Bytes);
  c.offload.max_offload_ratio = 0.25;
  auto plan = PlanMemory(shape, c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectConsistent(*plan);
  EXPECT_FALSE(plan->experts.staging_carved);
  EXPECT_EQ(plan->reserved_staging_bytes, 2 * plan->experts.staging_buffer_bytes());
  EXPECT_EQ(plan->experts.max_kv_offload_pages(), plan->experts.max_offload_pages());
  EXPECT_THAT(plan->Summary(), HasSubstr("reserved at start-up"));
  c.offload.staging_buffers = 1;
  plan = PlanMemory(shape, c);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->experts.staging_carved);
  c.offload.staging_buffers = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMemory(shape, c).status()));
}

TEST(MemoryPlanTest, RejectsInvalidSettings) {
  MemoryPlanConfig c = Config(2, kH200Bytes);
  c.tp_rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMemory(Qwen3Next_80B_A3B_Shape(), c).status()));
  c = Config(1, kH200Bytes);
  c.gpu_memory_utilization = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMemory(Qwen3_30B_A3B_Shape(), c).status()));
  c.gpu_memory_utilization = 1.5;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMemory(Qwen3_30B_A3B_Shape(), c).status()));
  c = Config(1, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMemory(Qwen3_30B_A3B_Shape(), c).status()));
}

TEST(FormatBytesTest, PicksTheUnit) {
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatBytes(512 * 1024), "512 KiB");
  EXPECT_EQ(FormatBytes(6 * kMiB), "6.0 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
}

}  // namespace
}  // namespace vamp
