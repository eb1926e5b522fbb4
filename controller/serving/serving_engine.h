// ServingEngine: the controller's engine loop. One thread owns the Scheduler and drives the agent
// group step by step: it admits submitted requests, plans a step, sends it to every rank, applies
// the sampled tokens and hands each request's new tokens to its sink. Memory pressure reaches the
// arbiter inside Schedule(); an offload or restore it chooses (or an operator forces) is sized
// from the agents' declared geometry without asking them, and its remap rides on the next step's
// request (RemoteOffloader). When the agents refuse that step (a remap failed on some rank; none
// of them ran it), the engine rolls the remap back on every rank with the next step, gives the
// scheduler's pool back, and plans the same work again (Scheduler::RevertStep).
//
// Threads: Submit/Abort/ForceRemap/Drain/Snapshot are thread-safe and never block on a step; sinks
// run on the engine thread and must not block (they queue to their client).
//
// Faults: when the agent group breaks (a rank died or stopped answering), every live request ends
// with FinishReason kAbort and an error naming the rank, the engine reports unhealthy and refuses
// new submissions with UNAVAILABLE. The controller then replaces the group and the engine once the
// agents are back (their KV caches are gone, so nothing carries over).
#ifndef VAMP_CONTROLLER_SERVING_SERVING_ENGINE_H_
#define VAMP_CONTROLLER_SERVING_SERVING_ENGINE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/offload_cap.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/scheduler.h"
#include "controller/serving/agent_group.h"
#include "controller/serving/remote_offloader.h"
#include "controller/serving/serving_request.h"
#include "vamp/v1/admin.pb.h"

namespace vamp {

struct ServingSeries;  // serving_engine.cc: the engine's labelled Prometheus series

// What a request's sink receives: new tokens, and at the end the finish reason and usage.
struct EngineEvent {
  std::vector<int32_t> token_ids;
  // Per token of token_ids: its log-probability as the agents sampled it (SampledTokens.logprobs;
  // empty when the agents sent none).
  std::vector<float> logprobs;
  // With logprobs and SamplingParams::num_top_logprobs = k > 0: k alternatives per token of
  // token_ids (token-major), most likely first, their ids and log-probabilities (empty when the
  // agents sent none).
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
  // With ServingRequest::prompt_logprobs, on the request's first event with tokens: prompt tokens
  // 1..prompt_tokens-1 (token 0 has none), each one's log-probability and k alternatives each
  // (token-major), as the agents computed them; has_prompt_logprobs is false when some are
  // missing.
  std::vector<float> prompt_logprobs;
  std::vector<int32_t> prompt_top_token_ids;
  std::vector<float> prompt_top_logprobs;
  bool has_prompt_logprobs = false;  // the three above are set (a 1-token prompt has none)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set when the request failed (finish_reason kAbort)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // so far
  int32_t cached_prompt_tokens = 0;
  int64_t micros_since_arrival = 0;
};
using EngineSink = std::function<void(const EngineEvent&)>;

struct ServingEngineOptions {
  SchedulerConfig scheduler;  // num_blocks is taken from the agents
  std::string arbiter = "vamp";  // "static" | "vamp"
  std::optional<int32_t> eos_token_id;
  // The cost model's configuration (used when arbiter is "vamp", and by SetArbiter).
  VampArbiterConfig vamp;
  // VAMP-r the agents were initialised with (InitRequest.memory.max_offload_ratio).
  OffloadCap offload_cap;
  // The agents' Init answers in rank order, checked by CheckInitResponses: the pool, the offload
  // geometry and the expert geometry the cost model prices with.
  std::vector<vamp::v1::InitResponse> ranks;
  RemoteOffloader::Options offload;
  // Idle wait of the loop when nothing is runnable (µs).
  int64_t idle_wait_micros = 2000;
  // The served model's id: the model_name label of the serving metrics (tokens, latencies,
  // finished requests), as vLLM labels them.
  std::string model_name;

};

class ServingEngine {
 public:
  // `group` must be initialised (Init succeeded) and outlive the engine.
  static absl::StatusOr<std::unique_ptr<ServingEngine>> Start(AgentGroup* group,
                                                             ServingEngineOptions options);
  ~ServingEngine();

  // Queues a request; its events go to `sink`. UNAVAILABLE while unhealthy or draining.
  absl::StatusOr<RequestId> Submit(ServingRequest request, EngineSink sink);
  // Ends a request early and frees its KV blocks; its sink gets no further events. `reason` is
  // what vamp_requests_finished_total counts it as: kAbort (the client went away or timed out)
  // or kStop (the front end matched a stop string in its text).
  void Abort(RequestId id, FinishReason reason = FinishReason::kAbort);
  // Offloads (groups > 0) or restores (groups < 0) expert groups on every rank, between steps.
  // Blocks until the step that carries the remap was answered (a restore first waits until the KV
  // tail it takes back is free); the agents' refusal is the error.
  absl::Status ForceRemap(int32_t groups);
  // Switches the memory arbiter ("static" | "vamp") between steps; the vamp arbiter is built from
  // `vamp`. Also used to change the cost model's coefficients (same name, new config).
  absl::Status SetArbiter(const std::string& name, const VampArbiterConfig& vamp);
  // The arbiter in force and the cost-model configuration the engine holds.
  std::string arbiter_name() const;
  VampArbiterConfig vamp_config() const;
  // The offload cap in force (fixed for the engine's life: it sized the agents' memory).
  OffloadCap offload_cap() const { return options_.offload_cap; }
  // Stops admitting requests; running ones finish.
  void Drain();
  // Admits requests again after Drain.
  void Undrain();
  void Stop();

