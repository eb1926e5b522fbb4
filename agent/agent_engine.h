// AgentEngine: what one vamp-agent does with the controller's messages (proto/vamp/v1/agent.proto),
// independent of gRPC. It owns the rank's model shard, memory (expert regions, KV region, page
// pool), staging, runner and tensor-parallel communicator.
//
// Init: loads the model (config.json + safetensors, or dummy weights), plans memory from the
// budget (a fraction of --host_memory_bytes on CPU, of the device's memory on CUDA), creates the
// page pool, expert store and KV region, connects the tensor-parallel group and builds the
// ModelRunner.
//   - On the CPU: float32 throughout; tp_size > 1 all-reduces through TcpCommunicator over
//     parallel.host_transport_address.
//   - On a CUDA device (--device cuda:N, CUDA builds): the CUDA VMM memory backend on that device,
//     the model's non-expert weights copied to the device (CudaQwen3MoeModel), experts served and
//     staged by CudaExpertStoreWeights, the same ModelRunner. Weights, activations and KV are
//     bfloat16 (dtype ""/"auto"/"bfloat16") or float32 ("float32"); the memory plan, the expert
//     shards and the KV geometry use that element size. tp_size > 1 all-reduces on the device
//     through NCCL (NcclCommunicator) from parallel.nccl_unique_id, which rank 0 created in
//     CreateCollectiveId; every rank joins, then one all-reduce of a fingerprint of the request
//     checks that all ranks got the same InitRequest (and connects the peers) before loading.
//   - The same InitRequest again keeps weights, memory and the current offload state, rebuilds the
//     communicator (the peers are being re-initialised too) and forgets every request: a restarted
//     controller starts with an empty batch. A different InitRequest rebuilds everything, and so
//     does any Init of a CUDA group with tp_size > 1 (an NCCL unique id serves one group only).
//   - Bad requests fail before anything is torn down: InvalidArgument naming the field (model_path,
//     load_format, dtype, parallel.* — e.g. parallel.nccl_unique_id missing or not 128 bytes —,
//     memory.*); FailedPrecondition when the memory budget cannot hold the model (the message says
//     what does not fit and by how much), or when the ranks' requests differ; DeadlineExceeded when
//     the other ranks do not join within --tp_connect_timeout_ms.
//
// Step (one StepRequest, in order; controller/core/step_plan.h is the contract):
//   1. with remaps: the finished and preempted ids first (a restore unmaps the KV tail, where
//      requests the controller released since its last step may still hold blocks here);
//   2. rollback_remap_ids: undo remaps this rank applied (an id it does not know failed here, or
//      never arrived; nothing to undo);
//   3. remaps: offload / restore n groups through the PageRemapper; afterwards the rank uses
//      exactly expected_kv_blocks blocks (when > 0; never more than it has, never fewer than its
//      requests occupy) and the runner gets the new KV view (on CUDA, once the device has
//      finished the weight writes of a restore); a remap that fails is undone on this rank;
//   4. with rollbacks or remaps: the ranks agree (TensorParallelGroup::AllRanksOk, one all-reduce
//      of a flag). If 2 or 3 failed on any rank, every rank refuses the step
//      (StepResponse.refused): it runs none of 5-6, so no rank enters the forward pass's
//      collectives alone and the ranks keep identical request state. A rank whose remap
//      succeeded keeps it until the controller's rollback (on a later step);
//   5. finished ids (forgotten; unknown ids are ignored), preempted ids (block table and batch slot
//      dropped, tokens and sampling kept), new requests, cached requests (a resumed one comes back
//      with its whole new block table and recomputes from num_computed_tokens);
//   6. the forward pass and sampling when tokens are scheduled; block ids may use the blocks the
//      step's remaps mapped.
// Every failure becomes StepResponse.error_message naming the field (e.g.
// "cached_requests[0].request_id 7 is unknown"); nothing of a rejected step is applied, and the
// engine keeps serving. Sampled tokens are returned by every rank. A broken NCCL group (a peer
// failed, or Abort()) fails every later step with a message saying so, until the next Init.
//
// Init declares the rank's OffloadGeometry (InitResponse.offload): the controller computes every
// remap's block count from it and never asks.
//
// The jobs are in files of their own: Init validation (init_request.h), rank building
// (agent_rank.h over engine/rank/rank.h), the tensor-parallel group (tensor_parallel_group.h),
// remaps with rollback (rank_remapper.h) and step execution (step_executor.h); this engine
// orders them and holds what one Init built.
//
// Thread-safe: calls are serialised (a GetStats waits for a step in progress). Abort()
// and CreateCollectiveId() may be called from any thread at any time.
#ifndef VAMP_AGENT_AGENT_ENGINE_H_
#define VAMP_AGENT_AGENT_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_metrics.h"
#include "agent/agent_options.h"
#include "engine/model/dtype.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

