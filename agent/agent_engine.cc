#include "agent/agent_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/kv/memory_repartitioner.h"
#include "engine/memory/fence.h"
#include "engine/memory/host_backend.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/model_loader.h"
#include "engine/runner/model_runner.h"
#include "engine/staging/expert_store_weights.h"
#if VAMP_AGENT_CUDA
#include <cuda_runtime_api.h>

#include "engine/memory/cuda_backend.h"
#include "engine/memory/cuda_status.h"
#include "engine/runner/cuda/cuda_expert_weights.h"
#include "engine/runner/cuda/cuda_qwen3_moe.h"
#include "engine/runner/cuda/cuda_runner_support.h"
#include "engine/runner/cuda/nccl_communicator.h"
#endif
#include "common/clock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"

namespace vamp {

// One request the agent holds between steps. The runner has the live copy of its state; this is
// what survives a preemption (which removes it from the runner).
struct AgentEngine::RequestState {
  // Prompt plus every token sampled so far; the first num_prompt_tokens are the prompt.
  std::vector<int32_t> tokens;
  int32_t num_prompt_tokens = 0;
  RunnerSamplingParams sampling;
  // In the runner's batch (false while preempted).
  bool in_runner = false;
};

struct RemapRecord {
  std::string remap_id;
  vamp::v1::RemapCommand::Action action = vamp::v1::RemapCommand::ACTION_UNSPECIFIED;
  int64_t groups = 0;
  int64_t blocks_before = 0;
};

// Everything one successful Init built. Members are destroyed in reverse order: the runner and
// models before the expert weights and KV region they read, the expert weights before the stream
// they order their copies on, those before the pool and backend.
struct AgentEngine::Instance {
  vamp::v1::InitRequest request;
  ModelConfig config;
  MemoryPlan plan;
  RunnerConfig runner_config;
  // The device this instance runs on: CUDA (device ordinal) or the host.
  bool cuda = false;
  int cuda_device = 0;
  DType dtype = DType::kFloat32;
#if VAMP_AGENT_CUDA
  // The tensor-parallel all-reduce of a CUDA group (null when tp_size == 1): declared before
  // everything that holds it (the device model), so it is destroyed after them.
  std::shared_ptr<NcclCommunicator> nccl;
#endif
  std::unique_ptr<MemoryBackend> backend;
  std::unique_ptr<InFlightFence> fence;
  AgentMemory memory;
#if VAMP_AGENT_CUDA
  CudaStream stream;  // the forward pass's stream (CUDA only)
  std::unique_ptr<CudaExpertStoreWeights> cuda_experts;
#endif
  std::unique_ptr<ExpertStoreWeights> experts;  // CPU only
  // The loaded model: what the CPU runner runs; on CUDA, the host copy the device model wraps.
  std::unique_ptr<CausalLm> model;
  std::unique_ptr<CausalLm> device_model;  // CUDA only: CudaQwen3MoeModel over `model`
  std::shared_ptr<TcpCommunicator> comm;   // CPU groups only; null when tp_size == 1
  std::unique_ptr<ModelRunner> runner;
  uint64_t other_weight_bytes = 0;
  // KV blocks the controller's pool uses on this rank (<= the region's blocks).
  int64_t usable_blocks = 0;
  absl::flat_hash_map<uint64_t, RequestState> requests;
  std::deque<RemapRecord> remaps;
  vamp::v1::InitResponse response;

  int rank() const { return request.parallel().tp_rank(); }
  int tp_size() const { return std::max(1, request.parallel().tp_size()); }
  // What the runner runs and reads experts through.
  CausalLm* runner_model() const {
    return device_model != nullptr ? device_model.get() : model.get();
  }
  ExpertWeights* expert_weights() const {
#if VAMP_AGENT_CUDA
    if (cuda_experts != nullptr) return cuda_experts.get();
#endif
    return experts.get();
  }
  // Staging counters so far (the GPU path never waits on the host: wait_us stays 0 there).
  StagingStats staging() const {
#if VAMP_AGENT_CUDA
    if (cuda_experts != nullptr) {
      StagingStats s;
      s.bytes = cuda_experts->stats().bytes;
      return s;
    }
#endif
    return experts->engine().stats();
  }
};

namespace {

using Steady = std::chrono::steady_clock;

// ParallelSpec.nccl_unique_id's size (NCCL_UNIQUE_ID_BYTES); known without NCCL so that requests
// are checked the same way in every build.
constexpr int kNcclUniqueIdBytes = 128;
#if VAMP_AGENT_CUDA
static_assert(kNcclUniqueIdBytes == NcclCommunicator::kUniqueIdBytes);
#endif

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::Status WithCode(const absl::Status& s, absl::StatusCode code, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(code, absl::StrCat(prefix, s.message()));
}

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Identifies what every rank of a group must agree on: the InitRequest without the rank.
uint64_t GroupFingerprint(const vamp::v1::InitRequest& request) {
  vamp::v1::InitRequest copy = request;
  copy.mutable_parallel()->set_tp_rank(0);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  return Fnv1a(bytes);
}

// An InitRequest checked and completed with defaults.
struct ResolvedInit {
  DType dtype = DType::kFloat32;
  ModelConfig config;
  LoadOptions load;
  MemoryPlanConfig plan_config;
  MemoryPlan plan;
  RunnerConfig runner;
  ParallelConfig parallel;
};

absl::StatusOr<RunnerSamplingParams> ToRunnerSampling(const vamp::v1::SamplingParams& s,
                                                      const std::string& field) {
  RunnerSamplingParams p;
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".temperature must be >= 0, got ", s.temperature()));
  }
  p.temperature = s.temperature();  // 0: greedy
  if (s.top_k() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_k must be >= 0 (0 = disabled), got ", s.top_k()));
  }
  p.top_k = s.top_k();
  if (s.top_p() == 0.0f) {
    p.top_p = 1.0f;
  } else if (!(s.top_p() > 0.0f && s.top_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_p must be in (0, 1] (0 = disabled), got ", s.top_p()));
  } else {
    p.top_p = s.top_p();
  }
  if (s.has_seed()) p.seed = s.seed();
  if (!(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".min_p must be in [0, 1], got ",
                                                   s.min_p()));
  }
  p.min_p = s.min_p();
  if (!std::isfinite(s.presence_penalty()) || !std::isfinite(s.frequency_penalty()) ||
      !std::isfinite(s.repetition_penalty()) || s.repetition_penalty() < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": presence_penalty and frequency_penalty must be finite and repetition_penalty "
        ">= 0 (0 = disabled), got ", s.presence_penalty(), ", ", s.frequency_penalty(), ", ",
        s.repetition_penalty()));
  }
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  return p;
}