  bool healthy() const { return healthy_.load(); }
  bool draining() const { return draining_.load(); }
  // Fills the parts of an Admin status the engine knows (queue, KV pool, offload, policy).
  void Snapshot(vamp::v1::GetStatusResponse* status) const;
  std::vector<ArbiterRecord> RecentDecisions(int limit) const;

 private:
  struct Pending {
    RequestId id;
    ServingRequest request;
    EngineSink sink;
    int64_t arrival_micros;
    std::vector<BlockHash> prompt_block_hashes;  // hashed by Submit, on the caller's thread
  };
  // A request's prompt log-probabilities as the agents' steps report them, position by position.
  struct PromptLogprobsState {
    int32_t k = 0;  // alternatives per position
    // Positions [1, 1 + logprobs.size()) so far; complete at prompt_tokens - 1 entries.
    std::vector<float> logprobs;
    std::vector<int32_t> top_token_ids;
    std::vector<float> top_logprobs;
    bool broken = false;  // an agent reported positions out of order or of the wrong shape
  };
  struct Live {
    EngineSink sink;
    int64_t arrival_micros = 0;
    int32_t prompt_tokens = 0;
    // Set when the request asked for prompt log-probabilities.
    std::unique_ptr<PromptLogprobsState> prompt_logprobs;
    int32_t completion_tokens = 0;
    int64_t last_token_micros = 0;
    int32_t cached_prompt_tokens = 0;
    int64_t ttft_micros = -1;  // arrival to first token, for the request's completion log line
  };
  // Work for the engine thread between steps. `run` returns nullopt to be retried after the next
  // step (a restore waiting for its KV tail to drain), else its result.
  struct Command {
    std::function<std::optional<absl::Status>()> run;
    bool done = false;
    absl::Status result;
  };

  ServingEngine(AgentGroup* group, ServingEngineOptions options);
  void Loop();
  void AdmitPending();
  void RunCommands();
  // Queues `run` for the engine thread and waits for its result.
  absl::Status RunBetweenSteps(std::function<std::optional<absl::Status>()> run);
  // One step of a forced remap; `remap_id` is empty until its remap is queued.
  std::optional<absl::Status> Remap(int32_t groups, std::string* remap_id);
  void RunStep();
  void FailAll(const absl::Status& status);
  // A request's sampled log-probabilities in one step (rank 0's SampledTokens): one per token,
  // and k alternatives per token (token-major) when it asked for k.
  struct StepLogprobs {
    std::vector<float> logprobs;
    std::vector<int32_t> top_token_ids;
    std::vector<float> top_logprobs;
  };
  void Deliver(const std::vector<RequestOutput>& outputs,
               const absl::flat_hash_map<RequestId, StepLogprobs>& logprobs);
  // Adds rank 0's prompt log-probabilities of a step to their requests (positions already held,
  // recomputed after a preemption, are skipped).
  void CollectPromptLogprobs(const vamp::v1::StepResponse& response);
  void PublishSnapshot();
  int64_t NextStepId() { return next_step_id_++; }

  AgentGroup* group_;
  ServingEngineOptions options_;
  std::unique_ptr<ServingSeries> series_;
  std::unique_ptr<RemoteOffloader> offloader_;  // engine thread only
  std::unique_ptr<Scheduler> scheduler_;  // engine thread only
  VampArbiter* vamp_arbiter_ = nullptr;    // the scheduler's arbiter when it is the cost model
  absl::flat_hash_map<RequestId, Live> live_;  // engine thread only
  int64_t next_step_id_ = 1;                   // engine thread only

  std::atomic<bool> healthy_{true};
  std::atomic<bool> draining_{false};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RequestId next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<RequestId, FinishReason>> aborts_ ABSL_GUARDED_BY(mu_);
  std::deque<Command*> commands_ ABSL_GUARDED_BY(mu_);
  std::string arbiter_name_ ABSL_GUARDED_BY(mu_);
  VampArbiterConfig vamp_config_ ABSL_GUARDED_BY(mu_);
  bool work_ ABSL_GUARDED_BY(mu_) = false;
  // Published by the engine thread after every step, for Snapshot().
  vamp::v1::GetStatusResponse snapshot_ ABSL_GUARDED_BY(mu_);
  std::deque<ArbiterRecord> decisions_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_SERVING_ENGINE_H_