class TensorParallelGroup;  // agent/tensor_parallel_group.h

// The element type an agent on `device` computes and stores in, from InitRequest.dtype: CUDA
// agents: "", "auto", "bfloat16" -> bfloat16, "float32" -> float32; CPU agents: float32 for "",
// "auto", "float32", "bfloat16" and "float16" (the CPU engine is float32 only). InvalidArgument
// naming dtype otherwise (float16 on CUDA agents: Qwen3 checkpoints are bfloat16 and float16
// overflows their activations).
absl::StatusOr<DType> ResolveAgentDType(absl::string_view requested, DeviceSpec::Kind device);

// Values used for MemorySpec fields the controller leaves at 0.
struct InitDefaults {
  double gpu_memory_utilization = 0.90;
  int32_t block_size = 16;
  int32_t max_num_batched_tokens = 8192;
  int32_t max_num_seqs = 256;
};

// The host memory backend, tensor-parallel timeouts and GPU forward pass come from EngineTuning
// (agent_options.h), as the flags set them.
struct AgentEngineOptions : EngineTuning {
  DeviceSpec device;
  // How often a CUDA agent polls NCCL's asynchronous errors (a failed peer aborts the group at
  // once instead of at the step timeout), ms.
  int64_t tp_watchdog_interval_ms = 100;
  // The secret presented to the other ranks (TCP handshake).
  std::string auth_token;
  InitDefaults defaults;
  // Base of the sampling seeds of requests without their own seed (identical on every rank).
  uint64_t sampling_seed = 0;
  // Successful remaps remembered for rollback (the controller rolls back the one it just sent).
  int max_remap_history = 64;
};

class AgentEngine {
 public:
  // `metrics` may be null; otherwise it must outlive the engine.
  AgentEngine(AgentEngineOptions options, AgentMetrics* metrics);
  ~AgentEngine();
  AgentEngine(const AgentEngine&) = delete;
  AgentEngine& operator=(const AgentEngine&) = delete;

  absl::StatusOr<vamp::v1::InitResponse> Init(const vamp::v1::InitRequest& request);
  // A fresh NCCL unique id (128 bytes) for the next Init of a CUDA group; this process hosts its
  // bootstrap root until the ranks have joined. FailedPrecondition on a CPU agent or in a build
  // without the CUDA engine.
  absl::StatusOr<std::string> CreateCollectiveId();
  // Never fails as a call: errors are in the response's error_message.
  vamp::v1::StepResponse Step(const vamp::v1::StepRequest& request);
  vamp::v1::GetStatsResponse GetStats();

  bool initialized();
  // The rank given by the last successful Init, or -1.
  int rank();
  // This rank's memory split (rank and device only before Init).
  vamp::v1::RankMemory Memory();
  // Fails a tensor-parallel collective or connection in progress (shutdown, or a new Init that
  // must not wait for a step stuck on a dead peer).
  void Abort(absl::Status reason);

 private:
  struct Instance;

  // Joins in.request's tensor-parallel group (none for tp_size 1), replacing in.group.
  absl::Status ConnectGroup(Instance& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh runner over the usable KV blocks; every request is forgotten.
  absl::Status ResetRunner(Instance& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  vamp::v1::RankMemory MemoryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentEngineOptions options_;
  AgentMetrics* const metrics_;

  absl::Mutex mu_;
  std::unique_ptr<Instance> instance_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  vamp::v1::StepTimings last_step_ ABSL_GUARDED_BY(mu_);

  // What Abort() reaches without waiting for mu_ (held by a step stuck in a collective).
  absl::Mutex abort_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::shared_ptr<TensorParallelGroup> live_group_ ABSL_GUARDED_BY(abort_mu_);
  std::shared_ptr<std::atomic<bool>> connect_cancel_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace vamp

#endif  // VAMP_AGENT_AGENT_ENGINE_H_
