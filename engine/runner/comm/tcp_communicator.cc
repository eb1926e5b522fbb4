#include "engine/runner/comm/tcp_communicator.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/status_macros.h"

namespace vamp {
namespace {

constexpr uint32_t kHelloMagic = 0x56545031;  // "VTP1"
constexpr uint32_t kAckMagic = 0x56545041;    // "VTPA"
constexpr uint32_t kFrameMagic = 0x56545046;  // "VTPF"
// Tokens longer than this are refused (the handshake reads at most this many bytes).
constexpr uint32_t kMaxTokenBytes = 4096;
constexpr uint32_t kMaxMessageBytes = 4096;
// Slice of every wait, so cancellation and aborts are noticed promptly (ms).
constexpr int kPollSliceMs = 100;

struct Hello {
  uint32_t magic = kHelloMagic;
  int32_t size = 0;
  int32_t rank = 0;
  uint32_t token_bytes = 0;
  uint64_t fingerprint = 0;
};

struct Ack {
  uint32_t magic = kAckMagic;
  int32_t code = 0;  // absl::StatusCode; 0 = OK
  uint32_t message_bytes = 0;
  uint32_t reserved = 0;
};

struct Frame {
  uint32_t magic = kFrameMagic;
  uint32_t error = 0;  // 1: `count` bytes of error message follow instead of data
  uint64_t seq = 0;
  int64_t count = 0;
};

using Steady = std::chrono::steady_clock;

int64_t MillisLeft(Steady::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now()).count();
}

bool Cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

// Waits until `fd` is ready for `events`; DeadlineExceeded / Cancelled / Unavailable otherwise.
absl::Status WaitFd(int fd, short events, Steady::time_point deadline,
                    const std::atomic<bool>* cancel, absl::string_view what) {
  while (true) {
    if (Cancelled(cancel)) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    const int64_t left = MillisLeft(deadline);
    if (left <= 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kPollSliceMs)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat(what, ": poll: ", std::strerror(errno)));
    }
    if (n == 0) continue;
    if (p.revents & POLLNVAL) return absl::UnavailableError(absl::StrCat(what, ": socket closed"));
    return absl::OkStatus();  // readable/writable, or an error the next call reports
  }
}

absl::Status SendAll(int fd, const void* buf, size_t n, Steady::time_point deadline,
                     const std::atomic<bool>* cancel, absl::string_view what) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    VAMP_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, cancel, what));
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(
          absl::StrCat(what, ": connection lost (", std::strerror(errno), ")"));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* buf, size_t n, Steady::time_point deadline,
                     const std::atomic<bool>* cancel, absl::string_view what) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    VAMP_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, cancel, what));
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0)
      return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(
          absl::StrCat(what, ": connection lost (", std::strerror(errno), ")"));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.host_transport_address: cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  return result;
}

void SendAck(int fd, absl::Status status, Steady::time_point deadline) {
  Ack ack;
  ack.code = static_cast<int32_t>(status.code());
  const std::string message(status.message().substr(0, kMaxMessageBytes));
  ack.message_bytes = static_cast<uint32_t>(message.size());
  if (SendAll(fd, &ack, sizeof(ack), deadline, nullptr, "handshake").ok() && !message.empty()) {
    (void)SendAll(fd, message.data(), message.size(), deadline, nullptr, "handshake");
  }
}

