// Tensor-parallel collectives between CPU agents that are separate processes: the Communicator of
// engine/model/parallel.h over TCP (loopback in tests and local runs, any reachable host
// otherwise). CUDA agents all-reduce on the device instead (nccl_communicator.h).
//
// Topology: a star around rank 0. Rank 0 listens on `address` (ParallelSpec.host_transport_address)
// and accepts one connection from every other rank; the others connect (retrying until rank 0
// listens). Each connection starts with a handshake carrying the group size, the rank, a
// fingerprint of the InitRequest every rank was initialised with and the shared auth token, so a
// rank of another group, a mismatched Init or a stranger is refused with an error naming what
// differs.
//
// AllReduceSum: every rank > 0 sends its buffer to rank 0; rank 0 adds the contributions in rank
// order (0, 1, ..., n-1, the order of HostCommunicatorGroup) and sends the sum back, so every rank
// receives bit-identical sums. Every message carries the collective's sequence number and element
// count; a mismatch (ranks disagreeing on the order of collectives) fails the collective on every
// rank instead of silently mixing data.
//
// Failures never hang: a peer that closes its connection fails the collective at once, a peer that
// does not answer within io_timeout_ms fails it after that time, and Abort() (from any thread)
// fails a collective in progress immediately. After any failure the communicator is broken: it
// shuts its connections down (so the other ranks fail at once too) and every later call returns
// the first error (the group must be rebuilt, which the agent does on Init).
#ifndef VAMP_ENGINE_RUNNER_COMM_TCP_COMMUNICATOR_H_
#define VAMP_ENGINE_RUNNER_COMM_TCP_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/parallel.h"

namespace vamp {

struct TcpCommunicatorOptions {
  int rank = 0;
  int size = 1;
  // "host:port" of rank 0's listener (IPv4, IPv6 in brackets, or a host name).
  std::string address;
  // How long rank 0 waits for every peer, and the others keep retrying to reach rank 0 (ms).
  int64_t connect_timeout_ms = 120000;
  // How long one send or receive of a collective may wait for a peer (ms). A collective waits for
  // the slowest rank's compute of one layer, so this bounds a stuck peer, not a slow step.
  int64_t io_timeout_ms = 120000;
  // Identifies the group: every rank must present the same value (the agent uses a fingerprint of
  // the InitRequest without the rank).
  uint64_t group_fingerprint = 0;
  // Shared secret every rank presents (empty = none). Never logged.
  std::string auth_token;
};

class TcpCommunicator final : public Communicator {
 public:
  // Establishes the group (see the header comment). `cancel`, when given, is polled while waiting
  // for peers: setting it makes Connect return Cancelled promptly. InvalidArgument for a bad rank,
  // size or address; DeadlineExceeded when the peers do not all arrive in time; PermissionDenied or
  // FailedPrecondition when a peer's handshake does not match.
  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Connect(
      const TcpCommunicatorOptions& options, const std::atomic<bool>* cancel = nullptr);
  ~TcpCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;

  // Fails the collective in progress (if any) and every later one with `status`. Thread-safe.
  void Abort(absl::Status status);

 private:
  TcpCommunicator(int rank, int size, int64_t io_timeout_ms, std::vector<int> fds);
  absl::Status Fail(absl::Status status);
  absl::Status AllReduceRoot(float* data, int64_t count, uint64_t seq);
  absl::Status AllReducePeer(float* data, int64_t count, uint64_t seq);

  const int rank_;
  const int size_;
  const int64_t io_timeout_ms_;
  // Rank 0: fds_[r] is the connection to rank r (fds_[0] = -1). Others: fds_[0] is rank 0.
  // Fixed after construction; closed only in the destructor (Abort shuts them down).
  const std::vector<int> fds_;

  // Serialises collectives (the interface has one caller at a time; this makes misuse safe).
  absl::Mutex call_mu_;
  uint64_t seq_ ABSL_GUARDED_BY(call_mu_) = 0;
  std::vector<float> scratch_ ABSL_GUARDED_BY(call_mu_);

  absl::Mutex state_mu_;
  absl::Status broken_ ABSL_GUARDED_BY(state_mu_);
};

// Splits "host:port" ("[v6]:port" for IPv6). InvalidArgument naming `field` when malformed.
absl::Status SplitHostPort(const std::string& address, const std::string& field, std::string* host,
                           int* port);

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_COMM_TCP_COMMUNICATOR_H_
