#include "agent/rank_remapper.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace vamp {
namespace {

using Steady = std::chrono::steady_clock;

// The highest KV block any request in the runner's batch holds, or -1.
int64_t HighestUsedBlock(const ModelRunner& runner) {
  const PersistentBatch& batch = runner.batch();
  int64_t highest = -1;
  for (int slot = 0; slot < batch.max_num_seqs(); ++slot) {
    if (batch.SlotOf(batch.id(slot)) != slot) continue;  // a free slot
    const int32_t* row = batch.block_row(slot);
    for (int32_t i = 0; i < batch.num_blocks(slot); ++i)
      highest = std::max<int64_t>(highest, row[i]);
  }
  return highest;
}

// Checks that the runner may use `target` blocks: at most `available`, and covering every block a
// request in the batch holds.
absl::Status CheckUsable(const ModelRunner& runner, int64_t target, int64_t available,
                         absl::string_view what) {
  if (target > available) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": expected_kv_blocks ", target,
                                                      " exceeds the ", available,
                                                      " KV blocks this rank has"));
  }
  const int64_t highest = HighestUsedBlock(runner);
  if (highest >= target) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": block ", highest,
                     " is still held by a request but the pool would end at ", target, " blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

RankRemapper::RankRemapper(Rank* rank, int max_history, AgentMetrics* metrics)
    : rank_(rank),
      max_history_(max_history),
      metrics_(metrics),
      usable_blocks_(rank->memory.kv->num_blocks()) {}

absl::Status RankRemapper::Apply(int index, const vamp::v1::RemapCommand& command) {
  const std::string what =
      absl::StrCat("remaps[", index, "] (remap_id '", command.remap_id(), "')");
  const auto start = Steady::now();
  PageRemapper& rep = *rank_->memory.page_remapper;
  const bool offload = command.action() == vamp::v1::RemapCommand::ACTION_OFFLOAD;
  if (!offload && command.action() != vamp::v1::RemapCommand::ACTION_RESTORE) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": action must be OFFLOAD or RESTORE"));
  }
  const std::string action = offload ? "offload" : "restore";
  if (command.num_groups() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": num_groups must be >= 1, got ", command.num_groups()));
  }
  if (command.expected_kv_blocks() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected_kv_blocks must be >= 0, got ",
                                                   command.expected_kv_blocks()));
  }
  const int64_t n = command.num_groups();
  const int64_t before = usable_blocks_;
  auto failed = [&](const absl::Status& s) {
    if (metrics_ != nullptr) metrics_->ObserveRemap(action, "error", 0);
    return WithPrefix(s, absl::StrCat(what, ": ", action, " of ", n, " group(s): "));
  };
  int64_t target = 0;
  if (offload) {
    absl::StatusOr<RemapResult> r = rep.Offload(n);
    if (!r.ok()) return failed(r.status());
    const int64_t region = rank_->memory.kv->num_blocks();
    target = command.expected_kv_blocks() > 0 ? command.expected_kv_blocks() : region;
    absl::Status usable = CheckUsable(*rank_->runner, target, region, "after the offload");
    if (!usable.ok()) {
      // Undo so this rank is as before: the added tail blocks were never handed out.
      absl::StatusOr<RemapResult> undo = rep.Restore(n, region - before);
      if (!undo.ok()) {
        VAMP_LOG(ERROR) << what << ": undoing the offload failed: " << undo.status();
      }
      return failed(usable);
    }
  } else {
    absl::StatusOr<int64_t> removed = rep.BlocksRemovedByRestore(n);
    if (!removed.ok()) return failed(removed.status());
    const int64_t region = rank_->memory.kv->num_blocks();
    const int64_t region_after = region - *removed;
    target = command.expected_kv_blocks() > 0 ? command.expected_kv_blocks()
                                              : std::min(before, region_after);
    absl::Status usable = CheckUsable(*rank_->runner, target, region_after, "after the restore");
    if (!usable.ok()) return failed(usable);
    const int64_t free_tail = region - (HighestUsedBlock(*rank_->runner) + 1);
    absl::StatusOr<RemapResult> r = rep.Restore(n, free_tail);
    if (!r.ok()) return failed(r.status());
  }
  usable_blocks_ = target;
  VAMP_RETURN_IF_ERROR(rank_->RefreshKv(target));
  if (!command.remap_id().empty()) {
    remaps_.push_back({command.remap_id(), command.action(), n, before});
    while (static_cast<int>(remaps_.size()) > max_history_) remaps_.pop_front();
  }
  const double seconds = static_cast<double>(MicrosSince(start)) * 1e-6;
  if (metrics_ != nullptr) metrics_->ObserveRemap(action, "ok", seconds);
  VAMP_LOG(INFO) << what << ": " << action << " of " << n << " group(s): KV pool " << before
                 << " -> " << target << " blocks, " << rep.offloaded_groups()
                 << " group(s) offloaded, " << seconds * 1e3 << " ms";
  return absl::OkStatus();
}

absl::Status RankRemapper::Rollback(const std::string& remap_id) {
  // The newest with that id: ids are unique per controller, but agents outlive controllers.
  auto it = std::find_if(remaps_.rbegin(), remaps_.rend(),
                         [&](const RemapRecord& r) { return r.remap_id == remap_id; });
  if (it == remaps_.rend()) {
    // It failed on this rank (and changed nothing) or never arrived: nothing to undo.
    VAMP_LOG(WARNING) << "rollback of remap '" << remap_id
                      << "': not applied on this rank, nothing to undo";
    return absl::OkStatus();
  }
  const RemapRecord record = *it;
  const std::string what = absl::StrCat("rollback_remap_ids '", remap_id, "'");
  PageRemapper& rep = *rank_->memory.page_remapper;
  const bool undo_offload = record.action == vamp::v1::RemapCommand::ACTION_OFFLOAD;
  int64_t target = 0;
  if (undo_offload) {
    absl::StatusOr<int64_t> removed = rep.BlocksRemovedByRestore(record.groups);
    if (!removed.ok()) return WithPrefix(removed.status(), absl::StrCat(what, ": "));
    const int64_t region = rank_->memory.kv->num_blocks();
    target = std::min(record.blocks_before, region - *removed);
    VAMP_RETURN_IF_ERROR(CheckUsable(*rank_->runner, target, region - *removed, what));
    const int64_t free_tail = region - (HighestUsedBlock(*rank_->runner) + 1);
    VAMP_RETURN_IF_ERROR(
        WithPrefix(rep.Restore(record.groups, free_tail).status(), absl::StrCat(what, ": ")));
  } else {
    VAMP_RETURN_IF_ERROR(WithPrefix(rep.Offload(record.groups).status(), absl::StrCat(what, ": ")));
    target = std::min(record.blocks_before, rank_->memory.kv->num_blocks());
  }
  remaps_.erase(std::next(it).base());
  usable_blocks_ = target;
  VAMP_RETURN_IF_ERROR(rank_->RefreshKv(target));
  if (metrics_ != nullptr) {
    metrics_->ObserveRemap(undo_offload ? "offload" : "restore", "rollback", 0);
  }
  VAMP_LOG(INFO) << "rolled back remap '" << remap_id << "': KV pool now " << target << " blocks";
  return absl::OkStatus();
}

}  // namespace vamp