// The memory the plan divides: `device_bytes` (the GPU's, or --host_memory_bytes on CPU) in pages
// of `page_bytes`.
absl::StatusOr<ResolvedInit> ResolveInit(const vamp::v1::InitRequest& r,
                                         const AgentEngineOptions& o, uint64_t device_bytes,
                                         uint64_t page_bytes) {
  const bool cuda = o.device.kind == DeviceSpec::Kind::kCuda;
  ResolvedInit out;
  if (r.model_path().empty()) {
    return absl::InvalidArgumentError(
        "model_path is empty: it must name a directory with config.json (and *.safetensors "
        "unless load_format is dummy)");
  }
  const std::string format = r.load_format().empty() ? "auto" : r.load_format();
  absl::StatusOr<LoadFormat> load_format = ParseLoadFormat(format);
  if (!load_format.ok()) return WithPrefix(load_format.status(), "load_format: ");
  VAMP_ASSIGN_OR_RETURN(out.dtype, ResolveAgentDType(r.dtype(), o.device.kind));
  if (!cuda && (r.dtype() == "bfloat16" || r.dtype() == "float16")) {
    // The CPU engine has float32 kernels only; the weights are widened on load.
    VAMP_LOG(WARNING) << "dtype " << r.dtype()
                      << " requested: the CPU engine computes and stores KV in float32";
  }
  const vamp::v1::ParallelSpec& p = r.parallel();
  out.parallel.tp_size = p.tp_size() == 0 ? 1 : p.tp_size();
  out.parallel.tp_rank = p.tp_rank();
  if (out.parallel.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.tp_size must be >= 1, got ", p.tp_size()));
  }
  if (out.parallel.tp_rank < 0 || out.parallel.tp_rank >= out.parallel.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.tp_rank ", p.tp_rank(), " is outside [0, tp_size = ", out.parallel.tp_size, ")"));
  }
  if (cuda && out.parallel.tp_size > 1 &&
      p.nccl_unique_id().size() != static_cast<size_t>(kNcclUniqueIdBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.nccl_unique_id has ", p.nccl_unique_id().size(), " bytes; tp_size ",
                     out.parallel.tp_size, " on a CUDA agent needs the ", kNcclUniqueIdBytes,
                     "-byte NCCL unique id that rank 0 created for this initialisation (Agent."
                     "CreateCollectiveId; the controller hands it to every rank)"));
  }
  if (!cuda && out.parallel.tp_size > 1 && p.host_transport_address().empty()) {
    return absl::InvalidArgumentError(
        "parallel.host_transport_address is required for tp_size > 1 on CPU agents: rank 0 "
        "listens there and the other ranks connect (a fixed host:port)");
  }

  const vamp::v1::MemorySpec& m = r.memory();
  const InitDefaults& d = o.defaults;
  const double util =
      m.gpu_memory_utilization() == 0 ? d.gpu_memory_utilization : m.gpu_memory_utilization();
  if (!(util > 0.0 && util <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.gpu_memory_utilization must be in (0, 1], got ", m.gpu_memory_utilization()));
  }
  const int32_t block_size = m.block_size() == 0 ? d.block_size : m.block_size();
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.block_size must be >= 1, got ", m.block_size()));
  }
  if (!(m.max_offload_ratio() >= 0.0 && m.max_offload_ratio() < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.max_offload_ratio must be in [0, 1), got ", m.max_offload_ratio()));
  }
  const int32_t batched =
      m.max_num_batched_tokens() == 0 ? d.max_num_batched_tokens : m.max_num_batched_tokens();
  if (batched < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.max_num_batched_tokens must be >= 1, got ", m.max_num_batched_tokens()));
  }
  const int32_t seqs = m.max_num_seqs() == 0 ? d.max_num_seqs : m.max_num_seqs();
  if (seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.max_num_seqs must be >= 1, got ", m.max_num_seqs()));
  }

  absl::StatusOr<ModelConfig> config = LoadModelConfig(r.model_path());
  if (!config.ok()) {
    return WithCode(config.status(), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("model_path '", r.model_path(), "': "));
  }
  out.config = *std::move(config);
  absl::StatusOr<ExpertShardLayout> layout = ExpertLayoutFor(out.config, out.parallel);
  if (!layout.ok()) {
    return WithCode(layout.status(), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("parallel.tp_size ", out.parallel.tp_size, ": "));
  }

  out.load.model_path = r.model_path();
  out.load.format = *load_format;
  out.load.dummy_seed = r.dummy_seed();
  out.load.parallel = out.parallel;

  out.plan_config.tp_rank = out.parallel.tp_rank;
  out.plan_config.tp_size = out.parallel.tp_size;
  out.plan_config.device_memory_bytes = device_bytes;
  out.plan_config.gpu_memory_utilization = util;
  out.plan_config.page_bytes = page_bytes;
  out.plan_config.kv_block_size = block_size;
  out.plan_config.offload.max_offload_ratio = m.max_offload_ratio();
  out.plan_config.max_num_batched_tokens = batched;
  out.plan_config.max_num_seqs = seqs;
  out.plan_config.max_model_len = 0;
  // On CUDA the utilisation fraction leaves room for the context and cuBLAS; the device copies of
  // the non-expert weights and the activation workspace are in the plan's weight and activation
  // terms.
  out.plan_config.runtime_overhead_bytes = cuda ? 0 : o.host_runtime_overhead_bytes;
  out.plan_config.activation_bytes = m.activation_reserve_bytes();

  // Expert shards, dense weights and KV are planned in the engine's element size.
  const ModelShape shape = out.config.ToModelShape(DTypeBytes(out.dtype));
  absl::StatusOr<MemoryPlan> plan = PlanMemory(shape, out.plan_config);
  if (!plan.ok()) {
    const std::string prefix = absl::StrFormat(
        "memory (gpu_memory_utilization %.3f of %s %d bytes, page %d bytes): ", util,
        cuda ? absl::StrCat("device ", o.device.ToString()) : "--host_memory_bytes", device_bytes,
        page_bytes);
    return WithCode(plan.status(),
                    plan.status().code() == absl::StatusCode::kResourceExhausted
                        ? absl::StatusCode::kFailedPrecondition
                        : absl::StatusCode::kInvalidArgument,
                    prefix);
  }
  out.plan = *std::move(plan);

  out.runner.block_size = block_size;
  out.runner.max_num_seqs = seqs;
  out.runner.max_num_batched_tokens = batched;
  out.runner.max_model_len = 0;
  out.runner.seed = o.sampling_seed;
  return out;
}

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

