#include "engine/runner/comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"

namespace vamp {
namespace {

static_assert(NcclCommunicator::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES,
              "kUniqueIdBytes must match nccl.h");

using Steady = std::chrono::steady_clock;

// An error naming the NCCL call, NCCL's description of `result` and, when there is one, NCCL's
// last error text (which says what failed: a socket, a peer, a CUDA call).
absl::Status NcclStatus(ncclResult_t result, absl::string_view call, ncclComm_t comm) {
  std::string message = absl::StrCat(call, " failed: ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&message, ": ", last);
  switch (result) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(message);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// Aborts `comm` on its device, keeping the calling thread's current device.
void AbortComm(ncclComm_t comm, int device) {
  int previous = -1;
  const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    VAMP_LOG(WARNING) << "NCCL abort: cudaSetDevice(" << device
                      << ") failed: " << cudaGetErrorString(err);
  }
  if (ncclResult_t r = ncclCommAbort(comm); r != ncclSuccess) {
    VAMP_LOG(WARNING) << "ncclCommAbort failed: " << ncclGetErrorString(r);
  }
  if (had_device && previous != device) cudaSetDevice(previous);
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
  }
  return absl::InvalidArgumentError("NCCL all-reduce: unknown dtype");
}

}  // namespace

absl::StatusOr<std::string> NcclCommunicator::CreateUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclStatus(r, "ncclGetUniqueId", nullptr);
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    absl::string_view unique_id, const NcclCommunicatorOptions& options,
    const std::atomic<bool>* cancel) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("the NCCL unique id has ", unique_id.size(),
                                                   " bytes, expected ", NCCL_UNIQUE_ID_BYTES));
  }
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", options.rank, " is outside [0, size = ", options.size, ")"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator: CUDA device ", options.device, " is not an ordinal"));
  }
  if (options.init_timeout_ms <= 0 || options.enqueue_timeout_ms <= 0 ||
      options.watchdog_interval_ms < 0 || options.poll_interval_us <= 0) {
    return absl::InvalidArgumentError(
        "NCCL communicator: init_timeout_ms, enqueue_timeout_ms and poll_interval_us must be > 0 "
        "and watchdog_interval_ms >= 0");
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and enqueues return at once; this class polls their progress
  ncclComm_t comm = nullptr;
  const std::string what = absl::StrCat("NCCL communicator init (rank ", options.rank, " of ",
                                        options.size, " on cuda:", options.device, ")");
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    absl::Status s = NcclStatus(r, absl::StrCat(what, ": ncclCommInitRankConfig"), comm);
    if (comm != nullptr) AbortComm(comm, options.device);
    return s;
  }
  const auto deadline = Steady::now() + std::chrono::milliseconds(options.init_timeout_ms);
  while (true) {
    ncclResult_t state = ncclInProgress;
    r = ncclCommGetAsyncError(comm, &state);
    absl::Status failed;
    if (r != ncclSuccess) {
      failed = NcclStatus(r, absl::StrCat(what, ": ncclCommGetAsyncError"), comm);
    } else if (state == ncclSuccess) {
      break;
    } else if (state != ncclInProgress) {
      failed = NcclStatus(state, absl::StrCat(what, ": ncclCommInitRankConfig"), comm);
    } else if (cancel != nullptr && cancel->load()) {
      failed = absl::CancelledError(absl::StrCat(what, ": cancelled while waiting for the ranks"));
    } else if (Steady::now() >= deadline) {
      failed = absl::DeadlineExceededError(absl::StrCat(
          what, ": not every rank joined within ", options.init_timeout_ms, " ms (all ",
          options.size,
          " ranks must join with the same unique id while the process that created it runs)"));
    }
    if (!failed.ok()) {
      AbortComm(comm, options.device);
      return failed;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(options.poll_interval_us));
  }
  int count = 0;
  r = ncclCommCount(comm, &count);
  if (r != ncclSuccess || count != options.size) {
    absl::Status s =
        r != ncclSuccess
            ? NcclStatus(r, absl::StrCat(what, ": ncclCommCount"), comm)
            : absl::InternalError(absl::StrCat(what, ": the communicator has ", count, " ranks"));
    AbortComm(comm, options.device);
    return s;
  }
  VAMP_LOG(INFO) << "NCCL: rank " << options.rank << " of " << options.size
                 << " on cuda:" << options.device << " joined the group";
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, options));
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, NcclCommunicatorOptions options)
    : options_(std::move(options)), comm_(comm) {
  if (options_.watchdog_interval_ms > 0) watchdog_ = std::thread([this] { Watchdog(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  absl::MutexLock lock(&mu_);
  if (comm_ != nullptr) AbortComm(comm_, options_.device);
  comm_ = nullptr;
}

absl::Status NcclCommunicator::FailLocked(absl::Status status) {
  if (broken_.ok()) {
    broken_ = std::move(status);
    // An abort on request (shutdown, re-initialisation) is routine; anything else is a failure.
    if (absl::IsCancelled(broken_) || absl::IsAborted(broken_)) {
      VAMP_LOG(INFO) << "NCCL rank " << options_.rank << " of " << options_.size
                     << ": communicator aborted: " << broken_;
    } else {
      VAMP_LOG(ERROR) << "NCCL rank " << options_.rank << " of " << options_.size
                      << ": the group is broken: " << broken_;
    }
  }
  aborted_ = true;
  if (comm_ != nullptr) AbortComm(comm_, options_.device);
  comm_ = nullptr;
  return broken_;
}

absl::Status NcclCommunicator::AllReduceSum(void* data, int64_t count, DType dtype,
                                            cudaStream_t stream) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL all-reduce of ", count, " elements"));
  }
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError("NCCL all-reduce of a null buffer");
  }
  VAMP_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  if (count == 0) return absl::OkStatus();  // every rank skips it alike (same counts)
  const ncclResult_t r =
      ncclAllReduce(data, data, static_cast<size_t>(count), type, ncclSum, comm_, stream);
  if (r == ncclInProgress) return AwaitEnqueuedLocked("ncclAllReduce");
  if (r != ncclSuccess) return FailLocked(NcclStatus(r, "ncclAllReduce", comm_));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AwaitEnqueuedLocked(absl::string_view call) {
  const auto deadline = Steady::now() + std::chrono::milliseconds(options_.enqueue_timeout_ms);
  while (true) {
    if (aborted_) return broken_;
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return FailLocked(NcclStatus(r, "ncclCommGetAsyncError", comm_));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return FailLocked(NcclStatus(state, call, comm_));
    if (Steady::now() >= deadline) {
      return FailLocked(absl::DeadlineExceededError(
          absl::StrCat(call, ": not enqueued within ", options_.enqueue_timeout_ms,
                       " ms (a peer does not take part)")));
    }
    // Releases mu_ while waiting, so Abort() can break in.
    mu_.AwaitWithTimeout(absl::Condition(&aborted_), absl::Microseconds(options_.poll_interval_us));
  }
}

absl::Status NcclCommunicator::CheckLocked() {
  if (!broken_.ok()) return broken_;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return FailLocked(NcclStatus(r, "ncclCommGetAsyncError", comm_));
  // ncclInProgress: an operation is still being set up; not an error.
  if (state != ncclSuccess && state != ncclInProgress) {
    return FailLocked(NcclStatus(state, "NCCL (asynchronous error)", comm_));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Check() {
  absl::MutexLock lock(&mu_);
  return CheckLocked();
}

void NcclCommunicator::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("NCCL communicator aborted");
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  (void)FailLocked(std::move(reason));
}

void NcclCommunicator::Watchdog() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && !aborted_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_),
                         absl::Milliseconds(options_.watchdog_interval_ms));
    if (stop_ || aborted_) break;
    // An error aborts the communicator inside (kernels waiting for a failed peer return).
    (void)CheckLocked();
  }
}

}  // namespace vamp
