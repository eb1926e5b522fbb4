// In-process stand-ins for vamp-agents, for unit tests of the controller's serving layer
// (ServingEngine, RemoteOffloader, and the frontends over them) without agent processes or a
// model. FakeAgentService speaks agent.proto's Agent service the way an agent does at the level
// the controller can observe: Init reports a memory plan and its offload geometry (one KV block
// per 4 KiB page, blocks_per_group pages per offloaded group), Step applies rollbacks and remaps
// (each rank exactly the controller's expected_kv_blocks, or it fails), then the ranks of a
// FakeAgentGroup agree as real agents do (FakeAgreement) and all refuse the step when any of them
// failed; otherwise it keeps each request's token count from the step's diffs and, on rank 0,
// "samples" one token for every request whose scheduled tokens reach its end, and reports prompt
// log-probabilities (FakePromptLogprob) for the prompt positions a step computes of requests that
// ask for them. Faults are scripted: a remap that fails on this rank, a rank that lies about its
// KV blocks, a step stream that breaks. Every RPC is counted, so tests can pin how many rounds an
// offload costs.
#ifndef VAMP_TESTS_CONTROLLER_SERVING_FAKE_AGENT_SERVICE_H_
#define VAMP_TESTS_CONTROLLER_SERVING_FAKE_AGENT_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "controller/serving/agent_group.h"
#include "controller/serving/agent_reports.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp::testing {

// What one fake rank has and reports.
struct FakeRankSpec {
  int64_t kv_blocks = 64;        // KV blocks before any offload
  int64_t blocks_per_group = 8;  // KV blocks one offloaded group adds on this rank
  int32_t max_offload_groups = 4;
  uint64_t device_total_bytes = uint64_t{1} << 30;
  uint64_t staged_bytes_per_group = uint64_t{1} << 20;
  // The model every rank reports (identical on all ranks, as agents loading one checkpoint do).
  int32_t num_layers = 2;
  int32_t num_experts = 8;
  int32_t experts_per_group = 1;
  int32_t vocab_size = 256;
  int32_t eos_token_id = -1;  // none: requests end by max_tokens
  int32_t max_position_embeddings = 4096;
};

// What the fake reports for prompt position `position` (>= 1): alternative j < k of it is token
// (position + j) % vocab with log-probability FakePromptLogprob(position, j + 1); the token itself
// has FakePromptLogprob(position, 0).
inline float FakePromptLogprob(int32_t position, int32_t j) {
  return -0.001f * static_cast<float>(position) - static_cast<float>(j);
}

// The ranks' agreement on a step with remaps (TensorParallelGroup::AllRanksOk of real agents):
// every rank posts whether its remaps succeeded and waits for the others.
class FakeAgreement {
 public:
  explicit FakeAgreement(int ranks) : ranks_(ranks) {}
  // Whether every rank posted `ok` for `step_id`; false also when the others do not post within
  // 10 s (a test that sends a step to some ranks only).
  bool AllRanksOk(int64_t step_id, bool ok);

 private:
  struct Round {
    int posted = 0;
    bool all_ok = true;
  };
  const int ranks_;
  absl::Mutex mu_;
  std::map<int64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
};

class FakeAgentService final : public vamp::v1::Agent::Service {
 public:
  // `agreement` (may be null: one rank alone) must outlive the service.
  FakeAgentService(int rank, FakeRankSpec spec, FakeAgreement* agreement = nullptr)
      : rank_(rank), spec_(spec), agreement_(agreement) {}

  grpc::Status Init(grpc::ServerContext*, const vamp::v1::InitRequest* request,
                    vamp::v1::InitResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext*, const vamp::v1::GetStatsRequest*,
                        vamp::v1::GetStatsResponse* response) override;
  grpc::Status Step(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<vamp::v1::StepResponse, vamp::v1::StepRequest>* stream) override;

