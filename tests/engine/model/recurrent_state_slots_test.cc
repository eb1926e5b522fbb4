// RecurrentStateSlots: what each slot holds across steps, and the checks a step and a restore
// must pass before anything runs (the CPU and GPU Qwen3-Next models share them).
#include "engine/model/recurrent_state_slots.h"

#include <vector>

#include "gtest/gtest.h"

namespace vamp {
namespace {

// A step of sequences with `lens` new tokens each and `contexts` tokens before the step.
struct Step {
  std::vector<int32_t> qsl = {0};
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> slots;
  std::vector<StateCapture> captures;

  Step(std::vector<int32_t> lens, std::vector<int32_t> contexts, std::vector<int32_t> slot_ids)
      : slots(std::move(slot_ids)) {
    for (size_t i = 0; i < lens.size(); ++i) {
      qsl.push_back(qsl.back() + lens[i]);
      seq_lens.push_back(contexts[i] + lens[i]);
    }
    token_ids.assign(qsl.back(), 0);
  }
  ForwardBatch Batch() const {
    ForwardBatch b;
    b.token_ids = token_ids;
    b.query_start_loc = qsl;
    b.seq_lens = seq_lens;
    b.state_slots = slots;
    b.state_captures = captures;
    return b;
  }
};

StateSnapshotView View(std::vector<uint8_t>& memory, int64_t chunk_bytes) {
  StateSnapshotView v;
  v.chunk_bytes = chunk_bytes;
  for (size_t at = 0; at < memory.size(); at += chunk_bytes) v.chunks.push_back(&memory[at]);
  return v;
}

TEST(RecurrentStateSlotsTest, SlotsFollowTheirSequencesFromStepToStep) {
  RecurrentStateSlots slots;
  ASSERT_TRUE(slots.Reserve(3, 100).ok());
  EXPECT_EQ(slots.num_slots(), 3);
  EXPECT_EQ(slots.slot_bytes(), 100);
  RecurrentStepPlan plan;
  // Two prompts start (no initial state), then both decode from their slots.
  Step prefill({5, 3}, {0, 0}, {2, 0});
  ASSERT_TRUE(slots.PrepareStep(prefill.Batch(), plan).ok());
  EXPECT_EQ(plan.has_initial_state, (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(plan.capture_of_seq, (std::vector<int32_t>{-1, -1}));
  slots.FinishStep(prefill.Batch(), /*ok=*/true);
  Step decode({1, 1}, {5, 3}, {2, 0});
  ASSERT_TRUE(slots.PrepareStep(decode.Batch(), plan).ok());
  EXPECT_EQ(plan.has_initial_state, (std::vector<uint8_t>{1, 1}));
  // The slots swapped: each holds the other's context.
  Step swapped({1, 1}, {5, 3}, {0, 2});
  const absl::Status s = slots.PrepareStep(swapped.Batch(), plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("slot 0, which holds the state after 3 tokens"), std::string::npos)
      << s;
  // A failed step leaves its slots unusable until their sequences start over.
  slots.FinishStep(decode.Batch(), /*ok=*/false);
  const absl::Status lost = slots.PrepareStep(Step({1}, {6}, {2}).Batch(), plan);
  EXPECT_NE(lost.message().find("no usable state"), std::string::npos) << lost;
  EXPECT_TRUE(slots.PrepareStep(Step({4}, {0}, {2}).Batch(), plan).ok());
}

TEST(RecurrentStateSlotsTest, BadStepsAreRefused) {
  RecurrentStateSlots slots;
  ASSERT_TRUE(slots.Reserve(2, 64).ok());
  RecurrentStepPlan plan;
  Step wrong_count({2, 2}, {0, 0}, {0});
  EXPECT_EQ(slots.PrepareStep(wrong_count.Batch(), plan).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slots.PrepareStep(Step({2}, {0}, {2}).Batch(), plan).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slots.PrepareStep(Step({2}, {0}, {-1}).Batch(), plan).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slots.PrepareStep(Step({2, 2}, {0, 0}, {1, 1}).Batch(), plan).code(),
            absl::StatusCode::kFailedPrecondition);

  std::vector<uint8_t> memory(64);
  std::vector<uint8_t> small(32);
  Step step({4, 2}, {0, 0}, {0, 1});
  auto with = [&](int32_t seq, int32_t after, std::vector<uint8_t>& m) {
    Step s = step;
    s.captures = {{.seq = seq, .after_tokens = after, .to = View(m, 16)}};
    return slots.PrepareStep(s.Batch(), plan);
  };
  EXPECT_TRUE(with(0, 4, memory).ok());
  EXPECT_EQ(plan.capture_of_seq, (std::vector<int32_t>{0, -1}));
  EXPECT_EQ(with(2, 1, memory).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(1, 3, memory).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(1, 0, memory).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(0, 2, small).code(), absl::StatusCode::kInvalidArgument);
  Step twice = step;
  twice.captures = {{.seq = 1, .after_tokens = 1, .to = View(memory, 16)},
                    {.seq = 1, .after_tokens = 2, .to = View(memory, 16)}};
  EXPECT_EQ(slots.PrepareStep(twice.Batch(), plan).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RecurrentStateSlots().Reserve(-1, 8).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RecurrentStateSlotsTest, ARestoredSlotContinuesFromTheSnapshotsPoint) {
  RecurrentStateSlots slots;
  ASSERT_TRUE(slots.Reserve(2, 48).ok());
  std::vector<uint8_t> memory(64), small(32);
  EXPECT_EQ(slots.CheckRestore(2, View(memory, 16), 8).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slots.CheckRestore(0, View(memory, 16), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slots.CheckRestore(0, View(small, 16), 8).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(slots.CheckRestore(1, View(memory, 16), 32).ok());
  slots.MarkRestored(1, 32);
  RecurrentStepPlan plan;
  Step hit({6}, {32}, {1});
  ASSERT_TRUE(slots.PrepareStep(hit.Batch(), plan).ok());
  EXPECT_EQ(plan.has_initial_state, (std::vector<uint8_t>{1}));
}

}  // namespace
}  // namespace vamp
