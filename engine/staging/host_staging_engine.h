// Executes staging plans (staging_plan.h) on the CPU: a worker thread plays the GPU's copy stream,
// copying each planned job with memcpy as soon as its buffer's previous reader has released it,
// while the forward pass runs on the caller's thread.
//
// Per pass: BeginPass(jobs) -> for each staged layer in order: WaitCopied(i) before its MoE reads
// the buffer, Release(i) after -> EndPass(), which returns once no copy of the pass is running or
// will run (a pass that stops early, e.g. on an error, cancels the copies not started yet).
//
// Thread-safe: the worker and one caller thread; passes do not overlap.
#ifndef VAMP_ENGINE_STAGING_HOST_STAGING_ENGINE_H_
#define VAMP_ENGINE_STAGING_HOST_STAGING_ENGINE_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/staging/staging_plan.h"

namespace vamp {

struct StagingStats {
  int64_t passes = 0;
  int64_t copies = 0;
  uint64_t bytes = 0;
  // Time the worker spent copying, and time the forward pass spent in WaitCopied because a copy
  // was not done yet (the part of staging not hidden behind compute), microseconds.
  double copy_us = 0;
  double wait_us = 0;
  // Routed staging (devices that copy only the experts a pass routes to; 0 elsewhere): passes
  // that did, the bytes they copied (part of `bytes`), and the offloaded bytes of the layers they
  // served. routed_bytes / routed_region_bytes is the share of the region they copied.
  int64_t routed_passes = 0;
  uint64_t routed_bytes = 0;
  uint64_t routed_region_bytes = 0;
};

// What happened, in order, when event recording is on (tests check the schedule with it).
struct StagingEvent {
  enum class Kind { kCopyStart, kCopyDone, kRelease };
  Kind kind;
  int index;  // the job
};

class HostStagingEngine {
 public:
  struct Job {
    StagingCopy copy;
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
  };

  explicit HostStagingEngine(bool record_events = false);
  // Cancels an unfinished pass and joins the worker.
  ~HostStagingEngine();
  HostStagingEngine(const HostStagingEngine&) = delete;
  HostStagingEngine& operator=(const HostStagingEngine&) = delete;

  // Starts a pass. FailedPrecondition when one is active; InvalidArgument when a job's
  // after_release_of does not name an earlier job.
  absl::Status BeginPass(std::vector<Job> jobs);
  // Blocks until job `index` has been copied.
  absl::Status WaitCopied(int index);
  // The reader of job `index`'s buffer is done; the copy waiting for it may start.
  absl::Status Release(int index);
  // Ends the pass: releases every job not released yet, cancels copies not started, and waits
  // until the worker is idle.
  absl::Status EndPass();

  StagingStats stats() const;
  // The events recorded so far (empty unless recording); cleared by BeginPass.
  std::vector<StagingEvent> events() const;

 private:
  void WorkerLoop();
  void Record(StagingEvent::Kind kind, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool record_events_;
  mutable absl::Mutex mu_;
  bool active_ ABSL_GUARDED_BY(mu_) = false;     // a pass is between BeginPass and EndPass
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // EndPass before every copy ran
  bool stop_ ABSL_GUARDED_BY(mu_) = false;       // destructor
  std::vector<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> copied_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> released_ ABSL_GUARDED_BY(mu_);
  // Jobs the worker has finished with (copied or skipped) in this pass.
  size_t worker_done_ ABSL_GUARDED_BY(mu_) = 0;
  StagingStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<StagingEvent> events_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_STAGING_HOST_STAGING_ENGINE_H_