// Rank 0: listens and collects one connection per peer rank.
absl::StatusOr<std::vector<int>> Listen(const TcpCommunicatorOptions& o, const std::string& host,
                                        int port, const std::atomic<bool>* cancel) {
  VAMP_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(host, port, /*passive=*/true));
  int listener = -1;
  std::string bind_error;
  for (addrinfo* a = ai; a != nullptr && listener < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, o.size) == 0) {
      listener = fd;
    } else {
      bind_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(ai);
  if (listener < 0) {
    return absl::UnavailableError(
        absl::StrCat("parallel.host_transport_address: rank 0 cannot "
                     "listen on '",
                     o.address, "': ", bind_error));
  }
  const auto deadline = Steady::now() + std::chrono::milliseconds(o.connect_timeout_ms);
  std::vector<int> fds(o.size, -1);
  int joined = 0;
  absl::Status failure;
  while (joined < o.size - 1) {
    absl::Status waited =
        WaitFd(listener, POLLIN, deadline, cancel, "waiting for tensor-parallel peers");
    if (!waited.ok()) {
      failure = absl::Status(waited.code(),
                             absl::StrCat(waited.message(), " (", joined, " of ", o.size - 1,
                                          " peer ranks connected to ", o.address, " within ",
                                          o.connect_timeout_ms, " ms)"));
      break;
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    SetNoDelay(fd);
    // A peer that connects says hello at once; a stranger gets a short wait.
    const auto hello_deadline =
        std::min(deadline, Steady::now() + std::chrono::milliseconds(10000));
    Hello hello;
    std::string token;
    absl::Status s = RecvAll(fd, &hello, sizeof(hello), hello_deadline, cancel, "handshake");
    if (s.ok() && (hello.magic != kHelloMagic || hello.token_bytes > kMaxTokenBytes)) {
      s = absl::InvalidArgumentError("not a VAMP tensor-parallel peer");
    }
    if (s.ok() && hello.token_bytes > 0) {
      token.resize(hello.token_bytes);
      s = RecvAll(fd, token.data(), token.size(), hello_deadline, cancel, "handshake");
    }
    if (!s.ok()) {
      VAMP_LOG(WARNING) << "tensor-parallel listener " << o.address
                        << ": dropping a connection: " << s.message();
      ::close(fd);
      continue;
    }
    if (!SecretEquals(token, o.auth_token)) {
      failure = absl::PermissionDeniedError(absl::StrCat(
          "tensor-parallel peer claiming rank ", hello.rank, " presented a wrong auth token"));
    } else if (hello.size != o.size) {
      failure = absl::FailedPreconditionError(absl::StrCat("tensor-parallel peer rank ", hello.rank,
                                                           " has parallel.tp_size ", hello.size,
                                                           ", rank 0 has ", o.size));
    } else if (hello.rank < 1 || hello.rank >= o.size) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "tensor-parallel peer claims rank ", hello.rank, " outside [1, ", o.size, ")"));
    } else if (hello.fingerprint != o.group_fingerprint) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "tensor-parallel rank ", hello.rank,
          " was initialised with a different InitRequest than rank 0 (model, load format, "
          "dtype, memory spec or tp_size differ)"));
    }
    if (!failure.ok()) {
      SendAck(fd, failure, hello_deadline);
      ::close(fd);
      break;
    }
    if (fds[hello.rank] >= 0) {
      // The rank connected again (it retried its Init): the newer connection is the live one.
      VAMP_LOG(WARNING) << "tensor-parallel rank " << hello.rank
                        << " connected again; replacing its earlier connection";
      ::close(fds[hello.rank]);
      --joined;
    }
    fds[hello.rank] = fd;
    ++joined;
  }
  ::close(listener);
  if (failure.ok()) {
    for (int r = 1; r < o.size; ++r) {
      SendAck(fds[r], absl::OkStatus(), deadline + std::chrono::milliseconds(o.io_timeout_ms));
    }
    return fds;
  }
  for (int fd : fds) {
    if (fd >= 0) {
      SendAck(fd, failure, Steady::now() + std::chrono::milliseconds(1000));
      ::close(fd);
    }
  }
  return failure;
}

// One non-blocking connect attempt with a deadline; the fd or an error.
absl::StatusOr<int> ConnectOnce(const addrinfo* a, Steady::time_point deadline,
                                const std::atomic<bool>* cancel) {
  const int fd =
      ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) return absl::UnavailableError(std::strerror(errno));
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(std::strerror(err));
  }
  absl::Status s = WaitFd(fd, POLLOUT, deadline, cancel, "connect");
  int err = 0;
  socklen_t len = sizeof(err);
  if (s.ok() && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
    s = absl::UnavailableError(std::strerror(err));
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  SetNoDelay(fd);
  return fd;
}

