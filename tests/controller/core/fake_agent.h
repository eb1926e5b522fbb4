// A CPU stand-in for the agents in scheduler tests: follows the StepPlan contract (step_plan.h),
// rebuilding each request's tokens and block table from the plans' diffs alone, checks every plan
// against its own view, and answers with deterministic "sampled" tokens. With recurrent state
// (set_recurrent) it also keeps the state snapshots the plans capture, as the agents' runner
// does (a snapshot is gone once one of its blocks is handed to a table, captured into again or
// leaves the pool), and refuses a prefix hit that no snapshot of exactly its tokens serves.
#ifndef VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_
#define VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/core/step_plan.h"

namespace vamp::testing {

class FakeAgent {
 public:
  // sampler(request id, number of tokens the request has) → the next token.
  using Sampler = std::function<TokenId(RequestId, int32_t)>;
  explicit FakeAgent(Sampler sampler) : sampler_(std::move(sampler)) {}

  struct RequestState {
    std::vector<TokenId> tokens;
    std::vector<BlockId> table;
    bool preempted = false;
    int32_t computed = 0;
  };

  // Applies the plan; returns the tokens sampled, or an error describing a contract violation,
  // among them a request that still holds a block past the plan's pool once the plan's finished
  // and preempted ids are applied (a restore shrank the pool under it).
  absl::StatusOr<StepOutput> Execute(const StepPlan& plan, int32_t block_size);

  // Ordered so that iteration is deterministic.
  const std::map<RequestId, RequestState>& requests() const { return requests_; }

  // The model keeps recurrent state: every prefix hit must restore a snapshot.
  void set_recurrent(bool recurrent) { recurrent_ = recurrent; }
  // Snapshots held now, and restores served so far.
  size_t num_snapshots() const { return snapshots_.size(); }
  int64_t num_restores() const { return num_restores_; }

 private:
  struct Snapshot {
    std::vector<TokenId> tokens;  // the state follows exactly these
    std::vector<BlockId> blocks;
  };
  // A request starting past token 0 restores `blocks`.
  absl::Status CheckRestore(int64_t step, RequestId id, const RequestState& s,
                            const std::vector<BlockId>& blocks);
  void ForgetSnapshotsIn(const std::vector<BlockId>& blocks);

  // A plan's finished and preempted ids.
  absl::Status Release(int64_t step, const std::vector<RequestId>& finished,
                       const std::vector<RequestId>& preempted);

  Sampler sampler_;
  std::map<RequestId, RequestState> requests_;
  bool recurrent_ = false;
  std::map<BlockId, Snapshot> snapshots_;  // by first block
  std::map<BlockId, BlockId> snapshot_of_block_;
  int64_t num_restores_ = 0;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_CONTROLLER_CORE_FAKE_AGENT_H_
