#include "agent/agent_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent_rank.h"
#include "agent/init_request.h"
#include "agent/rank_remapper.h"
#include "agent/step_executor.h"
#include "agent/step_staging.h"
#include "agent/tensor_parallel_group.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace vamp {

// Everything one successful Init built. Members are destroyed in reverse order: the remapper
// before the rank it remaps, the rank (runner, models, expert weights, memory, backend) before the
// tensor-parallel group whose communicator its runner or device model holds.
struct AgentEngine::Instance {
  vamp::v1::InitRequest request;
  DType dtype = DType::kFloat32;
  // Null when tp_size == 1.
  std::shared_ptr<TensorParallelGroup> group;
  std::unique_ptr<Rank> rank;
  std::unique_ptr<RankRemapper> remapper;
  StepExecutor steps;
  vamp::v1::InitResponse response;

  int tp_rank() const { return request.parallel().tp_rank(); }
  int tp_size() const { return std::max(1, request.parallel().tp_size()); }
};

namespace {

using Steady = std::chrono::steady_clock;

// Tokens the step's forward pass computes.
int64_t StepTokens(const vamp::v1::StepRequest& request) {
  int64_t tokens = 0;
  for (const auto& r : request.new_requests()) tokens += std::max(0, r.num_scheduled_tokens());
  for (const auto& r : request.cached_requests()) tokens += std::max(0, r.num_scheduled_tokens());
  return tokens;
}

}  // namespace

