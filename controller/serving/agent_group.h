// The controller's connection to its agents: one vamp-agent per tensor-parallel rank, driven in
// lockstep. Every step goes to all ranks and completes when all have answered; a rank that errs,
// disconnects or does not answer within the step timeout breaks the group (healthy() turns false)
// and the call fails with an error naming the rank. The caller fails the affected requests and
// re-initialises the group when its agents are back.
//
// Init of a group of several ranks also arranges where they meet for their all-reduces
// (ParallelSpec): it asks every rank for its device (GetStats), and
//   - CUDA agents (all of them): asks rank 0 for a fresh NCCL unique id (Agent.CreateCollectiveId;
//     rank 0 hosts NCCL's bootstrap root) and sends it to every rank in parallel.nccl_unique_id,
//     so every Init, re-initialisations included, forms the group with a new id;
//   - CPU agents (all of them): keeps the caller's parallel.host_transport_address;
//   - a mix: FailedPrecondition naming the devices (one group runs on one kind of device).
// The Inits go to all ranks concurrently: each blocks until every rank has joined the group.
#ifndef VAMP_CONTROLLER_SERVING_AGENT_GROUP_H_
#define VAMP_CONTROLLER_SERVING_AGENT_GROUP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {

struct AgentEndpoint {
  int rank = 0;
  std::string address;  // host:port of the agent's Agent service
};

// How the ranks of a group all-reduce.
enum class CollectiveTransport {
  kNone,  // one rank: nothing to reduce
  kHost,  // CPU agents: TCP, rank 0 listening at parallel.host_transport_address
  kNccl,  // CUDA agents: NCCL, from the unique id rank 0 creates (CreateCollectiveId)
};

absl::string_view CollectiveTransportName(CollectiveTransport t);

// The transport of a group whose ranks run on `devices` (RankMemory.device in rank order: "cpu",
// "cuda:N"). InvalidArgument for an empty list or an unknown device string; FailedPrecondition
// when CPU and CUDA agents are mixed (the message names a rank of each).
absl::StatusOr<CollectiveTransport> ChooseCollectiveTransport(
    const std::vector<std::string>& devices);

struct AgentGroupOptions {
  // A step (or remap) that takes longer on any rank than this fails the group (ms).
  int64_t step_timeout_ms = 30000;
  // Init loads the model; it may take long (ms).
  int64_t init_timeout_ms = 600000;
  // Stats queries (ms).
  int64_t rpc_timeout_ms = 5000;
  // Shared secret sent as "authorization: Bearer <token>" on every call; empty = none.
  std::string auth_token;
};

class AgentGroup {
 public:
  // Connects to every endpoint (ranks 0..n-1, each exactly once) and opens the step streams.
  static absl::StatusOr<std::unique_ptr<AgentGroup>> Connect(std::vector<AgentEndpoint> endpoints,
                                                             AgentGroupOptions options);
  ~AgentGroup();

  int world_size() const { return static_cast<int>(ranks_.size()); }
  bool healthy() const { return healthy_.load(); }
  // Whether a step ever went past the step timeout: some rank is alive enough to keep its
  // connection but does not compute (frozen, e.g. SIGSTOP, or hung), which no reconnect cures.
  bool missed_step_deadline() const { return missed_step_deadline_.load(); }

  // Initialises every rank with `request` (its parallel spec's tp_size/tp_rank set per rank, and
  // the rendezvous arranged as the header comment says), in parallel. Responses are in rank
  // order. For CPU groups of several ranks, `request` must carry parallel.host_transport_address.
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> Init(const vamp::v1::InitRequest& request);
  // The transport the last Init chose (kNone before).
  CollectiveTransport transport() const { return transport_.load(); }
  // Sends `request` to every rank and returns their answers in rank order. Any rank's
  // error_message fails the call (the group stays healthy: the agents are alive and in step);
  // Aborted when every rank refused the step (StepResponse.refused: a rollback or remap failed,
  // none of them ran it; the message joins the ranks' reasons), Internal and the group unhealthy
  // when only some did. A broken stream or a timeout fails the call and marks the group
  // unhealthy.
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> Step(const vamp::v1::StepRequest& request);
  absl::StatusOr<std::vector<vamp::v1::GetStatsResponse>> GetStats();

 private:
  struct Rank {
    AgentEndpoint endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<vamp::v1::Agent::Stub> stub;
    std::unique_ptr<grpc::ClientContext> stream_context;
    std::unique_ptr<grpc::ClientReaderWriter<vamp::v1::StepRequest, vamp::v1::StepResponse>> stream;
  };
  explicit AgentGroup(AgentGroupOptions options) : options_(std::move(options)) {}
  void PrepareContext(grpc::ClientContext* context, int64_t timeout_ms) const;
  absl::Status OpenStreams();
  // Sets request->parallel's rendezvous for this group's devices (see the header comment).
  absl::Status ArrangeRendezvous(vamp::v1::InitRequest* request);
  void Watchdog();

  const AgentGroupOptions options_;
  std::vector<Rank> ranks_;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> missed_step_deadline_{false};
  std::atomic<CollectiveTransport> transport_{CollectiveTransport::kNone};

  // The step watchdog: while a step is in flight, cancels every stream at its deadline.
  absl::Mutex mu_;
  int64_t step_deadline_micros_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = no step in flight
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_AGENT_GROUP_H_
