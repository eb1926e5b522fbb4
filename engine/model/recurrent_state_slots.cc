#include "engine/model/recurrent_state_slots.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace vamp {

absl::Status RecurrentStateSlots::Reserve(int64_t num_slots, int64_t slot_bytes) {
  if (num_slots < 0 || slot_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recurrent state: ", num_slots, " slots of ", slot_bytes, " bytes"));
  }
  slot_bytes_ = slot_bytes;
  slot_tokens_.assign(num_slots, -1);
  return absl::OkStatus();
}

absl::Status RecurrentStateSlots::PrepareStep(const ForwardBatch& batch,
                                              RecurrentStepPlan& plan) const {
  const int64_t num_seqs = batch.num_seqs();
  if (static_cast<int64_t>(batch.state_slots.size()) != num_seqs) {
    return absl::FailedPreconditionError(absl::StrCat("the step names ", batch.state_slots.size(),
                                                      " recurrent-state slots for ", num_seqs,
                                                      " sequences"));
  }
  plan.has_initial_state.assign(num_seqs, 0);
  std::vector<bool> used(slot_tokens_.size(), false);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t slot = batch.state_slots[i];
    if (slot < 0 || slot >= num_slots()) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", i, ": recurrent-state slot ",
                                                        slot, " is outside the ", num_slots(),
                                                        " reserved (ReserveRecurrentStates)"));
    }
    if (used[slot]) {
      return absl::FailedPreconditionError(
          absl::StrCat("recurrent-state slot ", slot, " is named by two sequences of the step"));
    }
    used[slot] = true;
    const int64_t context =
        batch.seq_lens[i] - (batch.query_start_loc[i + 1] - batch.query_start_loc[i]);
    if (context == 0) continue;
    if (slot_tokens_[slot] != context) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", i, " continues after ", context,
          " tokens of context from recurrent-state slot ", slot, ", which holds ",
          slot_tokens_[slot] < 0 ? std::string("no usable state")
                                 : absl::StrCat("the state after ", slot_tokens_[slot], " tokens"),
          " (a prefix-cache hit must first restore a snapshot taken there)"));
    }
    plan.has_initial_state[i] = 1;
  }
  plan.capture_of_seq.assign(num_seqs, -1);
  for (size_t c = 0; c < batch.state_captures.size(); ++c) {
    const StateCapture& capture = batch.state_captures[c];
    if (capture.seq < 0 || capture.seq >= num_seqs || plan.capture_of_seq[capture.seq] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("state capture ", c, " names sequence ",
                                                     capture.seq, ": out of range or taken twice"));
    }
    const int64_t len = batch.query_start_loc[capture.seq + 1] - batch.query_start_loc[capture.seq];
    if (capture.after_tokens < 1 || capture.after_tokens > len) {
      return absl::InvalidArgumentError(absl::StrCat("state capture ", c, " after ",
                                                     capture.after_tokens, " tokens of sequence ",
                                                     capture.seq, ", whose step has ", len));
    }
    if (capture.to.chunk_bytes < 1 || capture.to.capacity_bytes() < slot_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("state capture ", c, ": ",
                                                     capture.to.capacity_bytes(),
                                                     " bytes cannot hold a slot of ", slot_bytes_));
    }
    plan.capture_of_seq[capture.seq] = static_cast<int32_t>(c);
  }
  return absl::OkStatus();
}

absl::Status RecurrentStateSlots::CheckRestore(int32_t slot, const StateSnapshotView& from,
                                               int64_t num_tokens) const {
  if (slot < 0 || slot >= num_slots()) {
    return absl::FailedPreconditionError(absl::StrCat("recurrent-state slot ", slot,
                                                      " is outside the ", num_slots(),
                                                      " reserved (ReserveRecurrentStates)"));
  }
  if (num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("restoring recurrent state after ", num_tokens, " tokens: must be >= 1"));
  }
  if (from.chunk_bytes < 1 || from.capacity_bytes() < slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("a recurrent-state snapshot of ",
                                                   from.capacity_bytes(),
                                                   " bytes cannot hold a slot of ", slot_bytes_));
  }
  return absl::OkStatus();
}

void RecurrentStateSlots::FinishStep(const ForwardBatch& batch, bool ok) {
  for (int64_t i = 0; i < batch.num_seqs(); ++i) {
    slot_tokens_[batch.state_slots[i]] = ok ? batch.seq_lens[i] : -1;
  }
}

}  // namespace vamp
