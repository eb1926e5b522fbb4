#include "engine/staging/host_staging_engine.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace vamp {

HostStagingEngine::HostStagingEngine(bool record_events)
    : record_events_(record_events), worker_([this] { WorkerLoop(); }) {}

HostStagingEngine::~HostStagingEngine() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cancelled_ = true;
  }
  worker_.join();
}

void HostStagingEngine::Record(StagingEvent::Kind kind, int index) {
  if (record_events_) events_.push_back({kind, index});
}

absl::Status HostStagingEngine::BeginPass(std::vector<Job> jobs) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int after = jobs[i].copy.after_release_of;
    if (after >= static_cast<int>(i) || after < -1) {
      return absl::InvalidArgumentError(absl::StrCat("staging job ", i, " waits for job ", after,
                                                     ", which is not an earlier job"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (active_) return absl::FailedPreconditionError("a staging pass is already active");
  active_ = true;
  cancelled_ = false;
  jobs_ = std::move(jobs);
  copied_.assign(jobs_.size(), false);
  released_.assign(jobs_.size(), false);
  worker_done_ = 0;
  events_.clear();
  ++stats_.passes;
  return absl::OkStatus();
}

absl::Status HostStagingEngine::WaitCopied(int index) {
  const auto start = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  if (!active_ || index < 0 || index >= static_cast<int>(jobs_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("no staging job ", index, " in flight"));
  }
  if (copied_[index]) return absl::OkStatus();
  auto ready = [this, index]()
                   ABSL_SHARED_LOCKS_REQUIRED(mu_) { return copied_[index] || cancelled_; };
  mu_.Await(absl::Condition(&ready));
  if (!copied_[index]) return absl::CancelledError("staging pass cancelled");
  stats_.wait_us += MicrosSince(start);
  return absl::OkStatus();
}

absl::Status HostStagingEngine::Release(int index) {
  absl::MutexLock lock(&mu_);
  if (!active_ || index < 0 || index >= static_cast<int>(jobs_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("no staging job ", index, " in flight"));
  }
  if (!copied_[index]) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging job ", index, " released before it was copied"));
  }
  if (!released_[index]) {
    released_[index] = true;
    Record(StagingEvent::Kind::kRelease, index);
  }
  return absl::OkStatus();
}

absl::Status HostStagingEngine::EndPass() {
  absl::MutexLock lock(&mu_);
  if (!active_) return absl::FailedPreconditionError("no staging pass is active");
  // Copies that have not started are cancelled; one that is running finishes first.
  if (worker_done_ < jobs_.size()) cancelled_ = true;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return worker_done_ == jobs_.size(); };
  mu_.Await(absl::Condition(&idle));
  active_ = false;
  return absl::OkStatus();
}

void HostStagingEngine::WorkerLoop() {
  mu_.Lock();
  for (;;) {
    // Next job: the first not done, once its buffer's previous reader has released it.
    auto runnable = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      if (stop_) return true;
      if (!active_ || worker_done_ >= jobs_.size()) return false;
      if (cancelled_) return true;
      const int after = jobs_[worker_done_].copy.after_release_of;
      return after < 0 || released_[after];
    };
    mu_.Await(absl::Condition(&runnable));
    if (stop_) break;
    const size_t index = worker_done_;
    if (cancelled_) {
      worker_done_ = jobs_.size();  // skip the rest of the pass
      continue;
    }
    const Job job = jobs_[index];
    Record(StagingEvent::Kind::kCopyStart, static_cast<int>(index));
    mu_.Unlock();
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(job.dst, job.src, job.bytes);
    const double us = MicrosSince(start);
    mu_.Lock();
    copied_[index] = true;
    ++worker_done_;
    ++stats_.copies;
    stats_.bytes += job.bytes;
    stats_.copy_us += us;
    Record(StagingEvent::Kind::kCopyDone, static_cast<int>(index));
  }
  mu_.Unlock();
}

StagingStats HostStagingEngine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<StagingEvent> HostStagingEngine::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

}  // namespace vamp
