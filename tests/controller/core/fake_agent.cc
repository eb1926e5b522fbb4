#include "tests/controller/core/fake_agent.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vamp::testing {
namespace {

absl::Status Violation(int64_t step, RequestId id, absl::string_view what) {
  return absl::InternalError(absl::StrCat("step ", step, ", request ", id, ": ", what));
}

}  // namespace

absl::Status FakeAgent::Release(int64_t step, const std::vector<RequestId>& finished,
                                const std::vector<RequestId>& preempted) {
  for (RequestId id : finished) {
    if (requests_.erase(id) == 0) return Violation(step, id, "finished but unknown");
  }
  for (RequestId id : preempted) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return Violation(step, id, "preempted but unknown");
    if (it->second.preempted) return Violation(step, id, "preempted twice");
    it->second.preempted = true;
    it->second.table.clear();
    it->second.computed = 0;
  }
  return absl::OkStatus();
}

void FakeAgent::ForgetSnapshotsIn(const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) {
    auto it = snapshot_of_block_.find(b);
    if (it == snapshot_of_block_.end()) continue;
    const BlockId first = it->second;
    for (BlockId held : snapshots_[first].blocks) snapshot_of_block_.erase(held);
    snapshots_.erase(first);
  }
}

absl::Status FakeAgent::CheckRestore(int64_t step, RequestId id, const RequestState& s,
                                     const std::vector<BlockId>& blocks) {
  if (s.computed == 0 || !recurrent_) {
    if (!blocks.empty()) return Violation(step, id, "restores a snapshot without a hit");
    return absl::OkStatus();
  }
  auto it = blocks.empty() ? snapshots_.end() : snapshots_.find(blocks.front());
  if (it == snapshots_.end() || it->second.blocks != blocks ||
      it->second.tokens.size() != static_cast<size_t>(s.computed) ||
      !std::equal(it->second.tokens.begin(), it->second.tokens.end(), s.tokens.begin())) {
    return Violation(step, id,
                     absl::StrCat("a hit of ", s.computed, " tokens that no snapshot serves"));
  }
  ++num_restores_;
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> FakeAgent::Execute(const StepPlan& plan, int32_t block_size) {
  if (absl::Status s = Release(plan.step, plan.finished_ids, plan.preempted_ids); !s.ok()) {
    return s;
  }
  std::vector<BlockId> gone;
  for (const auto& [block, first] : snapshot_of_block_) {
    if (block >= plan.num_blocks) gone.push_back(block);
  }
  ForgetSnapshotsIn(gone);
  // What the agents keep must fit the plan's pool (a restore unmaps its old tail).
  for (const auto& [id, s] : requests_) {
    for (BlockId b : s.table) {
      if (b >= plan.num_blocks) {
        return Violation(plan.step, id,
                         absl::StrCat("holds block ", b, " past the pool of ", plan.num_blocks));
      }
    }
  }
  struct Work {
    RequestId id;
    int32_t scheduled;
    int32_t capture_tokens;
    std::vector<BlockId> capture_blocks;
  };
  std::vector<Work> work;
  std::vector<BlockId> handed_out;  // blocks tables took this step
  for (const NewRequestPlan& p : plan.new_requests) {
    if (requests_.count(p.request_id) != 0) return Violation(plan.step, p.request_id, "new twice");
    RequestState& s = requests_[p.request_id];
    s.tokens = p.prompt_token_ids;
    s.table = p.block_ids;
    s.computed = p.num_computed_tokens;
    if (p.num_computed_tokens % block_size != 0) {
      return Violation(plan.step, p.request_id, "prefix hit is not whole blocks");
    }
    if (absl::Status r = CheckRestore(plan.step, p.request_id, s, p.restore_state_blocks);
        !r.ok()) {
      return r;
    }
    handed_out.insert(handed_out.end(), p.block_ids.begin(), p.block_ids.end());
    work.push_back(
        {p.request_id, p.num_scheduled_tokens, p.capture_state_tokens, p.capture_state_blocks});
  }
  for (const CachedRequestPlan& p : plan.cached_requests) {
    auto it = requests_.find(p.request_id);
    if (it == requests_.end()) return Violation(plan.step, p.request_id, "cached but unknown");
    RequestState& s = it->second;
    if (p.resumed != s.preempted) {
      return Violation(plan.step, p.request_id,
                       p.resumed ? "resumed without preemption" : "scheduled while preempted");
    }
    if (p.resumed) {
      s.preempted = false;
      s.table = p.new_block_ids;
      s.computed = p.num_computed_tokens;
      if (absl::Status r = CheckRestore(plan.step, p.request_id, s, p.restore_state_blocks);
          !r.ok()) {
        return r;
      }
    } else {
      if (!p.restore_state_blocks.empty()) {
        return Violation(plan.step, p.request_id, "restores a snapshot while running");
      }
      if (p.num_computed_tokens != s.computed) {
        return Violation(
            plan.step, p.request_id,
            absl::StrCat("computed ", p.num_computed_tokens, ", agent has ", s.computed));
      }
      s.table.insert(s.table.end(), p.new_block_ids.begin(), p.new_block_ids.end());
    }
    handed_out.insert(handed_out.end(), p.new_block_ids.begin(), p.new_block_ids.end());
    work.push_back(
        {p.request_id, p.num_scheduled_tokens, p.capture_state_tokens, p.capture_state_blocks});
  }
  ForgetSnapshotsIn(handed_out);
  for (const Work& w : work) ForgetSnapshotsIn(w.capture_blocks);
  StepOutput out;
  out.step = plan.step;
  int64_t total = 0;
  for (const Work& w : work) {
    RequestState& s = requests_[w.id];
    if (w.scheduled <= 0) return Violation(plan.step, w.id, "scheduled no tokens");
    if (w.capture_tokens > 0) {
      if (w.capture_tokens <= s.computed || w.capture_tokens > s.computed + w.scheduled ||
          w.capture_blocks.empty()) {
        return Violation(plan.step, w.id, "captures outside its step");
      }
      for (BlockId b : w.capture_blocks) {
        for (const auto& [other, state] : requests_) {
          if (std::find(state.table.begin(), state.table.end(), b) != state.table.end()) {
            return Violation(plan.step, w.id,
                             absl::StrCat("captures into block ", b, " of request ", other));
          }
        }
        snapshot_of_block_[b] = w.capture_blocks.front();
      }
      snapshots_[w.capture_blocks.front()] = {
          std::vector<TokenId>(s.tokens.begin(), s.tokens.begin() + w.capture_tokens),
          w.capture_blocks};
    }
    s.computed += w.scheduled;
    total += w.scheduled;
    if (s.computed > static_cast<int32_t>(s.tokens.size())) {
      return Violation(plan.step, w.id, "computes tokens it does not have");
    }
    if (static_cast<int64_t>(s.table.size()) * block_size < s.computed) {
      return Violation(plan.step, w.id, "block table too short");
    }
    if (s.computed == static_cast<int32_t>(s.tokens.size())) {
      const TokenId t = sampler_(w.id, static_cast<int32_t>(s.tokens.size()));
      s.tokens.push_back(t);
      out.sampled.push_back({w.id, {t}});
    }
  }
  if (total != plan.total_num_scheduled_tokens) {
    return absl::InternalError(absl::StrCat("step ", plan.step, ": token total mismatch"));
  }
  return out;
}

}  // namespace vamp::testing