// Ranks > 0: connect to rank 0 (retrying until it listens) and complete the handshake.
absl::StatusOr<int> Join(const TcpCommunicatorOptions& o, const std::string& host, int port,
                         const std::atomic<bool>* cancel) {
  const auto deadline = Steady::now() + std::chrono::milliseconds(o.connect_timeout_ms);
  std::string last_error = "no attempt";
  int fd = -1;
  while (fd < 0) {
    if (Cancelled(cancel)) return absl::CancelledError("connecting to tensor-parallel rank 0");
    if (MillisLeft(deadline) <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("tensor-parallel rank ", o.rank, " could not reach rank 0 at ", o.address,
                       " within ", o.connect_timeout_ms, " ms: ", last_error));
    }
    VAMP_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(host, port, /*passive=*/false));
    for (addrinfo* a = ai; a != nullptr && fd < 0; a = a->ai_next) {
      auto attempt = ConnectOnce(
          a, std::min(deadline, Steady::now() + std::chrono::milliseconds(1000)), cancel);
      if (attempt.ok()) {
        fd = *attempt;
      } else {
        last_error = std::string(attempt.status().message());
      }
    }
    ::freeaddrinfo(ai);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(kPollSliceMs));
  }
  Hello hello;
  hello.size = o.size;
  hello.rank = o.rank;
  hello.fingerprint = o.group_fingerprint;
  hello.token_bytes = static_cast<uint32_t>(o.auth_token.size());
  absl::Status s = SendAll(fd, &hello, sizeof(hello), deadline, cancel, "handshake");
  if (s.ok() && !o.auth_token.empty()) {
    s = SendAll(fd, o.auth_token.data(), o.auth_token.size(), deadline, cancel, "handshake");
  }
  // Rank 0 answers once every rank has joined.
  Ack ack;
  if (s.ok()) s = RecvAll(fd, &ack, sizeof(ack), deadline, cancel, "waiting for rank 0's answer");
  if (s.ok() && (ack.magic != kAckMagic || ack.message_bytes > kMaxMessageBytes)) {
    s = absl::FailedPreconditionError(
        absl::StrCat(o.address, " is not a VAMP tensor-parallel rank 0"));
  }
  if (s.ok() && ack.code != 0) {
    std::string message(ack.message_bytes, '\0');
    (void)RecvAll(fd, message.data(), message.size(), deadline, cancel, "handshake");
    s = absl::Status(static_cast<absl::StatusCode>(ack.code),
                     absl::StrCat("rank 0 refused rank ", o.rank, ": ", message));
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  return fd;
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, const std::string& field, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " '", address, "' is not host:port"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", address, "' has no valid port (0..65535)"));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Connect(
    const TcpCommunicatorOptions& options, const std::atomic<bool>* cancel) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: tp_rank ", options.rank, " must be in [0, tp_size = ", options.size, ")"));
  }
  if (options.auth_token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError("the auth token is longer than 4096 bytes");
  }
  if (options.size == 1) {
    return std::unique_ptr<TcpCommunicator>(
        new TcpCommunicator(0, 1, options.io_timeout_ms, std::vector<int>{-1}));
  }
  std::string host;
  int port = 0;
  VAMP_RETURN_IF_ERROR(
      SplitHostPort(options.address, "parallel.host_transport_address", &host, &port));
  if (port == 0) {
    return absl::InvalidArgumentError(
        "parallel.host_transport_address needs a fixed port: the other ranks must know it");
  }
  if (options.rank == 0) {
    VAMP_ASSIGN_OR_RETURN(std::vector<int> fds, Listen(options, host, port, cancel));
    return std::unique_ptr<TcpCommunicator>(
        new TcpCommunicator(0, options.size, options.io_timeout_ms, std::move(fds)));
  }
  VAMP_ASSIGN_OR_RETURN(int fd, Join(options, host, port, cancel));
  return std::unique_ptr<TcpCommunicator>(
      new TcpCommunicator(options.rank, options.size, options.io_timeout_ms, {fd}));
}

TcpCommunicator::TcpCommunicator(int rank, int size, int64_t io_timeout_ms, std::vector<int> fds)
    : rank_(rank), size_(size), io_timeout_ms_(io_timeout_ms), fds_(std::move(fds)) {}

