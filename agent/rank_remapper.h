// Remaps with rollback: one rank's side of the controller's remap commands (shared/DESIGN.md,
// "Offload", "Restore"). Apply offloads or restores groups through the rank's PageRemapper and
// sets the KV blocks the runner may use; Rollback undoes a remap this rank applied (the last
// max_history are remembered). What a remap gives is not asked here: the controller computes it
// from the geometry the rank declared at Init (InitResponse.offload).
//
// The usable KV blocks (what the controller's pool uses on this rank, <= the region's blocks) are
// kept here. Not thread-safe: the agent engine serialises calls; remaps run between steps.
#ifndef VAMP_AGENT_RANK_REMAPPER_H_
#define VAMP_AGENT_RANK_REMAPPER_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"
#include "agent/agent_metrics.h"
#include "engine/rank/rank.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

class RankRemapper {
 public:
  // `rank` must outlive the remapper and have a runner; `metrics` may be null (else it must
  // outlive the remapper). Starts with every block of the KV region usable.
  RankRemapper(Rank* rank, int max_history, AgentMetrics* metrics);

  int64_t usable_blocks() const { return usable_blocks_; }
  // remaps[index]: offload / restore command.num_groups() groups; afterwards the runner uses
  // exactly expected_kv_blocks blocks (when > 0; never more than the rank has, never fewer than
  // its requests occupy). A failed offload is undone. Errors name "remaps[index]".
  absl::Status Apply(int index, const vamp::v1::RemapCommand& command);
  // Undoes the remap `remap_id` (OK and nothing to undo when this rank does not know it).
  absl::Status Rollback(const std::string& remap_id);

 private:
  struct RemapRecord {
    std::string remap_id;
    vamp::v1::RemapCommand::Action action = vamp::v1::RemapCommand::ACTION_UNSPECIFIED;
    int64_t groups = 0;
    int64_t blocks_before = 0;
  };

  Rank* const rank_;
  const int max_history_;
  AgentMetrics* const metrics_;
  int64_t usable_blocks_ = 0;
  std::deque<RemapRecord> remaps_;
};

}  // namespace vamp

#endif  // VAMP_AGENT_RANK_REMAPPER_H_