// The runner's view of the first `blocks` blocks of the KV region: device addresses on CUDA,
// host addresses otherwise. Built again after every remap (the mapped range changed).
absl::StatusOr<KvCacheView> ViewOf(bool cuda, const KvRegion& region, int64_t num_layers,
                                   int64_t blocks) {
  KvCacheView view;
  if (cuda) {
#if VAMP_AGENT_CUDA
    VAMP_ASSIGN_OR_RETURN(view, CudaKvRegionView(region, static_cast<int>(num_layers)));
#else
    return absl::FailedPreconditionError("a CUDA KV view needs a CUDA build");
#endif
  } else {
    VAMP_ASSIGN_OR_RETURN(view, HostKvRegionView(region, static_cast<int>(num_layers)));
  }
  view.num_blocks = blocks;
  return view;
}

// Makes `device` current on the calling thread (the CUDA runtime's current device is per thread,
// and gRPC calls arrive on different threads), then, when `synchronize`, waits for all its work:
// after a remap, the expert pages written back by a restore must be on the device before the next
// step's kernels (on a non-blocking stream) read them.
absl::Status UseCudaDevice(int device, bool synchronize) {
#if VAMP_AGENT_CUDA
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess && synchronize) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cuda:", device, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      absl::StrCat("cuda:", device, " needs a CUDA build of vamp-agent"));
#endif
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

#if VAMP_AGENT_CUDA
// Checks that every rank of a new NCCL group was initialised with the same request, and connects
// the peers (NCCL sets connections up at the first collective), in one all-reduce: each byte b_i
// of the request's fingerprint as the float32 pair [b_i, b_i^2] (sums exact). Equal fingerprints
// sum to [n b_i, n b_i^2] on every rank; a rank with another byte breaks one of the two sums (for
// a fixed sum of n values, the sum of squares is n mean^2 only when all are equal). Waits at most
// `timeout_ms` for the peers; `cancel` (Abort) ends the wait.
absl::Status CheckNcclGroup(NcclCommunicator& comm, uint64_t fingerprint, int64_t timeout_ms,
                            const std::atomic<bool>& cancel) {
  constexpr int kBytes = 8;
  float pairs[2 * kBytes];
  for (int i = 0; i < kBytes; ++i) {
    const float b = static_cast<float>((fingerprint >> (8 * i)) & 0xff);
    pairs[2 * i] = b;
    pairs[2 * i + 1] = b * b;
  }
  VAMP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  VAMP_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(sizeof(pairs)));
  VAMP_RETURN_IF_ERROR(CudaRuntimeStatus(
      cudaMemcpyAsync(buffer.data(), pairs, sizeof(pairs), cudaMemcpyHostToDevice, stream.get()),
      "cudaMemcpyAsync (group check)"));
  VAMP_RETURN_IF_ERROR(comm.AllReduceSum(buffer.data(), 2 * kBytes, DType::kFloat32, stream.get()));
  // Poll rather than synchronise: a rank that never takes part must not block Init for ever.
  const auto deadline = Steady::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const cudaError_t err = cudaStreamQuery(stream.get());
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady) return CudaRuntimeStatus(err, "group check all-reduce");
    VAMP_RETURN_IF_ERROR(comm.Check());
    absl::Status stop;
    if (cancel.load()) {
      stop = absl::CancelledError("group check cancelled (the agent is re-initialised or stops)");
    } else if (Steady::now() >= deadline) {
      stop = absl::DeadlineExceededError(absl::StrCat(
          "the other ranks did not join the group check all-reduce within ", timeout_ms, " ms"));
    }
    if (!stop.ok()) {
      comm.Abort(stop);  // releases the waiting kernel, so the stream can be destroyed
      return stop;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  VAMP_RETURN_IF_ERROR(comm.Check());
  float sums[2 * kBytes];
  VAMP_RETURN_IF_ERROR(CudaRuntimeStatus(
      cudaMemcpyAsync(sums, buffer.data(), sizeof(sums), cudaMemcpyDeviceToHost, stream.get()),
      "cudaMemcpyAsync (group check)"));
  VAMP_RETURN_IF_ERROR(CudaRuntimeStatus(cudaStreamSynchronize(stream.get()),
                                         "cudaStreamSynchronize (group check)"));
  const float n = static_cast<float>(comm.size());
  for (int i = 0; i < 2 * kBytes; ++i) {
    if (sums[i] != n * pairs[i]) {
      return absl::FailedPreconditionError(
          "the ranks of this NCCL group were initialised with different InitRequests (model, "
          "load format, dtype, memory spec or tp_size differ): every rank must get the same "
          "request");
    }
  }
  return absl::OkStatus();
}
#endif

}  // namespace

absl::StatusOr<DType> ResolveAgentDType(absl::string_view requested, DeviceSpec::Kind device) {
  const bool cuda = device == DeviceSpec::Kind::kCuda;
  if (requested.empty() || requested == "auto") {
    return cuda ? DType::kBFloat16 : DType::kFloat32;
  }
  if (requested == "float16") {
    if (!cuda) return DType::kFloat32;
    return absl::InvalidArgumentError(
        "dtype 'float16' is not supported by CUDA agents (Qwen3 checkpoints are bfloat16 and "
        "float16 overflows their activations): use auto, bfloat16 or float32");
  }
  absl::StatusOr<DType> parsed = ParseDType(requested);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", requested, "' is not one of auto, bfloat16, float32", cuda ? "" : ", float16"));
  }
  return cuda ? *parsed : DType::kFloat32;
}

AgentEngine::AgentEngine(AgentEngineOptions options, AgentMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {}

AgentEngine::~AgentEngine() {
  Abort(absl::CancelledError("the agent is shutting down"));
  absl::MutexLock lock(&mu_);
  if (instance_ != nullptr && instance_->cuda) {
    // Device memory and streams are released on their device.
    if (absl::Status s = UseCudaDevice(instance_->cuda_device, /*synchronize=*/true); !s.ok()) {
      VAMP_LOG(ERROR) << "shutdown: " << s;
    }
  }
  instance_.reset();
}

void AgentEngine::Abort(absl::Status reason) {
  absl::MutexLock lock(&abort_mu_);
  if (connect_cancel_ != nullptr) connect_cancel_->store(true);
  if (live_comm_ != nullptr) live_comm_->Abort(reason);
#if VAMP_AGENT_CUDA
  // ncclCommAbort: kernels waiting in a collective return, so a step stuck on a dead peer ends.
  if (live_nccl_ != nullptr) live_nccl_->Abort(reason);
#endif
}

absl::StatusOr<std::string> AgentEngine::CreateCollectiveId() {
  if (options_.device.kind != DeviceSpec::Kind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateCollectiveId: this agent runs on ", options_.device.ToString(),
        "; CPU agents all-reduce over TCP (parallel.host_transport_address), not NCCL"));
  }
