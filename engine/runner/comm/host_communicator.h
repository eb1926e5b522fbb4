// Tensor-parallel collectives between ranks that are threads of one process: the CPU engine's
// stand-in for NCCL, so TP=2 runs and is tested without GPUs.
//
// HostCommunicatorGroup::Create(n) makes n communicators, one per rank; each rank's thread calls
// the collectives on its own communicator in the same order. AllReduceSum adds the ranks'
// contributions in rank order (0, 1, ..., n-1) on every rank, so all ranks get bit-identical sums.
// Abort() fails every pending and future collective, so one failing rank cannot hang the others.
#ifndef VAMP_ENGINE_RUNNER_COMM_HOST_COMMUNICATOR_H_
#define VAMP_ENGINE_RUNNER_COMM_HOST_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/parallel.h"

namespace vamp {

class HostCommunicatorGroup {
 public:
  // InvalidArgument unless size >= 1.
  static absl::StatusOr<std::unique_ptr<HostCommunicatorGroup>> Create(int size);
  ~HostCommunicatorGroup();

  int size() const { return size_; }
  // Rank `rank`'s communicator (owned by the group).
  Communicator* rank(int rank);
  // Fails every collective from now on (and wakes those waiting) with `status`.
  void Abort(absl::Status status);

 private:
  class Rank;
  explicit HostCommunicatorGroup(int size);
  // Blocks until all ranks have arrived at this barrier generation; error when aborted.
  absl::Status Barrier();
  absl::Status AllReduceSum(int rank, float* data, int64_t count);

  const int size_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // Each rank's buffer of the collective in progress (published before the first barrier).
  std::vector<float*> buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_COMM_HOST_COMMUNICATOR_H_
