#include "controller/serving/remote_offloader.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace vamp {
namespace {

constexpr size_t kOutcomesKept = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteOffloader>> RemoteOffloader::Create(
    const std::vector<vamp::v1::InitResponse>& ranks, Options options) {
  if (ranks.empty()) return absl::InvalidArgumentError("RemoteOffloader: no ranks");
  std::unique_ptr<RemoteOffloader> o(new RemoteOffloader(options));
  o->remap_id_prefix_ = absl::StrCat("remap-", absl::ToUnixMicros(absl::Now()), "-");
  o->max_groups_ = INT32_MAX;
  o->view_.kv_blocks = INT64_MAX;
  o->view_.offloaded_groups = ranks.front().memory().offloaded_groups();
  o->experts_per_group_ = std::max(1, ranks.front().experts_per_group());
  o->experts_per_layer_ = ranks.front().num_experts();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const vamp::v1::RankMemory& m = ranks[r].memory();
    const vamp::v1::OffloadGeometry& g = ranks[r].offload();
    if (m.offloaded_groups() != o->view_.offloaded_groups) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks disagree on offloaded groups: rank 0 has ", o->view_.offloaded_groups,
                       ", rank ", r, " has ", m.offloaded_groups()));
    }
    o->ranks_.push_back({m.page_bytes(), g.kv_block_bytes(), g.kv_pages_per_group()});
    o->view_.kv_mapped_bytes.push_back(m.kv_pool_bytes());
    o->view_.rank_kv_blocks.push_back(m.kv_blocks());
    o->view_.kv_blocks = std::min(o->view_.kv_blocks, m.kv_blocks());
    o->max_groups_ = std::min(o->max_groups_, m.max_offload_groups());
    o->staged_bytes_per_group_ =
        std::max(o->staged_bytes_per_group_, static_cast<int64_t>(g.staged_bytes_per_group()));
  }
  return o;
}

RemoteOffloader::View RemoteOffloader::After(const View& view, int32_t delta_groups) const {
  View after = view;
  after.offloaded_groups += delta_groups;
  int64_t blocks = INT64_MAX;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const uint64_t moved =
        static_cast<uint64_t>(std::abs(delta_groups)) * ranks_[r].KvBytesPerGroup();
    uint64_t& mapped = after.kv_mapped_bytes[r];
    mapped = delta_groups >= 0 ? mapped + moved : mapped - std::min(mapped, moved);
    const int64_t region = static_cast<int64_t>(mapped / ranks_[r].kv_block_bytes);
    // A restore never leaves a rank more blocks than it used: the pool only shrinks.
    blocks = std::min(blocks, delta_groups >= 0 ? region : std::min(region, view.kv_blocks));
  }
  after.kv_blocks = blocks;
  after.rank_kv_blocks.assign(ranks_.size(), blocks);
  return after;
}

int32_t RemoteOffloader::BlocksPerGroup() const {
  if (RemainingGroups() <= 0) return 0;
  return static_cast<int32_t>(After(view_, 1).kv_blocks - view_.kv_blocks);
}

int32_t RemoteOffloader::BlocksRemovedByRestore(int32_t groups) const {
  groups = std::clamp(groups, 0, view_.offloaded_groups);
  if (groups == 0) return 0;
  return static_cast<int32_t>(view_.kv_blocks - After(view_, -groups).kv_blocks);
}

bool RemoteOffloader::Ready() const {
  return rollbacks_.empty() && rollbacks_in_flight_.empty() &&
         options_.clock->NowMicros() >= retry_at_micros_;
}

void RemoteOffloader::Queue(vamp::v1::RemapCommand::Action action, int32_t groups,
                            const View& after) {
  if (!before_queued_.has_value()) before_queued_ = view_;
  vamp::v1::RemapCommand& command = queued_.emplace_back();
  command.set_action(action);
  command.set_num_groups(groups);
  command.set_expected_kv_blocks(after.kv_blocks);
  last_remap_id_ = absl::StrCat(remap_id_prefix_, ++next_remap_);
  command.set_remap_id(last_remap_id_);
  view_ = after;
}

absl::StatusOr<int32_t> RemoteOffloader::Offload(int32_t groups) {
  if (groups <= 0 || groups > RemainingGroups()) {
    return absl::InvalidArgumentError(absl::StrCat("offload: ", groups, " groups requested, ",
                                                   RemainingGroups(), " remain under the cap"));
  }
  if (!Ready()) {
    return absl::FailedPreconditionError("offload: a refused remap is being rolled back");
  }
  const View after = After(view_, groups);
  const int64_t added = after.kv_blocks - view_.kv_blocks;
  Queue(vamp::v1::RemapCommand::ACTION_OFFLOAD, groups, after);
  return static_cast<int32_t>(added);
}