#if VAMP_AGENT_CUDA
  absl::StatusOr<std::string> id = NcclCommunicator::CreateUniqueId();
  if (!id.ok()) return WithPrefix(id.status(), "CreateCollectiveId: ");
  VAMP_LOG(INFO) << "created an NCCL unique id for the next Init of the group (this process hosts "
                    "its bootstrap root until every rank has joined)";
  return id;
#else
  return absl::FailedPreconditionError(
      absl::StrCat("CreateCollectiveId: ", options_.device.ToString(),
                   " needs a CUDA build of vamp-agent (VAMP_AGENT_CUDA)"));
#endif
}

bool AgentEngine::initialized() {
  absl::MutexLock lock(&mu_);
  return instance_ != nullptr;
}

int AgentEngine::rank() {
  absl::MutexLock lock(&mu_);
  return instance_ == nullptr ? -1 : instance_->rank();
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
  m.set_device_total_bytes(in->backend->device_memory_bytes());
  m.set_page_bytes(in->backend->page_bytes());
  m.set_rank(in->rank());
  const uint64_t offloaded = in->memory.experts->offloaded_bytes();
  m.set_resident_expert_bytes(in->plan.expert_weight_bytes - offloaded);
  m.set_offloaded_expert_bytes(offloaded);
  m.set_other_weight_bytes(in->other_weight_bytes);
  m.set_kv_pool_bytes(in->memory.kv->mapped_bytes());
  m.set_staging_bytes(static_cast<uint64_t>(in->plan.num_staging_buffers) *
                      in->plan.staging_buffer_bytes);
  m.set_activation_bytes(in->plan.activation_bytes);
  m.set_offloaded_groups(static_cast<int32_t>(in->memory.repartitioner->offloaded_groups()));
  m.set_max_offload_groups(static_cast<int32_t>(in->plan.experts.max_groups));
  m.set_kv_blocks(in->usable_blocks);
  return m;
}

absl::Status AgentEngine::ConnectGroup(Instance& in) {
  in.comm.reset();
  if (in.tp_size() == 1) return absl::OkStatus();
  std::shared_ptr<std::atomic<bool>> cancel;
  {
    absl::MutexLock lock(&abort_mu_);
    if (connect_cancel_ != nullptr) connect_cancel_->store(true);
    connect_cancel_ = cancel = std::make_shared<std::atomic<bool>>(false);
  }
  if (in.cuda) {
#if VAMP_AGENT_CUDA
    return ConnectNcclGroup(in, *cancel);
#else
    return absl::FailedPreconditionError("a CUDA tensor-parallel group needs a CUDA build");
#endif
  }
  TcpCommunicatorOptions o;
  o.rank = in.rank();
  o.size = in.tp_size();
  o.address = in.request.parallel().host_transport_address();
  o.connect_timeout_ms = options_.tp_connect_timeout_ms;
  o.io_timeout_ms = options_.tp_io_timeout_ms;
  o.group_fingerprint = GroupFingerprint(in.request);
  o.auth_token = options_.auth_token;
  VAMP_LOG(INFO) << "tensor parallelism: rank " << o.rank << " of " << o.size
                 << (o.rank == 0 ? " listening on " : " connecting to ") << o.address;
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> comm = TcpCommunicator::Connect(o, cancel.get());
  if (!comm.ok()) return WithPrefix(comm.status(), "parallel: ");
  in.comm = std::move(*comm);
  absl::MutexLock lock(&abort_mu_);
  live_comm_ = in.comm;
  return absl::OkStatus();
}

#if VAMP_AGENT_CUDA
absl::Status AgentEngine::ConnectNcclGroup(Instance& in, const std::atomic<bool>& cancel) {
  in.nccl.reset();
  NcclCommunicatorOptions o;
  o.rank = in.rank();
  o.size = in.tp_size();
  o.device = in.cuda_device;
  o.init_timeout_ms = options_.tp_connect_timeout_ms;
  o.enqueue_timeout_ms = options_.tp_io_timeout_ms;
  o.watchdog_interval_ms = options_.tp_watchdog_interval_ms;
  VAMP_LOG(INFO) << "tensor parallelism: rank " << o.rank << " of " << o.size
                 << " on cuda:" << o.device << " joining the NCCL group";
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(in.request.parallel().nccl_unique_id(), o, &cancel);
  if (!comm.ok()) return WithPrefix(comm.status(), "parallel: ");
  in.nccl = std::move(*comm);
  {
    absl::MutexLock lock(&abort_mu_);
    live_nccl_ = in.nccl;
  }
  return WithPrefix(
      CheckNcclGroup(*in.nccl, GroupFingerprint(in.request), options_.tp_io_timeout_ms, cancel),
      "parallel: ");
}
#endif

absl::Status AgentEngine::ResetRunner(Instance& in) {
  in.runner.reset();
  in.requests.clear();
  VAMP_ASSIGN_OR_RETURN(KvCacheView view, ViewOf(in.cuda, *in.memory.kv,
                                                 in.config.num_hidden_layers, in.usable_blocks));
  VAMP_ASSIGN_OR_RETURN(in.runner, ModelRunner::Create(in.runner_config, in.runner_model(),
                                                       in.expert_weights(), in.comm.get(), view));
  return absl::OkStatus();
}