TcpCommunicator::~TcpCommunicator() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpCommunicator::Abort(absl::Status status) {
  {
    absl::MutexLock lock(&state_mu_);
    if (!broken_.ok()) return;
    broken_ = status.ok() ? absl::AbortedError("tensor-parallel communicator aborted")
                          : std::move(status);
  }
  // Wakes a collective blocked in poll; the fds stay open (closed by the destructor) so no other
  // socket can reuse their numbers while a collective may still touch them.
  for (int fd : fds_) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

absl::Status TcpCommunicator::Fail(absl::Status status) {
  absl::Status result;
  {
    absl::MutexLock lock(&state_mu_);
    // An abort explains the failure better than the broken pipe it caused.
    if (broken_.ok()) broken_ = std::move(status);
    result = broken_;
  }
  // Closing our side makes every peer still waiting on us fail now rather than at its timeout.
  for (int fd : fds_) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
  return result;
}

absl::Status TcpCommunicator::AllReduceSum(float* data, int64_t count) {
  if (size_ == 1) return absl::OkStatus();
  absl::MutexLock lock(&call_mu_);
  {
    absl::MutexLock state(&state_mu_);
    if (!broken_.ok()) return broken_;
  }
  if (count < 0) return Fail(absl::InvalidArgumentError("all-reduce of a negative count"));
  const uint64_t seq = ++seq_;
  absl::Status s = rank_ == 0 ? AllReduceRoot(data, count, seq) : AllReducePeer(data, count, seq);
  if (!s.ok()) return Fail(std::move(s));
  return absl::OkStatus();
}

absl::Status TcpCommunicator::AllReduceRoot(float* data, int64_t count, uint64_t seq) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  scratch_.resize(static_cast<size_t>(count));
  auto deadline = [&] { return Steady::now() + std::chrono::milliseconds(io_timeout_ms_); };
  absl::Status mismatch;
  for (int r = 1; r < size_ && mismatch.ok(); ++r) {
    const std::string what = absl::StrCat("all-reduce #", seq, " from rank ", r);
    Frame f;
    VAMP_RETURN_IF_ERROR(RecvAll(fds_[r], &f, sizeof(f), deadline(), nullptr, what));
    if (f.magic != kFrameMagic || f.error != 0 || f.seq != seq || f.count != count) {
      mismatch = absl::InternalError(
          absl::StrCat("all-reduce mismatch: rank ", r, " sent collective #", f.seq, " of ",
                       f.count, " elements, rank 0 is at collective #", seq, " of ", count,
                       " elements (the ranks ran different steps)"));
      break;
    }
    VAMP_RETURN_IF_ERROR(RecvAll(fds_[r], scratch_.data(), bytes, deadline(), nullptr, what));
    // Rank order, as HostCommunicatorGroup: ((d0 + d1) + d2) + ...
    for (int64_t i = 0; i < count; ++i) data[i] += scratch_[i];
  }
  if (!mismatch.ok()) {
    const std::string message(mismatch.message());
    Frame f;
    f.error = 1;
    f.seq = seq;
    f.count = static_cast<int64_t>(message.size());
    for (int r = 1; r < size_; ++r) {
      const auto d = Steady::now() + std::chrono::milliseconds(1000);
      if (SendAll(fds_[r], &f, sizeof(f), d, nullptr, "error").ok()) {
        (void)SendAll(fds_[r], message.data(), message.size(), d, nullptr, "error");
      }
    }
    return mismatch;
  }
  Frame f;
  f.seq = seq;
  f.count = count;
  for (int r = 1; r < size_; ++r) {
    const std::string what = absl::StrCat("all-reduce #", seq, " to rank ", r);
    VAMP_RETURN_IF_ERROR(SendAll(fds_[r], &f, sizeof(f), deadline(), nullptr, what));
    VAMP_RETURN_IF_ERROR(SendAll(fds_[r], data, bytes, deadline(), nullptr, what));
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::AllReducePeer(float* data, int64_t count, uint64_t seq) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  const int fd = fds_[0];
  auto deadline = [&] { return Steady::now() + std::chrono::milliseconds(io_timeout_ms_); };
  const std::string what = absl::StrCat("all-reduce #", seq, " with rank 0");
  Frame f;
  f.seq = seq;
  f.count = count;
  VAMP_RETURN_IF_ERROR(SendAll(fd, &f, sizeof(f), deadline(), nullptr, what));
  VAMP_RETURN_IF_ERROR(SendAll(fd, data, bytes, deadline(), nullptr, what));
  Frame reply;
  VAMP_RETURN_IF_ERROR(RecvAll(fd, &reply, sizeof(reply), deadline(), nullptr, what));
  if (reply.magic != kFrameMagic) {
    return absl::InternalError(absl::StrCat(what, ": malformed answer"));
  }
  if (reply.error != 0) {
    std::string message(static_cast<size_t>(std::min<int64_t>(reply.count, kMaxMessageBytes)),
                        '\0');
    (void)RecvAll(fd, message.data(), message.size(), deadline(), nullptr, what);
    return absl::InternalError(absl::StrCat("rank 0: ", message));
  }
  if (reply.seq != seq || reply.count != count) {
    return absl::InternalError(absl::StrCat("all-reduce mismatch: rank 0 answered collective #",
                                            reply.seq, " of ", reply.count, " elements to rank ",
                                            rank_, "'s #", seq, " of ", count));
  }
  return RecvAll(fd, data, bytes, deadline(), nullptr, what);
}

}  // namespace vamp
