// The tensor-parallel all-reduce between CUDA agents (one process per GPU): DeviceAllReduce over an
// NCCL communicator.
//
// Rendezvous: one process calls CreateUniqueId (ncclGetUniqueId) and hands the 128 bytes to every
// rank (the controller gets them from rank 0's agent and puts them in every rank's InitRequest,
// proto/vamp/v1/agent.proto). That process hosts NCCL's bootstrap root, a thread that waits for
// the ranks to connect: it must stay alive until they have joined. An id serves one
// initialisation: a group formed again needs a fresh one.
//
// Never hangs without bound:
//   - Create makes a non-blocking communicator (ncclConfig_t.blocking = 0) and polls its state
//     until it is ready, the init timeout passes (DeadlineExceeded naming the ranks expected: a
//     peer never joined) or `cancel` is set (Cancelled); then the communicator is aborted.
//   - An all-reduce that NCCL cannot enqueue at once (ncclInProgress: e.g. the first use of a
//     connection) is polled until enqueued, for at most enqueue_timeout_ms.
//   - A watchdog thread polls NCCL's asynchronous error (a peer's connection failed, ...) and, on
//     an error, aborts the communicator, so kernels waiting for the failed peer return and the
//     next call reports the error. Abort() does the same on demand, from any thread (the agent's
//     shutdown, or a re-initialisation that must not wait for a step stuck on a dead peer).
// After any failure the communicator is broken: every later call returns the first error; the
// group must be formed again (a new unique id, new communicators on every rank).
//
// A collective that a live but silent peer never joins (a peer whose kernels stopped without an
// NCCL error) blocks the stream; the caller's step timeout notices, and Abort() releases it.
#ifndef VAMP_ENGINE_RUNNER_COMM_NCCL_COMMUNICATOR_H_
#define VAMP_ENGINE_RUNNER_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/dtype.h"
#include "engine/runner/cuda/device_all_reduce.h"

// nccl.h's communicator handle (ncclComm_t), kept out of this header so that its users do not need
// NCCL's include folder.
struct ncclComm;

namespace vamp {

struct NcclCommunicatorOptions {
  int rank = 0;
  int size = 1;
  // CUDA device ordinal of this rank (the device its buffers and streams are on).
  int device = 0;
  // How long Create waits for every rank to join (ms).
  int64_t init_timeout_ms = 120000;
  // How long an all-reduce that NCCL reports in progress may take to be enqueued (ms).
  int64_t enqueue_timeout_ms = 120000;
  // How often the watchdog polls NCCL's asynchronous error (ms); 0 = no watchdog (errors then
  // surface only through Check() and later calls).
  int64_t watchdog_interval_ms = 100;
  // How long Create and the enqueue wait sleep between two polls (µs).
  int64_t poll_interval_us = 200;
};

class NcclCommunicator final : public DeviceAllReduce {
 public:
  // The size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
  static constexpr int kUniqueIdBytes = 128;

  // A fresh NCCL unique id (kUniqueIdBytes bytes). The calling process hosts the bootstrap root
  // until the ranks have joined (see the header comment). Needs no CUDA device.
  static absl::StatusOr<std::string> CreateUniqueId();

  // Joins the group of `unique_id` as options.rank of options.size on options.device; returns
  // when every rank has joined. InvalidArgument for an id that is not kUniqueIdBytes bytes, or a
  // bad rank, size or device; DeadlineExceeded when not every rank joined within
  // init_timeout_ms; Cancelled when `cancel` (polled while waiting) becomes true; the NCCL error
  // otherwise. Leaves options.device current on the calling thread.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      absl::string_view unique_id, const NcclCommunicatorOptions& options,
      const std::atomic<bool>* cancel = nullptr);
  // Aborts the communicator (ncclCommAbort: it never waits for peers).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  int device() const { return options_.device; }

  // ncclAllReduce (in place, ncclSum) of data[0, count) on `stream` (of this communicator's
  // device). float32 and bfloat16. Fails without enqueuing once the communicator is broken.
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype, cudaStream_t stream) override;
  // OK while healthy; the first error once broken (an asynchronous NCCL error breaks it).
  absl::Status Check() override;
  // Breaks the communicator with `reason` (kept unless it is already broken) and aborts it:
  // kernels of a collective in progress return, and every later call fails. Thread-safe,
  // idempotent.
  void Abort(absl::Status reason);

 private:
  NcclCommunicator(ncclComm* comm, NcclCommunicatorOptions options);
  // Breaks the communicator with `status` (the first error is kept), aborts it, and returns the
  // first error.
  absl::Status FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the asynchronous state after an enqueue that returned ncclInProgress.
  absl::Status AwaitEnqueuedLocked(absl::string_view call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watchdog();

  const NcclCommunicatorOptions options_;

  absl::Mutex mu_;
  // Null once aborted (then `aborted_` is true and `broken_` holds the reason).
  ncclComm* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // the watchdog's stop signal
  std::thread watchdog_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_COMM_NCCL_COMMUNICATOR_H_
