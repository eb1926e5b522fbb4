// The bookkeeping of a model's per-sequence recurrent state (Qwen3-Next's linear attention),
// shared by the CPU model (engine/model/qwen3_next.h) and the GPU one (engine/runner/cuda/): how
// many tokens of context each slot's state has absorbed, and the checks a step's state_slots,
// state_captures and a restore must pass before anything runs. The states themselves are the
// model's (host or device memory); this class never touches them.
//
// Why a slot remembers its context length: the runner hands a sequence the same slot for its
// whole life, and a step that continues a sequence from a slot holding another context (a lost
// restore, a slot reused after a failure) would compute plausible but wrong logits. Refusing it
// turns that into an error naming the slot.
//
// Not thread-safe: one caller at a time (Forward is single-threaded by contract).
#ifndef VAMP_ENGINE_MODEL_RECURRENT_STATE_SLOTS_H_
#define VAMP_ENGINE_MODEL_RECURRENT_STATE_SLOTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/causal_lm.h"

namespace vamp {

// What a step does with each sequence's state, from RecurrentStateSlots::PrepareStep.
struct RecurrentStepPlan {
  // [num_seqs]: 1 when the sequence continues its slot's state (context before the step > 0),
  // 0 when it starts from the zero state.
  std::vector<uint8_t> has_initial_state;
  // [num_seqs]: the sequence's index in batch.state_captures, or -1.
  std::vector<int32_t> capture_of_seq;
};

class RecurrentStateSlots {
 public:
  // num_slots slots of `slot_bytes` bytes of state each (what a snapshot view must hold), none
  // holding a usable state. InvalidArgument when either is negative.
  absl::Status Reserve(int64_t num_slots, int64_t slot_bytes);
  int64_t num_slots() const { return static_cast<int64_t>(slot_tokens_.size()); }
  int64_t slot_bytes() const { return slot_bytes_; }

  // Checks the step (see Qwen3NextModel::Forward for the rules: FailedPrecondition for slots,
  // InvalidArgument for captures) and fills `plan`. Changes nothing.
  absl::Status PrepareStep(const ForwardBatch& batch, RecurrentStepPlan& plan) const;

  // Checks a restore of `from` into `slot` after `num_tokens` tokens: FailedPrecondition for a
  // slot outside those reserved, InvalidArgument for num_tokens < 1 or a view smaller than a
  // slot. On OK the caller copies the snapshot in, then calls MarkRestored.
  absl::Status CheckRestore(int32_t slot, const StateSnapshotView& from, int64_t num_tokens) const;
  void MarkRestored(int32_t slot, int64_t num_tokens) { slot_tokens_[slot] = num_tokens; }

  // After a step PrepareStep accepted: each of its slots holds the state after its sequence's
  // seq_lens tokens (`ok`), or no usable state (the step failed after the layers started).
  void FinishStep(const ForwardBatch& batch, bool ok);

 private:
  int64_t slot_bytes_ = 0;
  // Tokens of context each slot's state has absorbed; -1 = unusable until a sequence starts over.
  std::vector<int64_t> slot_tokens_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_RECURRENT_STATE_SLOTS_H_
