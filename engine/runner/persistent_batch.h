// The runner's state of every live request, kept across steps so that each step carries only
// deltas: token ids (prompt and sampled outputs), progress, sampling parameters (and, for requests
// with penalties, each token's output count), and the block
// table, a dense [max_num_seqs, max_blocks_per_seq] array of KV block ids indexed by slot (the
// layout a GPU kernel reads directly). Slots of finished requests are reused.
//
// Not thread-safe: owned by one ModelRunner.
#ifndef VAMP_ENGINE_RUNNER_PERSISTENT_BATCH_H_
#define VAMP_ENGINE_RUNNER_PERSISTENT_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runner/step_input.h"

namespace vamp {

class PersistentBatch {
 public:
  PersistentBatch(int64_t max_num_seqs, int64_t max_blocks_per_seq);

  int64_t max_num_seqs() const { return max_num_seqs_; }
  int64_t max_blocks_per_seq() const { return max_blocks_per_seq_; }
  int64_t num_requests() const { return static_cast<int64_t>(slot_of_.size()); }

  // The slot of `id`, or -1.
  int SlotOf(RunnerRequestId id) const;
  // Adds a request in a free slot. ResourceExhausted when every slot is taken; AlreadyExists for a
  // live id; OutOfRange for more blocks than a row holds. `seed` is its sampling seed.
  absl::StatusOr<int> Add(const NewRequestData& request, uint64_t seed);
  // Forgets `id`; false when it is not live.
  bool Remove(RunnerRequestId id);

  // Block table edits; OutOfRange (changing nothing) past max_blocks_per_seq.
  absl::Status AppendBlocks(int slot, absl::Span<const int32_t> blocks);
  absl::Status ReplaceBlocks(int slot, absl::Span<const int32_t> blocks);

  RunnerRequestId id(int slot) const { return slots_[slot].id; }
  const std::vector<int32_t>& tokens(int slot) const { return slots_[slot].tokens; }
  int32_t num_computed(int slot) const { return slots_[slot].num_computed; }
  void set_num_computed(int slot, int32_t n) { slots_[slot].num_computed = n; }
  // Appends a sampled token (an output: counted for the penalties and min_tokens).
  void AppendToken(int slot, int32_t token);
  // The request's prompt tokens (the first of tokens()).
  int32_t num_prompt_tokens(int slot) const { return slots_[slot].num_prompt_tokens; }
  // Outputs generated so far (tokens past the prompt).
  int32_t num_outputs(int slot) const {
    return static_cast<int32_t>(slots_[slot].tokens.size()) - slots_[slot].num_prompt_tokens;
  }
  // The request's ProcessLogits entries for its next token, appended to the arrays: every token
  // of its prompt or outputs when it has penalties (flags kLogitInPrompt, count = outputs), and
  // its min_tokens_banned_ids (kLogitBanned) while it has fewer than min_tokens outputs. Each
  // token once. Appends nothing for requests without processing.
  void AppendProcessingEntries(int slot, std::vector<int32_t>* tokens,
                               std::vector<int32_t>* counts, std::vector<uint8_t>* flags) const;
  const RunnerSamplingParams& sampling(int slot) const { return slots_[slot].sampling; }
  uint64_t seed(int slot) const { return slots_[slot].seed; }
  int32_t num_blocks(int slot) const { return slots_[slot].num_blocks; }
  const int32_t* block_row(int slot) const {
    return block_table_.data() + static_cast<int64_t>(slot) * max_blocks_per_seq_;
  }

 private:
  struct Slot {
    bool live = false;
    RunnerRequestId id = 0;
    std::vector<int32_t> tokens;
    int32_t num_computed = 0;
    int32_t num_blocks = 0;
    RunnerSamplingParams sampling;
    uint64_t seed = 0;
    int32_t num_prompt_tokens = 0;
    // With penalties: every prompt or output token, its output count and whether the prompt
    // has it (kernels::cpu::kLogitInPrompt).
    struct Seen {
      int32_t count = 0;
      uint8_t flags = 0;
    };
    absl::flat_hash_map<int32_t, Seen> seen;
  };

  const int64_t max_num_seqs_;
  const int64_t max_blocks_per_seq_;
  std::vector<Slot> slots_;
  std::vector<int32_t> block_table_;
  std::vector<int> free_slots_;  // taken from the back
  absl::flat_hash_map<RunnerRequestId, int> slot_of_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_PERSISTENT_BATCH_H_