  // The next remap this rank receives answers `error` in error_message and changes nothing.
  void FailNextRemap(std::string error);
  // Step answers claim memory.kv_blocks = `blocks` from now on (an agent that lies), or from the
  // next step with a remap on.
  void ReportKvBlocks(int64_t blocks, bool from_next_remap = false);
  // The next step ends this rank's step stream with an error (the agent died mid-run).
  void BreakStreamAtNextStep();
  // The token rank 0 "samples" for every request (default 7).
  void SetSampledToken(int32_t token);
  // Prompt log-probabilities start `positions` before the first position a step computes (as an
  // agent recomputing after a preemption repeats them); default 0.
  void SetPromptLogprobsOverlap(int32_t positions);

  int32_t offloaded_groups();
  // Every StepRequest received, in order.
  std::vector<vamp::v1::StepRequest> steps();
  // Unary calls received (Init, GetStats, CreateCollectiveId): every other RPC is a step.
  int64_t unary_calls();
  // Rollback ids received, in order.
  std::vector<std::string> rollbacks();
  // Ids seen in finished_request_ids.
  std::vector<uint64_t> finished_ids();
  // KV blocks this rank uses now: the controller's last expected_kv_blocks (what its pages hold
  // before any remap).
  int64_t kv_blocks();

 private:
  struct RequestState {
    int32_t tokens = 0;    // prompt plus sampled
    int32_t computed = 0;  // tokens in the KV cache
    int32_t prompt = 0;
    bool prompt_logprobs = false;
    int32_t num_top_logprobs = 0;
  };
  // One block per page: the KV region of `offloaded` groups holds this many blocks.
  int64_t OwnBlocksLocked(int32_t offloaded) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return spec_.kv_blocks + offloaded * spec_.blocks_per_group;
  }
  void FillMemoryLocked(vamp::v1::RankMemory* m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the step's rollbacks and remaps; the first remap error ("" when none).
  std::string RemapLocked(const vamp::v1::StepRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the step's request diffs and "samples"; the response.
  vamp::v1::StepResponse ApplyLocked(const vamp::v1::StepRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  const FakeRankSpec spec_;
  FakeAgreement* const agreement_;
  absl::Mutex mu_;
  int32_t offloaded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t used_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // 0 until Init
  struct Applied {
    int32_t delta;          // groups
    int64_t blocks_before;  // what a rollback goes back to
  };
  std::map<std::string, Applied> remap_history_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, RequestState> requests_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> fail_next_remap_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> lie_kv_blocks_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> lie_after_remap_ ABSL_GUARDED_BY(mu_);
  int64_t unary_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool break_stream_ ABSL_GUARDED_BY(mu_) = false;
  int32_t sampled_token_ ABSL_GUARDED_BY(mu_) = 7;
  int32_t prompt_logprobs_overlap_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<vamp::v1::StepRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> rollbacks_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

// One FakeAgentService per spec, each on its own loopback gRPC server, and an AgentGroup
// connected to them and initialised (its Init answers checked as the controller checks them).
class FakeAgentGroup {
 public:
  explicit FakeAgentGroup(std::vector<FakeRankSpec> ranks, AgentGroupOptions options = {});
  ~FakeAgentGroup();

  // Whether every rank started and Init succeeded (tests ASSERT on it first).
  const absl::Status& status() const { return status_; }
  AgentGroup* group() { return group_.get(); }
  FakeAgentService& agent(int rank) { return *agents_[rank]; }
  // The Init answers, which passed CheckInitResponses.
  const std::vector<vamp::v1::InitResponse>& init_responses() const { return responses_; }

 private:
  absl::Status status_;
  std::unique_ptr<FakeAgreement> agreement_;
  std::vector<std::unique_ptr<FakeAgentService>> agents_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::unique_ptr<AgentGroup> group_;
  std::vector<vamp::v1::InitResponse> responses_;
};

// The InitRequest the fakes are initialised with (block size 16, VAMP-r 0.5).
vamp::v1::InitRequest FakeInitRequest();

}  // namespace vamp::testing

#endif  // VAMP_TESTS_CONTROLLER_SERVING_FAKE_AGENT_SERVICE_H_
