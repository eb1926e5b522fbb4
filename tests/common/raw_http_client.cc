#include "tests/common/raw_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace vamp::testing {

RawHttpClient::RawHttpClient(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

RawHttpClient::~RawHttpClient() { Close(); }

void RawHttpClient::Send(absl::string_view bytes) {
  if (fd_ >= 0) (void)send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

const std::string& RawHttpClient::ReadUntil(absl::string_view marker, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!absl::StrContains(data_, marker) && !eof_ && absl::Now() < deadline) Poll(deadline);
  return data_;
}

bool RawHttpClient::WaitClosed(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!eof_ && absl::Now() < deadline) Poll(deadline);
  return eof_;
}

void RawHttpClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void RawHttpClient::Poll(absl::Time deadline) {
  if (fd_ < 0) {
    eof_ = true;
    return;
  }
  pollfd p{fd_, POLLIN, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
  if (poll(&p, 1, std::max(ms, 0)) <= 0) return;
  char buf[65536];
  const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n <= 0) {
    eof_ = true;
    return;
  }
  data_.append(buf, static_cast<size_t>(n));
}

int64_t RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return static_cast<int64_t>(limit.rlim_cur);
}

}  // namespace vamp::testing
