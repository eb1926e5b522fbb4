#include "agent/cuda_support.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_buffers.h"
#include "engine/memory/cuda_status.h"
#include "engine/rank/cuda_device.h"
#include "engine/runner/comm/nccl_communicator.h"

namespace vamp {
namespace {

using Steady = std::chrono::steady_clock;

static_assert(kNcclUniqueIdBytes == NcclCommunicator::kUniqueIdBytes);

// Sums `count` float32 values over the ranks of `comm`, from and into host memory: copied to the
// device, all-reduced on a stream of its own, copied back. Polls rather than synchronises, so that
// a rank that never takes part cannot block the caller for ever: at most `timeout_ms`, and
// `cancel` (Abort) or a failure of the group ends the wait (the communicator is then aborted,
// which releases the waiting kernel so that the stream can be destroyed).
absl::Status AllReduceHostFloats(NcclCommunicator& comm, float* values, int count,
                                 int64_t timeout_ms, const std::atomic<bool>& cancel,
                                 absl::string_view what) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(count);
  VAMP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  VAMP_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes));
  VAMP_RETURN_IF_ERROR(CudaRuntimeStatus(
      cudaMemcpyAsync(buffer.data(), values, bytes, cudaMemcpyHostToDevice, stream.get()),
      absl::StrCat("cudaMemcpyAsync (", what, ")")));
  VAMP_RETURN_IF_ERROR(comm.AllReduceSum(buffer.data(), count, DType::kFloat32, stream.get()));
  const auto deadline = Steady::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const cudaError_t err = cudaStreamQuery(stream.get());
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady) return CudaRuntimeStatus(err, absl::StrCat(what, " all-reduce"));
    VAMP_RETURN_IF_ERROR(comm.Check());
    absl::Status stop;
    if (cancel.load()) {
      stop = absl::CancelledError(
          absl::StrCat(what, " cancelled (the agent is re-initialised or stops)"));
    } else if (Steady::now() >= deadline) {
      stop = absl::DeadlineExceededError(absl::StrCat("the other ranks did not join the ", what,
                                                      " all-reduce within ", timeout_ms, " ms"));
    }
    if (!stop.ok()) {
      comm.Abort(stop);
      return stop;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  VAMP_RETURN_IF_ERROR(comm.Check());
  VAMP_RETURN_IF_ERROR(CudaRuntimeStatus(
      cudaMemcpyAsync(values, buffer.data(), bytes, cudaMemcpyDeviceToHost, stream.get()),
      absl::StrCat("cudaMemcpyAsync (", what, ")")));
  return CudaRuntimeStatus(cudaStreamSynchronize(stream.get()),
                           absl::StrCat("cudaStreamSynchronize (", what, ")"));
}

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
  float sums[2 * kBytes];
  std::copy(std::begin(pairs), std::end(pairs), std::begin(sums));
  VAMP_RETURN_IF_ERROR(
      AllReduceHostFloats(comm, sums, 2 * kBytes, timeout_ms, cancel, "group check"));
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
class NcclGroup final : public TensorParallelGroup {
 public:
  NcclGroup(std::unique_ptr<NcclCommunicator> comm, int64_t io_timeout_ms)
      : comm_(std::move(comm)), io_timeout_ms_(io_timeout_ms) {}
  DeviceAllReduce* device_all_reduce() override { return comm_.get(); }
  // ncclCommAbort: kernels waiting in a collective return, so a step stuck on a dead peer ends.
  void Abort(const absl::Status& reason) override { comm_->Abort(reason); }
  absl::Status Check() override { return comm_->Check(); }
  // Between steps, on the calling thread's current device (the agent's): no step is in flight.
  // Abort() ends the wait through the communicator's error, which the poll checks.
  absl::StatusOr<bool> AllRanksOk(bool ok) override {
    float failed = ok ? 0.0f : 1.0f;
    const std::atomic<bool> never{false};
    VAMP_RETURN_IF_ERROR(
        AllReduceHostFloats(*comm_, &failed, 1, io_timeout_ms_, never, "remap agreement"));
    return failed == 0.0f;
  }

 private:
  const std::unique_ptr<NcclCommunicator> comm_;
  const int64_t io_timeout_ms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCudaAgentDevice(const AgentEngineOptions& options) {
  CudaDeviceOptions device;
  device.ordinal = options.device.ordinal;
  device.forward.cuda_graphs = options.cuda_graphs;
  device.forward.device_gemm_max_rows_per_expert = options.device_gemm_max_rows_per_expert;
  device.forward.routed_staging_max_tokens = options.routed_staging_max_tokens;
  return CreateCudaDevice(device);
}

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> JoinNcclGroup(
    const vamp::v1::InitRequest& request, const AgentEngineOptions& options,
    const std::atomic<bool>& cancel) {
  NcclCommunicatorOptions o;
  o.rank = request.parallel().tp_rank();
  o.size = request.parallel().tp_size();
  o.device = options.device.ordinal;
  o.init_timeout_ms = options.tp_connect_timeout_ms;
  o.enqueue_timeout_ms = options.tp_io_timeout_ms;
  o.watchdog_interval_ms = options.tp_watchdog_interval_ms;
  VAMP_LOG(INFO) << "tensor parallelism: rank " << o.rank << " of " << o.size
                 << " on cuda:" << o.device << " joining the NCCL group";
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                        NcclCommunicator::Create(request.parallel().nccl_unique_id(), o, &cancel));
  VAMP_RETURN_IF_ERROR(
      CheckNcclGroup(*comm, GroupFingerprint(request), options.tp_io_timeout_ms, cancel));
  return std::unique_ptr<TensorParallelGroup>(
      std::make_unique<NcclGroup>(std::move(comm), options.tp_io_timeout_ms));
}

absl::StatusOr<std::string> CreateNcclUniqueId(const DeviceSpec&) {
  VAMP_ASSIGN_OR_RETURN(std::string id, NcclCommunicator::CreateUniqueId());
  VAMP_LOG(INFO) << "created an NCCL unique id for the next Init of the group (this process hosts "
                    "its bootstrap root until every rank has joined)";
  return id;
}

}  // namespace vamp