absl::StatusOr<vamp::v1::InitResponse> AgentEngine::Init(const vamp::v1::InitRequest& request) {
  const auto start = Steady::now();
  const bool cuda = options_.device.kind == DeviceSpec::Kind::kCuda;
  // The memory the plan divides. On CUDA the backend is created first (cheap: it allocates
  // nothing) for the device's size and page granularity.
  std::unique_ptr<MemoryBackend> cuda_backend;
  uint64_t device_bytes = options_.host_memory_bytes;
  uint64_t page_bytes = options_.host_page_bytes;
  if (cuda) {
#if VAMP_AGENT_CUDA
    VAMP_RETURN_IF_ERROR(UseCudaDevice(options_.device.ordinal, /*synchronize=*/false));
    absl::StatusOr<std::unique_ptr<MemoryBackend>> backend =
        CreateCudaMemoryBackend(options_.device.ordinal);
    if (!backend.ok()) {
      return WithPrefix(backend.status(),
                        absl::StrCat("device ", options_.device.ToString(), ": "));
    }
    cuda_backend = std::move(*backend);
    device_bytes = cuda_backend->device_memory_bytes();
    page_bytes = cuda_backend->page_bytes();
#else
    return absl::FailedPreconditionError(
        absl::StrCat("device ", options_.device.ToString(), " needs a CUDA build of vamp-agent"));
#endif
  }
  // Everything that can be checked without touching the current model is checked first, so a
  // bad request leaves a working agent working.
  VAMP_ASSIGN_OR_RETURN(ResolvedInit resolved,
                        ResolveInit(request, options_, device_bytes, page_bytes));
  // A step blocked in a collective on a dead peer holds mu_: fail it instead of waiting.
  Abort(absl::AbortedError("the agent is being re-initialised"));
  absl::MutexLock lock(&mu_);

  // A CUDA group forms with a fresh NCCL unique id each time, and the device model holds the
  // communicator it was built with: such an Init always rebuilds.
  const bool nccl_group = cuda && resolved.parallel.tp_size > 1;
  if (instance_ != nullptr && !nccl_group &&
      google::protobuf::util::MessageDifferencer::Equals(instance_->request, request)) {
    Instance& in = *instance_;
    VAMP_LOG(INFO) << "Init: same request as before; keeping the model and memory, forgetting "
                   << in.requests.size() << " request(s)";
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
  in->config = resolved.config;
  in->runner_config = resolved.runner;
  in->cuda = cuda;
  in->cuda_device = options_.device.ordinal;
  in->dtype = resolved.dtype;
  // Connect first: it fails fast on a mismatched group, and loading (the slow part) then runs on
  // every rank at once.
  VAMP_RETURN_IF_ERROR(ConnectGroup(*in));

  in->plan = resolved.plan;
  if (cuda) {
    in->backend = std::move(cuda_backend);
#if VAMP_AGENT_CUDA
    // Remaps run between steps, and a step returns with its stream idle; the fence still waits
    // for the whole device (staging copies run on their own stream) before a page is unmapped.
    in->fence = CreateCudaStreamFence(in->cuda_device, {});
#endif
  } else {
    absl::StatusOr<std::unique_ptr<HostMemoryBackend>> backend = HostMemoryBackend::Create(
        options_.host_page_bytes, options_.host_memory_bytes, options_.host_populate);
    if (!backend.ok()) return WithPrefix(backend.status(), "host memory backend: ");
    in->backend = std::move(*backend);
    // Every step (staging copies included) has finished when ExecuteStep returns, and remaps run
    // between steps: nothing is ever in flight when a page is unmapped.
    in->fence = std::make_unique<CallbackFence>([] { return absl::OkStatus(); });
  }
  absl::StatusOr<AgentMemory> memory =
      CreateAgentMemory(in->backend.get(), in->plan, in->fence.get());
  if (!memory.ok()) return WithPrefix(memory.status(), "memory: ");
  in->memory = std::move(*memory);
  VAMP_ASSIGN_OR_RETURN(ExpertShardLayout layout, ExpertLayoutFor(in->config, resolved.parallel));
  layout.dtype = in->dtype;  // as planned: the store's shards are of the engine's dtype
  // The loader writes expert shards into the store through the engine's expert weights.
  ExpertWeightSink* sink = nullptr;
  if (cuda) {
#if VAMP_AGENT_CUDA
    // The assembly order of engine/runner/cuda/cuda_qwen3_moe.h: stream, expert weights (on the
    // store), host model, FinalizeLoad, device model, KV view, runner.
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    if (!stream.ok()) return WithPrefix(stream.status(), "CUDA stream: ");
    in->stream = std::move(*stream);
    absl::StatusOr<std::unique_ptr<CudaExpertStoreWeights>> experts =
        CudaExpertStoreWeights::Create(in->memory.experts.get(), layout, in->stream.get());
    if (!experts.ok()) return WithPrefix(experts.status(), "expert store: ");
    in->cuda_experts = std::move(*experts);
    sink = in->cuda_experts.get();
#endif
  } else {
    absl::StatusOr<std::unique_ptr<ExpertStoreWeights>> experts =
        ExpertStoreWeights::Create(in->memory.experts.get(), layout);
    if (!experts.ok()) return WithPrefix(experts.status(), "expert store: ");
    in->experts = std::move(*experts);
    sink = in->experts.get();
  }
  absl::StatusOr<std::unique_ptr<CausalLm>> model = LoadModel(in->config, resolved.load, *sink);
  if (!model.ok()) {
    return WithPrefix(model.status(), absl::StrCat("model_path '", request.model_path(), "': "));
  }
  in->model = std::move(*model);
  VAMP_RETURN_IF_ERROR(WithPrefix(in->memory.experts->FinalizeLoad(), "expert store: "));
#if VAMP_AGENT_CUDA
  if (cuda) {
    CudaForwardOptions forward;
    forward.dtype = in->dtype;
    forward.cuda_graphs = options_.cuda_graphs;
    forward.device_gemm_max_rows_per_expert = options_.device_gemm_max_rows_per_expert;
    forward.all_reduce = in->nccl.get();  // null for tp_size 1
    absl::StatusOr<std::unique_ptr<CudaQwen3MoeModel>> device_model =
        CudaQwen3MoeModel::Create(in->model.get(), in->runner_config, in->stream.get(), forward);
    if (!device_model.ok()) return WithPrefix(device_model.status(), "CUDA model: ");
    // What the non-expert weights occupy on the device (matrices in the engine's dtype).
    in->other_weight_bytes = (*device_model)->weight_bytes();
    in->device_model = std::move(*device_model);
  }
#endif
  if (in->model->kv_heads_per_rank() != in->plan.kv.kv_heads_per_rank ||
      in->config.head_dim != in->plan.kv.head_dim) {
    return absl::InternalError(
        absl::StrCat("KV geometry mismatch: the model stores ", in->model->kv_heads_per_rank(),
                     " heads of ", in->config.head_dim, ", the memory plan ",
                     in->plan.kv.kv_heads_per_rank, " of ", in->plan.kv.head_dim));
  }
  if (!cuda) {
    in->model->ForEachWeight([&](absl::string_view, absl::Span<const float> data) {
      in->other_weight_bytes += data.size() * sizeof(float);
    });
  }
  in->usable_blocks = in->memory.kv->num_blocks();
  VAMP_RETURN_IF_ERROR(ResetRunner(*in));

  vamp::v1::InitResponse& response = in->response;
  response.set_memory_plan_text(in->plan.Summary());
  response.set_num_layers(static_cast<int32_t>(in->config.num_hidden_layers));
  response.set_num_experts(static_cast<int32_t>(in->config.num_experts));
  response.set_experts_per_group(static_cast<int32_t>(in->plan.experts.group_experts));
  response.set_vocab_size(static_cast<int32_t>(in->config.vocab_size));
  response.set_max_position_embeddings(static_cast<int32_t>(in->config.max_position_embeddings));
  response.set_eos_token_id(in->config.eos_token_ids.empty()
                                ? -1
                                : static_cast<int32_t>(in->config.eos_token_ids.front()));
  instance_ = std::move(in);
  response.mutable_memory()->CopyFrom(MemoryLocked());
  if (metrics_ != nullptr) {
    metrics_->SetInitialized(true);
    metrics_->SetMemory(response.memory());
  }
  VAMP_LOG(INFO) << "Init done in " << MicrosSince(start) / 1000
                 << " ms: " << instance_->config.architecture_name << " from "
                 << request.model_path() << " ("
                 << (request.load_format().empty() ? "auto" : request.load_format()) << "), "
                 << DTypeName(instance_->dtype) << ", TP rank " << instance_->rank() << " of "
                 << instance_->tp_size() << "\n"
                 << response.memory_plan_text();
  return response;
}

absl::StatusOr<vamp::v1::CapacityResponse> AgentEngine::Capacity(
    const vamp::v1::CapacityRequest& request) {
  absl::MutexLock lock(&mu_);
  if (instance_ == nullptr) {
    return absl::FailedPreconditionError("agent is not initialised: call Init first");
  }
  Instance& in = *instance_;
  MemoryRepartitioner& rep = *in.memory.repartitioner;
  vamp::v1::CapacityResponse response;
  const int64_t now = in.usable_blocks;
  const int64_t region = in.memory.kv->num_blocks();
  int64_t after = now;
  if (request.delta_groups() > 0) {
    absl::StatusOr<int64_t> added = rep.BlocksAddedByOffload(request.delta_groups());
    if (added.ok()) after = region + *added;
  } else if (request.delta_groups() < 0) {
    absl::StatusOr<int64_t> removed = rep.BlocksRemovedByRestore(-int64_t{request.delta_groups()});
    if (removed.ok()) after = std::min(now, region - *removed);
  }
  response.set_kv_blocks_now(now);
  response.set_kv_blocks_after(after);
  response.set_offloaded_groups(static_cast<int32_t>(rep.offloaded_groups()));
  response.set_max_offload_groups(static_cast<int32_t>(in.plan.experts.max_groups));
  response.set_staged_bytes_per_group(in.plan.experts.group_bytes *
                                      in.plan.experts.eligible_layers.size());
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

absl::Status AgentEngine::ApplyRemap(Instance& in, int index,
                                     const vamp::v1::RemapCommand& command) {
  const std::string what =
      absl::StrCat("remaps[", index, "] (remap_id '", command.remap_id(), "')");
  const auto start = Steady::now();
  MemoryRepartitioner& rep = *in.memory.repartitioner;
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
  const int64_t before = in.usable_blocks;
  auto failed = [&](const absl::Status& s) {
    if (metrics_ != nullptr) metrics_->ObserveRemap(action, "error", 0);
    return WithPrefix(s, absl::StrCat(what, ": ", action, " of ", n, " group(s): "));
  };
  int64_t target = 0;
  if (offload) {
    absl::StatusOr<RemapResult> r = rep.Offload(n);
    if (!r.ok()) return failed(r.status());
    const int64_t region = in.memory.kv->num_blocks();
    target = command.expected_kv_blocks() > 0 ? command.expected_kv_blocks() : region;
    absl::Status usable = CheckUsable(*in.runner, target, region, "after the offload");
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
    const int64_t region = in.memory.kv->num_blocks();
    const int64_t region_after = region - *removed;
    target = command.expected_kv_blocks() > 0 ? command.expected_kv_blocks()
                                              : std::min(before, region_after);
    absl::Status usable = CheckUsable(*in.runner, target, region_after, "after the restore");
    if (!usable.ok()) return failed(usable);
    const int64_t free_tail = region - (HighestUsedBlock(*in.runner) + 1);
    absl::StatusOr<RemapResult> r = rep.Restore(n, free_tail);
    if (!r.ok()) return failed(r.status());
  }
  in.usable_blocks = target;
  VAMP_ASSIGN_OR_RETURN(KvCacheView view,
                        ViewOf(in.cuda, *in.memory.kv, in.config.num_hidden_layers, target));
  VAMP_RETURN_IF_ERROR(in.runner->SetKvCache(std::move(view)));
  if (!command.remap_id().empty()) {
    in.remaps.push_back({command.remap_id(), command.action(), n, before});
    while (static_cast<int>(in.remaps.size()) > options_.max_remap_history) in.remaps.pop_front();
  }
  const double seconds = static_cast<double>(MicrosSince(start)) * 1e-6;
  if (metrics_ != nullptr) metrics_->ObserveRemap(action, "ok", seconds);
  VAMP_LOG(INFO) << what << ": " << action << " of " << n << " group(s): KV pool " << before
                 << " -> " << target << " blocks, " << rep.offloaded_groups()
                 << " group(s) offloaded, " << seconds * 1e3 << " ms";
  return absl::OkStatus();
}

absl::Status AgentEngine::Rollback(Instance& in, const std::string& remap_id) {
  auto it = std::find_if(in.remaps.begin(), in.remaps.end(),
                         [&](const RemapRecord& r) { return r.remap_id == remap_id; });
  if (it == in.remaps.end()) {
    // It failed on this rank (and changed nothing) or never arrived: nothing to undo.
    VAMP_LOG(WARNING) << "rollback of remap '" << remap_id
                      << "': not applied on this rank, nothing to undo";
    return absl::OkStatus();
  }
  const RemapRecord record = *it;
  const std::string what = absl::StrCat("rollback_remap_ids '", remap_id, "'");
  MemoryRepartitioner& rep = *in.memory.repartitioner;
  const bool undo_offload = record.action == vamp::v1::RemapCommand::ACTION_OFFLOAD;
  int64_t target = 0;
  if (undo_offload) {
    absl::StatusOr<int64_t> removed = rep.BlocksRemovedByRestore(record.groups);
    if (!removed.ok()) return WithPrefix(removed.status(), absl::StrCat(what, ": "));
    const int64_t region = in.memory.kv->num_blocks();
    target = std::min(record.blocks_before, region - *removed);
    VAMP_RETURN_IF_ERROR(CheckUsable(*in.runner, target, region - *removed, what));
    const int64_t free_tail = region - (HighestUsedBlock(*in.runner) + 1);
    VAMP_RETURN_IF_ERROR(
        WithPrefix(rep.Restore(record.groups, free_tail).status(), absl::StrCat(what, ": ")));
  } else {
    VAMP_RETURN_IF_ERROR(WithPrefix(rep.Offload(record.groups).status(), absl::StrCat(what, ": ")));
    target = std::min(record.blocks_before, in.memory.kv->num_blocks());
  }
  in.remaps.erase(std::find_if(in.remaps.begin(), in.remaps.end(),
                               [&](const RemapRecord& r) { return r.remap_id == remap_id; }));
  in.usable_blocks = target;
  VAMP_ASSIGN_OR_RETURN(KvCacheView view,
                        ViewOf(in.cuda, *in.memory.kv, in.config.num_hidden_layers, target));
  VAMP_RETURN_IF_ERROR(in.runner->SetKvCache(std::move(view)));
  if (metrics_ != nullptr) {
    metrics_->ObserveRemap(undo_offload ? "offload" : "restore", "rollback", 0);
  }
  VAMP_LOG(INFO) << "rolled back remap '" << remap_id << "': KV pool now " << target << " blocks";
  return absl::OkStatus();
}

absl::Status AgentEngine::RunStep(Instance& in, const vamp::v1::StepRequest& request,
                                  vamp::v1::StepResponse* response) {
  const int64_t vocab = in.config.vocab_size;
  const int64_t pool = in.usable_blocks;
  if (request.num_blocks() < 0 || request.num_blocks() > pool) {
    return absl::FailedPreconditionError(absl::StrCat("num_blocks ", request.num_blocks(),
                                                      " does not match this rank's KV pool of ",
                                                      pool, " blocks"));
  }
  auto check_blocks = [&](const google::protobuf::RepeatedField<int32_t>& blocks,
                          const std::string& field) -> absl::Status {
    for (int j = 0; j < blocks.size(); ++j) {
      if (blocks[j] < 0 || blocks[j] >= pool) {
        return absl::OutOfRangeError(absl::StrCat(field, "[", j, "] = ", blocks[j],
                                                  " is outside the KV pool of ", pool, " blocks"));
      }
    }
    return absl::OkStatus();
  };

  // Where every request the step touches ends up, if the step is applied.
  enum class Fate { kRunning, kPreempted, kGone };
  absl::flat_hash_map<uint64_t, Fate> fate;
  auto current = [&](uint64_t id) -> std::optional<Fate> {
    if (auto f = fate.find(id); f != fate.end()) return f->second;
    auto r = in.requests.find(id);
    if (r == in.requests.end()) return std::nullopt;
    return r->second.in_runner ? Fate::kRunning : Fate::kPreempted;
  };
  StepInput step;
  absl::flat_hash_set<uint64_t> fresh;  // announced in new_requests (not resumed)

  for (uint64_t id : request.finished_request_ids()) {
    const std::optional<Fate> f = current(id);
    // Finishing a request this rank never saw (or already forgot) has nothing to undo.
    if (!f.has_value() || *f == Fate::kGone) continue;
    if (*f == Fate::kRunning) step.finished_ids.push_back(id);
    fate[id] = Fate::kGone;
  }
  for (int i = 0; i < request.preempted_request_ids_size(); ++i) {
    const uint64_t id = request.preempted_request_ids(i);
    const std::optional<Fate> f = current(id);
    if (!f.has_value() || *f == Fate::kGone) {
      return absl::NotFoundError(
          absl::StrCat("preempted_request_ids[", i, "]: request ", id, " is unknown"));
    }
    if (*f == Fate::kRunning) step.finished_ids.push_back(id);
    fate[id] = Fate::kPreempted;
  }
  for (int i = 0; i < request.new_requests_size(); ++i) {
    const vamp::v1::NewRequest& r = request.new_requests(i);
    const std::string field = absl::StrCat("new_requests[", i, "]");
    const std::optional<Fate> f = current(r.request_id());
    if (f.has_value() && *f != Fate::kGone) {
      return absl::AlreadyExistsError(absl::StrCat(field, ".request_id ", r.request_id(),
                                                   " is already known (finish it before "
                                                   "reusing the id)"));
    }
    if (r.prompt_token_ids_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".prompt_token_ids is empty"));
    }
    for (int j = 0; j < r.prompt_token_ids_size(); ++j) {
      if (r.prompt_token_ids(j) < 0 || r.prompt_token_ids(j) >= vocab) {
        return absl::OutOfRangeError(absl::StrCat(field, ".prompt_token_ids[", j,
                                                  "] = ", r.prompt_token_ids(j),
                                                  " is outside the vocabulary of ", vocab));
      }
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.block_ids(), field + ".block_ids"));
    if (r.num_computed_tokens() < 0 || r.num_scheduled_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": num_computed_tokens and num_scheduled_tokens must be >= 0, got ",
                       r.num_computed_tokens(), " and ", r.num_scheduled_tokens()));
    }
    if (r.min_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".min_tokens must be >= 0, got ", r.min_tokens()));
    }
    VAMP_ASSIGN_OR_RETURN(RunnerSamplingParams sampling,
                          ToRunnerSampling(r.sampling(), field + ".sampling"));
    sampling.min_tokens = r.min_tokens();
    if (r.min_tokens() > 0) {
      std::vector<int32_t>& banned = sampling.min_tokens_banned_ids;
      banned.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
      if (r.eos_token_id() >= 0) banned.push_back(r.eos_token_id());
      std::sort(banned.begin(), banned.end());
      banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
    }
    NewRequestData data;
    data.id = r.request_id();
    data.prompt_token_ids.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    data.num_prompt_tokens = r.prompt_token_ids_size();
    data.block_ids.assign(r.block_ids().begin(), r.block_ids().end());
    data.num_computed_tokens = r.num_computed_tokens();
    data.sampling = sampling;
    step.new_requests.push_back(std::move(data));
    fresh.insert(r.request_id());
    fate[r.request_id()] = Fate::kRunning;
    if (r.num_scheduled_tokens() > 0) {
      step.scheduled.push_back({r.request_id(), r.num_scheduled_tokens()});
    }
  }
  for (int i = 0; i < request.cached_requests_size(); ++i) {
    const vamp::v1::CachedRequest& r = request.cached_requests(i);
    const std::string field = absl::StrCat("cached_requests[", i, "]");
    const std::optional<Fate> f = current(r.request_id());
    if (!f.has_value() || *f == Fate::kGone) {
      return absl::NotFoundError(
          absl::StrCat(field, ".request_id ", r.request_id(), " is unknown"));
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.new_block_ids(), field + ".new_block_ids"));
    if (r.num_computed_tokens() < 0 || r.num_scheduled_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": num_computed_tokens and num_scheduled_tokens must be >= 0, got ",
                       r.num_computed_tokens(), " and ", r.num_scheduled_tokens()));
    }
    if (*f == Fate::kPreempted) {
      if (!r.resumed()) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": request ", r.request_id(),
            " is preempted; it must come back with resumed = true and its whole block table"));
      }
      // The runner forgot it at preemption: announce it again with every token it has.
      const RequestState& state = in.requests.at(r.request_id());
      NewRequestData data;
      data.id = r.request_id();
      data.prompt_token_ids = state.tokens;
      data.num_prompt_tokens = state.num_prompt_tokens;
      data.block_ids.assign(r.new_block_ids().begin(), r.new_block_ids().end());
      data.num_computed_tokens = r.num_computed_tokens();
      data.sampling = state.sampling;
      step.new_requests.push_back(std::move(data));
    } else {
      CachedRequestData data;
      data.id = r.request_id();
      data.new_block_ids.assign(r.new_block_ids().begin(), r.new_block_ids().end());
      data.num_computed_tokens = r.num_computed_tokens();
      data.resumed_from_preemption = r.resumed();
      step.cached_requests.push_back(std::move(data));
    }
    fate[r.request_id()] = Fate::kRunning;
    if (r.num_scheduled_tokens() > 0) {
      step.scheduled.push_back({r.request_id(), r.num_scheduled_tokens()});
    }
  }

  const bool runner_work = !step.finished_ids.empty() || !step.new_requests.empty() ||
                           !step.cached_requests.empty() || !step.scheduled.empty();
  absl::StatusOr<StepOutput> out = StepOutput{};
  if (runner_work) out = in.runner->ExecuteStep(step);
  // The runner validates a step before changing anything; a failure after that (in the forward
  // pass) leaves its diffs applied. Mirror whichever happened so the agent and runner agree.
  bool applied = out.ok();
  if (!applied) {
    for (const NewRequestData& d : step.new_requests) {
      if (in.runner->batch().SlotOf(d.id) >= 0) applied = true;
    }
    for (RunnerRequestId id : step.finished_ids) {
      if (in.runner->batch().SlotOf(id) < 0) applied = true;
    }
  }
  if (applied) {
    for (const auto& [id, f] : fate) {
      if (f == Fate::kGone) {
        in.requests.erase(id);
      } else if (f == Fate::kPreempted) {
        in.requests[id].in_runner = false;
      }
    }
    for (const NewRequestData& d : step.new_requests) {
      RequestState& state = in.requests[d.id];
      if (fresh.contains(d.id)) {
        state.tokens = d.prompt_token_ids;
        state.num_prompt_tokens = d.num_prompt_tokens;
        state.sampling = d.sampling;
      }
      state.in_runner = true;
    }
  }
  if (!out.ok()) return WithPrefix(out.status(), "step: ");
  for (const SampledToken& s : out->sampled) {
    in.requests[s.id].tokens.push_back(s.token);
    vamp::v1::SampledTokens* sampled = response->add_sampled();
    sampled->set_request_id(s.id);
    sampled->add_token_ids(s.token);
    sampled->add_logprobs(s.logprob);
  }
  response->mutable_timings()->set_forward_us(
      static_cast<int64_t>(out->forward_us + out->sample_us));
  return absl::OkStatus();
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
    if (in.cuda) {
      if (absl::Status s = UseCudaDevice(in.cuda_device, /*synchronize=*/false); !s.ok()) {
        errors.push_back(std::string(s.message()));
      }
    }
    staging_before = in.staging();
    const auto remap_start = Steady::now();
    for (const std::string& id : request.rollback_remap_ids()) {
      if (absl::Status s = Rollback(in, id); !s.ok()) errors.push_back(std::string(s.message()));
    }
    for (int i = 0; i < request.remaps_size(); ++i) {
      if (absl::Status s = ApplyRemap(in, i, request.remaps(i)); !s.ok()) {
        errors.push_back(std::string(s.message()));
      }
    }
    if (in.cuda && (request.remaps_size() > 0 || request.rollback_remap_ids_size() > 0)) {
      // Expert pages a restore wrote back must be on the device before this step's kernels.
      if (absl::Status s = UseCudaDevice(in.cuda_device, /*synchronize=*/true); !s.ok()) {
        errors.push_back(std::string(s.message()));
      }
    }
    response.mutable_timings()->set_remap_us(static_cast<int64_t>(MicrosSince(remap_start)));
    if (metrics_ != nullptr &&
        (request.remaps_size() > 0 || request.rollback_remap_ids_size() > 0)) {
      metrics_->SetMemory(MemoryLocked());
    }
    if (absl::Status s = RunStep(in, request, &response); !s.ok()) {
      errors.push_back(std::string(s.message()));
    }
#if VAMP_AGENT_CUDA
    // A failed peer (or Abort) breaks the NCCL group; the step's results cannot be trusted then.
    if (in.nccl != nullptr) {
      if (absl::Status health = in.nccl->Check(); !health.ok()) {
        errors.push_back(absl::StrCat("parallel: the NCCL group (rank ", in.rank(), " of ",
                                      in.tp_size(), ") is broken: ", health.message(),
                                      "; the controller must initialise the group again"));
      }
    }
#endif
    staging_after = in.staging();
  }
  response.set_rank(instance_ == nullptr ? -1 : instance_->rank());
  vamp::v1::StepTimings& t = *response.mutable_timings();
  t.set_staging_stall_us(static_cast<int64_t>(staging_after.wait_us - staging_before.wait_us));
  t.set_staged_bytes(staging_after.bytes - staging_before.bytes);
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