AgentEngine::AgentEngine(AgentEngineOptions options, AgentMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {}

AgentEngine::~AgentEngine() {
  Abort(absl::CancelledError("the agent is shutting down"));
  absl::MutexLock lock(&mu_);
  if (instance_ != nullptr) {
    // Device memory and streams are released on their device.
    if (absl::Status s = instance_->rank->device->Activate(/*synchronize=*/true); !s.ok()) {
      VAMP_LOG(ERROR) << "shutdown: " << s;
    }
  }
  instance_.reset();
}

void AgentEngine::Abort(absl::Status reason) {
  absl::MutexLock lock(&abort_mu_);
  if (connect_cancel_ != nullptr) connect_cancel_->store(true);
  if (live_group_ != nullptr) live_group_->Abort(reason);
}

absl::StatusOr<std::string> AgentEngine::CreateCollectiveId() {
  return vamp::CreateCollectiveId(options_.device);
}

bool AgentEngine::initialized() {
  absl::MutexLock lock(&mu_);
  return instance_ != nullptr;
}

int AgentEngine::rank() {
  absl::MutexLock lock(&mu_);
  return instance_ == nullptr ? -1 : instance_->tp_rank();
}

vamp::v1::RankMemory AgentEngine::Memory() {
  absl::MutexLock lock(&mu_);
  return MemoryLocked();
}

vamp::v1::RankMemory AgentEngine::MemoryLocked() {
  vamp::v1::RankMemory m;
  m.set_device(options_.device.ToString());
  const Instance* in = instance_.get();
  if (in == nullptr) {
    if (options_.device.kind == DeviceSpec::Kind::kCpu) {
      m.set_device_total_bytes(options_.host_memory_bytes);
      m.set_page_bytes(options_.host_page_bytes);
    }
    m.set_rank(-1);
    return m;
  }
  m.set_device_total_bytes(in->rank->backend->device_memory_bytes());
  m.set_page_bytes(in->rank->backend->page_bytes());
  m.set_rank(in->tp_rank());
  const uint64_t offloaded = in->rank->memory.experts->offloaded_bytes();
  m.set_resident_expert_bytes(in->rank->plan.expert_weight_bytes - offloaded);
  m.set_offloaded_expert_bytes(offloaded);
  m.set_other_weight_bytes(in->rank->other_weight_bytes);
  m.set_kv_pool_bytes(in->rank->memory.kv->mapped_bytes());
  m.set_staging_bytes(in->rank->memory.experts->staging_mapped_bytes());
  m.set_activation_bytes(in->rank->plan.activation_bytes);
  m.set_offloaded_groups(static_cast<int32_t>(in->rank->memory.page_remapper->offloaded_groups()));
  m.set_max_offload_groups(static_cast<int32_t>(in->rank->plan.experts.max_groups));
  m.set_kv_blocks(in->remapper->usable_blocks());
  return m;
}

absl::Status AgentEngine::ConnectGroup(Instance& in) {
  in.group.reset();
  if (in.tp_size() == 1) return absl::OkStatus();
  std::shared_ptr<std::atomic<bool>> cancel;
  {
    absl::MutexLock lock(&abort_mu_);
    if (connect_cancel_ != nullptr) connect_cancel_->store(true);
    connect_cancel_ = cancel = std::make_shared<std::atomic<bool>>(false);
  }
  VAMP_ASSIGN_OR_RETURN(in.group, JoinTensorParallelGroup(in.request, options_, *cancel));
  absl::MutexLock lock(&abort_mu_);
  live_group_ = in.group;
  return absl::OkStatus();
}

absl::Status AgentEngine::ResetRunner(Instance& in) {
  in.steps.Clear();
  return in.rank->ResetRunner(in.group != nullptr ? in.group->host_communicator() : nullptr,
                              in.remapper->usable_blocks());
}

absl::StatusOr<vamp::v1::InitResponse> AgentEngine::Init(const vamp::v1::InitRequest& request) {
  const auto start = Steady::now();
  // The memory the plan divides: the device's. Its backend is created first (cheap: it allocates
  // nothing) for the device's size and page granularity.
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateAgentDevice(options_));
  VAMP_RETURN_IF_ERROR(device->Activate(/*synchronize=*/false));
  absl::StatusOr<std::unique_ptr<MemoryBackend>> backend = device->CreateMemoryBackend();
  if (!backend.ok()) {
    return WithPrefix(backend.status(), absl::StrCat("device ", options_.device.ToString(), ": "));
  }
  // Everything that can be checked without touching the current model is checked first, so a
  // bad request leaves a working agent working.
  VAMP_ASSIGN_OR_RETURN(
      ResolvedInit resolved,
      ResolveInit(request, options_, (*backend)->device_memory_bytes(), (*backend)->page_bytes()));
  // A step blocked in a collective on a dead peer holds mu_: fail it instead of waiting.
  Abort(absl::AbortedError("the agent is being re-initialised"));
  absl::MutexLock lock(&mu_);

  // A CUDA group forms with a fresh NCCL unique id each time, and the device model holds the
  // communicator it was built with: such an Init always rebuilds.
  const bool nccl_group = device->is_cuda() && resolved.parallel.tp_size > 1;
  if (instance_ != nullptr && !nccl_group &&
      google::protobuf::util::MessageDifferencer::Equals(instance_->request, request)) {
    Instance& in = *instance_;
    VAMP_LOG(INFO) << "Init: same request as before; keeping the model and memory, forgetting "
                   << in.steps.size() << " request(s)";
    absl::Status s = ConnectGroup(in);
    if (s.ok()) s = ResetRunner(in);
    if (!s.ok()) {
      instance_.reset();
      if (metrics_ != nullptr) metrics_->SetInitialized(false);
      return s;
    }
    in.response.mutable_memory()->CopyFrom(MemoryLocked());
    return in.response;
  }

  if (instance_ != nullptr) {
    VAMP_LOG(INFO) << "Init: " << (nccl_group ? "a new NCCL group" : "a different request")
                   << "; releasing the current model and memory";
    instance_.reset();
    if (metrics_ != nullptr) metrics_->SetInitialized(false);
  }
  auto in = std::make_unique<Instance>();
  in->request = request;
  in->dtype = resolved.dtype;
  // Connect first: it fails fast on a mismatched group, and loading (the slow part) then runs on
  // every rank at once.
  VAMP_RETURN_IF_ERROR(ConnectGroup(*in));
  VAMP_ASSIGN_OR_RETURN(in->rank, BuildAgentRank(request, resolved, std::move(device),
                                                 *std::move(backend), in->group.get()));
  in->remapper =
      std::make_unique<RankRemapper>(in->rank.get(), options_.max_remap_history, metrics_);

  const ModelConfig& config = in->rank->config;
  const MemoryPlan& plan = in->rank->plan;
  vamp::v1::InitResponse& response = in->response;
  response.set_memory_plan_text(plan.Summary());
  response.set_num_layers(static_cast<int32_t>(config.num_hidden_layers));
  response.set_num_experts(static_cast<int32_t>(config.num_experts));
  response.set_experts_per_group(static_cast<int32_t>(plan.experts.group_experts));
  response.set_vocab_size(static_cast<int32_t>(config.vocab_size));
  response.set_max_position_embeddings(static_cast<int32_t>(config.max_position_embeddings));
  // A model with recurrent state serves prefix-cache hits from snapshots of it, which this
  // rank's runner keeps in KV blocks when the model can take them.
  response.set_recurrent_state_bytes(plan.recurrent_state_bytes_per_seq);
  response.set_prefix_caching_unsupported(plan.recurrent_state_bytes_per_seq > 0 &&
                                          in->rank->runner->snapshot_blocks() == 0);
  vamp::v1::OffloadGeometry& offload = *response.mutable_offload();
  offload.set_kv_block_bytes(plan.kv.block_bytes);
  offload.set_kv_pages_per_group(plan.experts.kv_pages_per_group());
  offload.set_staged_bytes_per_group(plan.experts.group_bytes *
                                     plan.experts.eligible_layers.size());
  // The runner's prompt log-probabilities are backend-independent (a step that computes them
  // brings its logits to the host and samples there; CudaModelRunnerTest holds the GPU path to
  // the CPU engine's), so every agent offers them.
  const bool prompt_logprobs = true;
  response.set_prompt_logprobs_supported(prompt_logprobs);
  in->steps.set_options({prompt_logprobs, /*return_prompt_logprobs=*/in->tp_rank() == 0});
  response.set_eos_token_id(
      config.eos_token_ids.empty() ? -1 : static_cast<int32_t>(config.eos_token_ids.front()));
  instance_ = std::move(in);
  response.mutable_memory()->CopyFrom(MemoryLocked());
  if (metrics_ != nullptr) {
    metrics_->SetInitialized(true);
    metrics_->SetMemory(response.memory());
  }
  VAMP_LOG(INFO) << "Init done in " << MicrosSince(start) / 1000
                 << " ms: " << config.architecture_name << " from " << request.model_path() << " ("
                 << (request.load_format().empty() ? "auto" : request.load_format()) << "), "
                 << DTypeName(instance_->dtype) << ", TP rank " << instance_->tp_rank() << " of "
                 << instance_->tp_size() << "\n"
                 << response.memory_plan_text();
  return response;
}

