// A loopback TCP port for tests that listen on a fixed address.
#ifndef VAMP_TESTS_COMMON_FREE_PORT_H_
#define VAMP_TESTS_COMMON_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace vamp::testing {

// A TCP port that was free a moment ago (for parallel.host_transport_address).
inline int PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace vamp::testing

#endif  // VAMP_TESTS_COMMON_FREE_PORT_H_