absl::Status RemoteOffloader::Restore(int32_t groups) {
  if (groups <= 0 || groups > view_.offloaded_groups) {
    return absl::InvalidArgumentError(absl::StrCat("restore: ", groups, " groups requested, ",
                                                   view_.offloaded_groups, " are offloaded"));
  }
  if (!Ready()) {
    return absl::FailedPreconditionError("restore: a refused remap is being rolled back");
  }
  Queue(vamp::v1::RemapCommand::ACTION_RESTORE, groups, After(view_, -groups));
  return absl::OkStatus();
}

void RemoteOffloader::AttachTo(vamp::v1::StepRequest* request) {
  for (std::string& id : rollbacks_) request->add_rollback_remap_ids(id);
  rollbacks_in_flight_ = std::move(rollbacks_);
  rollbacks_.clear();
  for (const vamp::v1::RemapCommand& c : queued_) *request->add_remaps() = c;
  in_flight_ = std::move(queued_);
  queued_.clear();
  before_in_flight_ = before_queued_.value_or(view_);
  before_queued_.reset();
}

absl::Status RemoteOffloader::Confirm(const std::vector<vamp::v1::StepResponse>& responses) {
  if (responses.size() != ranks_.size()) {
    return absl::InternalError(
        absl::StrCat(responses.size(), " step answers for ", ranks_.size(), " ranks"));
  }
  for (size_t r = 0; r < responses.size(); ++r) {
    const vamp::v1::RankMemory& m = responses[r].memory();
    auto mismatch = [&](absl::string_view field, auto reported, auto expected) {
      return absl::InternalError(absl::StrCat(
          "agent rank ", r, " reported ", field, " = ", reported, " after step ",
          responses[r].step_id(), ", but the offload state every rank shares has ", expected, " (",
          view_.offloaded_groups, " groups offloaded, ", view_.kv_blocks,
          " KV blocks); the controller no longer trusts the group's memory"));
    };
    if (m.kv_blocks() != view_.rank_kv_blocks[r]) {
      return mismatch("memory.kv_blocks", m.kv_blocks(), view_.rank_kv_blocks[r]);
    }
    if (m.offloaded_groups() != view_.offloaded_groups) {
      return mismatch("memory.offloaded_groups", m.offloaded_groups(), view_.offloaded_groups);
    }
    if (m.kv_pool_bytes() != view_.kv_mapped_bytes[r]) {
      return mismatch("memory.kv_pool_bytes", m.kv_pool_bytes(), view_.kv_mapped_bytes[r]);
    }
  }
  for (const vamp::v1::RemapCommand& c : in_flight_) Remember(c.remap_id(), absl::OkStatus());
  if (!in_flight_.empty()) {
    VAMP_LOG(INFO) << in_flight_.size()
                   << " remap(s) done on every rank: " << view_.offloaded_groups
                   << " expert group(s) offloaded, KV pool " << before_in_flight_.kv_blocks
                   << " -> " << view_.kv_blocks << " blocks";
  }
  in_flight_.clear();
  rollbacks_in_flight_.clear();
  return absl::OkStatus();
}

absl::StatusOr<int32_t> RemoteOffloader::Refused(const absl::Status& reason) {
  if (!rollbacks_in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rolling back remap ", rollbacks_in_flight_.front(),
                     " was refused; the ranks' memory may differ now: ", reason.message()));
  }
  if (in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the agents refused a step without remaps: ", reason.message()));
  }
  const int64_t delta = view_.kv_blocks - before_in_flight_.kv_blocks;
  view_ = before_in_flight_;
  for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
    rollbacks_.push_back(it->remap_id());
    Remember(it->remap_id(), reason);
  }
  VAMP_LOG(WARNING) << in_flight_.size() << " remap(s) refused (" << reason.message()
                    << "); rolling back on every rank, KV pool back to " << view_.kv_blocks
                    << " blocks; remaps resume in " << options_.retry_after_micros / 1000
                    << " ms at the earliest";
  in_flight_.clear();
  retry_at_micros_ = options_.clock->NowMicros() + options_.retry_after_micros;
  return static_cast<int32_t>(delta);
}

void RemoteOffloader::Remember(const std::string& remap_id, absl::Status outcome) {
  outcomes_.emplace_back(remap_id, std::move(outcome));
  while (outcomes_.size() > kOutcomesKept) outcomes_.pop_front();
}

std::optional<absl::Status> RemoteOffloader::Outcome(const std::string& remap_id) const {
  for (auto it = outcomes_.rbegin(); it != outcomes_.rend(); ++it) {
    if (it->first == remap_id) return it->second;
  }
  return std::nullopt;
}

}  // namespace vamp
