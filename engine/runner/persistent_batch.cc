#include "engine/runner/persistent_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/sampling.h"

namespace vamp {

PersistentBatch::PersistentBatch(int64_t max_num_seqs, int64_t max_blocks_per_seq)
    : max_num_seqs_(max_num_seqs),
      max_blocks_per_seq_(max_blocks_per_seq),
      slots_(max_num_seqs),
      block_table_(max_num_seqs * max_blocks_per_seq, -1) {
  for (int64_t s = max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(static_cast<int>(s));
}

int PersistentBatch::SlotOf(RunnerRequestId id) const {
  auto it = slot_of_.find(id);
  return it == slot_of_.end() ? -1 : it->second;
}

absl::StatusOr<int> PersistentBatch::Add(const NewRequestData& request, uint64_t seed) {
  if (slot_of_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already running"));
  }
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the batch holds at most ", max_num_seqs_, " requests"));
  }
  if (static_cast<int64_t>(request.block_ids.size()) > max_blocks_per_seq_) {
    return absl::OutOfRangeError(absl::StrCat("request ", request.id, " has ",
                                              request.block_ids.size(), " blocks; at most ",
                                              max_blocks_per_seq_, " fit"));
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  Slot& s = slots_[slot];
  s.live = true;
  s.id = request.id;
  s.tokens = request.prompt_token_ids;
  s.num_computed = request.num_computed_tokens;
  s.sampling = request.sampling;
  s.seed = seed;
  const int32_t known = static_cast<int32_t>(request.prompt_token_ids.size());
  s.num_prompt_tokens = request.num_prompt_tokens > 0 ? std::min(request.num_prompt_tokens, known)
                                                      : known;
  s.seen.clear();
  if (s.sampling.has_penalties()) {
    for (int32_t i = 0; i < known; ++i) {
      Slot::Seen& seen = s.seen[request.prompt_token_ids[i]];
      if (i < s.num_prompt_tokens) {
        seen.flags |= kernels::cpu::kLogitInPrompt;
      } else {
        ++seen.count;
      }
    }
  }
  slot_of_[request.id] = slot;
  std::copy(request.block_ids.begin(), request.block_ids.end(),
            block_table_.begin() + static_cast<int64_t>(slot) * max_blocks_per_seq_);
  s.num_blocks = static_cast<int32_t>(request.block_ids.size());
  return slot;
}

bool PersistentBatch::Remove(RunnerRequestId id) {
  auto it = slot_of_.find(id);
  if (it == slot_of_.end()) return false;
  Slot& s = slots_[it->second];
  s.live = false;
  s.tokens.clear();
  s.tokens.shrink_to_fit();
  s.seen = {};
  std::fill_n(block_table_.begin() + static_cast<int64_t>(it->second) * max_blocks_per_seq_,
              s.num_blocks, -1);
  s.num_blocks = 0;
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
  return true;
}

void PersistentBatch::AppendToken(int slot, int32_t token) {
  Slot& s = slots_[slot];
  s.tokens.push_back(token);
  if (s.sampling.has_penalties()) ++s.seen[token].count;
}

void PersistentBatch::AppendProcessingEntries(int slot, std::vector<int32_t>* tokens,
                                              std::vector<int32_t>* counts,
                                              std::vector<uint8_t>* flags) const {
  const Slot& s = slots_[slot];
  const std::vector<int32_t> none;
  const std::vector<int32_t>& banned =
      num_outputs(slot) < s.sampling.min_tokens ? s.sampling.min_tokens_banned_ids : none;
  auto is_banned = [&banned](int32_t token) {
    return std::find(banned.begin(), banned.end(), token) != banned.end();
  };
  for (const auto& [token, seen] : s.seen) {
    tokens->push_back(token);
    counts->push_back(seen.count);
    flags->push_back(seen.flags | (is_banned(token) ? kernels::cpu::kLogitBanned : 0));
  }
  for (int32_t token : banned) {
    if (s.seen.contains(token)) continue;  // flagged above
    tokens->push_back(token);
    counts->push_back(0);
    flags->push_back(kernels::cpu::kLogitBanned);
  }
}

absl::Status PersistentBatch::AppendBlocks(int slot, absl::Span<const int32_t> blocks) {
  Slot& s = slots_[slot];
  if (s.num_blocks + static_cast<int64_t>(blocks.size()) > max_blocks_per_seq_) {
    return absl::OutOfRangeError(absl::StrCat("request ", s.id, " would have ",
                                              s.num_blocks + blocks.size(), " blocks; at most ",
                                              max_blocks_per_seq_, " fit"));
  }
  std::copy(blocks.begin(), blocks.end(),
            block_table_.begin() + static_cast<int64_t>(slot) * max_blocks_per_seq_ + s.num_blocks);
  s.num_blocks += static_cast<int32_t>(blocks.size());
  return absl::OkStatus();
}

absl::Status PersistentBatch::ReplaceBlocks(int slot, absl::Span<const int32_t> blocks) {
  Slot& s = slots_[slot];
  if (static_cast<int64_t>(blocks.size()) > max_blocks_per_seq_) {
    return absl::OutOfRangeError(absl::StrCat("request ", s.id, " would have ", blocks.size(),
                                              " blocks; at most ", max_blocks_per_seq_, " fit"));
  }
  std::fill_n(block_table_.begin() + static_cast<int64_t>(slot) * max_blocks_per_seq_, s.num_blocks,
              -1);
  s.num_blocks = 0;
  return AppendBlocks(slot, blocks);
}

}  // namespace vamp