vamp::v1::GetStatsResponse AgentEngine::GetStats() {
  absl::MutexLock lock(&mu_);
  vamp::v1::GetStatsResponse response;
  *response.mutable_memory() = MemoryLocked();
  response.set_steps(steps_);
  *response.mutable_last_step() = last_step_;
  return response;
}

vamp::v1::StepResponse AgentEngine::Step(const vamp::v1::StepRequest& request) {
  const auto start = Steady::now();
  vamp::v1::StepResponse response;
  response.set_step_id(request.step_id());
  absl::MutexLock lock(&mu_);
  std::vector<std::string> errors;
  StagingStats staging_before, staging_after;
  if (instance_ == nullptr) {
    errors.push_back("agent is not initialised: call Init first");
  } else {
    Instance& in = *instance_;
    Device& device = *in.rank->device;
    if (absl::Status s = device.Activate(/*synchronize=*/false); !s.ok()) {
      errors.push_back(std::string(s.message()));
    }
    staging_before = in.rank->experts->stats();
    // A restore unmaps the KV tail, and requests the controller finished or preempted since its
    // last step may still hold blocks there on this rank: drop those first (the rest of the step
    // then runs without them).
    const vamp::v1::StepRequest* rest = &request;
    vamp::v1::StepRequest remainder;
    if (request.remaps_size() > 0 &&
        (request.finished_request_ids_size() > 0 || request.preempted_request_ids_size() > 0)) {
      vamp::v1::StepRequest releases;
      releases.set_step_id(request.step_id());
      *releases.mutable_finished_request_ids() = request.finished_request_ids();
      *releases.mutable_preempted_request_ids() = request.preempted_request_ids();
      vamp::v1::StepResponse ignored;
      if (absl::Status s = in.steps.Run(releases, in.remapper->usable_blocks(),
                                        in.rank->config.vocab_size, *in.rank->runner, &ignored);
          !s.ok()) {
        errors.push_back(std::string(s.message()));
      }
      remainder = request;
      remainder.clear_finished_request_ids();
      remainder.clear_preempted_request_ids();
      rest = &remainder;
    }
    const auto remap_start = Steady::now();
    const bool remapping = request.remaps_size() > 0 || request.rollback_remap_ids_size() > 0;
    std::vector<std::string> remap_errors;
    for (const std::string& id : request.rollback_remap_ids()) {
      if (absl::Status s = in.remapper->Rollback(id); !s.ok()) {
        remap_errors.push_back(std::string(s.message()));
      }
    }
    for (int i = 0; i < request.remaps_size(); ++i) {
      if (absl::Status s = in.remapper->Apply(i, request.remaps(i)); !s.ok()) {
        remap_errors.push_back(std::string(s.message()));
      }
    }
    bool run = true;
    if (remapping) {
      // Expert pages a restore wrote back must be on the device before this step's kernels.
      if (absl::Status s = device.Activate(/*synchronize=*/true); !s.ok()) {
        remap_errors.push_back(std::string(s.message()));
      }
      // Every rank runs the step, or none: the step's block ids may use what its remaps mapped,
      // and a rank that started the forward pass alone would wait in its first all-reduce.
      bool all_ok = remap_errors.empty();
      if (in.group != nullptr) {
        absl::StatusOr<bool> agreed = in.group->AllRanksOk(all_ok);
        if (!agreed.ok()) {
          remap_errors.push_back(
              absl::StrCat("parallel: agreeing on the step's remaps: ", agreed.status().message()));
          all_ok = false;
        } else {
          all_ok = *agreed;
        }
      }
      if (!all_ok) {
        run = false;
        response.set_refused(true);
        if (remap_errors.empty()) {
          remap_errors.push_back(
              "a rollback or remap of this step failed on another rank; the step was not run");
        }
      }
      errors.insert(errors.end(), remap_errors.begin(), remap_errors.end());
    }
    response.mutable_timings()->set_remap_us(static_cast<int64_t>(MicrosSince(remap_start)));
    if (metrics_ != nullptr && remapping) metrics_->SetMemory(MemoryLocked());
    if (run) {
      if (absl::Status s = in.steps.Run(*rest, in.remapper->usable_blocks(),
                                        in.rank->config.vocab_size, *in.rank->runner, &response);
          !s.ok()) {
        errors.push_back(std::string(s.message()));
      }
    }
    // A failed peer (or Abort) breaks the NCCL group; the step's results cannot be trusted then.
    if (in.group != nullptr) {
      if (absl::Status health = in.group->Check(); !health.ok()) {
        errors.push_back(absl::StrCat("parallel: the NCCL group (rank ", in.tp_rank(), " of ",
                                      in.tp_size(), ") is broken: ", health.message(),
                                      "; the controller must initialise the group again"));
      }
    }
    staging_after = in.rank->experts->stats();
  }
  response.set_rank(instance_ == nullptr ? -1 : instance_->tp_rank());
  vamp::v1::StepTimings& t = *response.mutable_timings();
  t.set_staging_stall_us(static_cast<int64_t>(staging_after.wait_us - staging_before.wait_us));
  t.set_staged_bytes(staging_after.bytes - staging_before.bytes);
  if (instance_ != nullptr) {
    const ModelConfig& model = instance_->rank->config;
    const StepStaging staging =
        DescribeStepStaging(staging_before, staging_after, StepTokens(request),
                            instance_->rank->experts->routed_staging_max_tokens(),
                            model.num_experts_per_tok, model.num_experts);
    t.set_routed_staging(staging.routed);
    t.set_staged_share(staging.share);
  }
  t.set_total_us(static_cast<int64_t>(MicrosSince(start)));
  *response.mutable_memory() = MemoryLocked();
  if (!errors.empty()) {
    response.set_error_message(absl::StrJoin(errors, "; "));
    VAMP_LOG(WARNING) << "step " << request.step_id() << ": " << response.error_message();
  }
  ++steps_;
  last_step_ = t;
  if (metrics_ != nullptr) {
    int64_t tokens = 0;
    for (const auto& s : response.sampled()) tokens += s.token_ids_size();
    metrics_->ObserveStep(static_cast<double>(t.total_us()) * 1e-6,
                          static_cast<double>(t.staging_stall_us()) * 1e-6, t.staged_bytes(),
                          tokens, !errors.empty());
  }
  return response;
}

}  // namespace vamp
