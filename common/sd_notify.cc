#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace vamp {

absl::Status SdNotify(absl::string_view state) {
  const char* socket_path = std::getenv("NOTIFY_SOCKET");
  if (socket_path == nullptr || socket_path[0] == '\0') return absl::OkStatus();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(socket_path);
  // '@' names a socket in the abstract namespace (a leading NUL byte); otherwise a path.
  if ((socket_path[0] != '/' && socket_path[0] != '@') || len >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET '", socket_path, "' is not an absolute path or @name"));
  }
  std::memcpy(addr.sun_path, socket_path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Never block: a manager that does not read (a full queue) must not stall the caller's main
  // loop; a lost WATCHDOG=1 is retried at the next ping.
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                                reinterpret_cast<const sockaddr*>(&addr), addr_len);
  const int error = errno;
  ::close(fd);
  if (sent != static_cast<ssize_t>(state.size())) {
    return absl::UnavailableError(
        absl::StrCat("cannot notify the service manager at '", socket_path,
                     "': ", sent < 0 ? std::strerror(error) : "short write"));
  }
  return absl::OkStatus();
}

absl::Duration SdWatchdogPingInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  int64_t micros = 0;
  if (usec == nullptr || !absl::SimpleAtoi(usec, &micros) || micros <= 0) {
    return absl::ZeroDuration();
  }
  // The watchdog may be meant for another process of the service (e.g. the one that forked us).
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && pid[0] != '\0') {
    int64_t target = 0;
    if (!absl::SimpleAtoi(pid, &target) || target != ::getpid()) return absl::ZeroDuration();
  }
  return absl::Microseconds(micros) / 2;
}

int ServeUntilSignal(const sigset_t& signals, const std::function<bool()>& ready,
                     const std::function<std::string()>& status) {
  const absl::Duration ping = SdWatchdogPingInterval();
  // Readiness and status are polled; half a second is quick enough for start-up ordering.
  const absl::Duration tick = ping > absl::ZeroDuration() ? std::min(ping, absl::Milliseconds(500))
                                                          : absl::Milliseconds(500);
  const timespec timeout = absl::ToTimespec(tick);
  bool ready_sent = false;
  std::string last_status;
  absl::Time next_ping = absl::Now();
  auto notify = [](absl::string_view state) {
    if (absl::Status s = SdNotify(state); !s.ok()) VAMP_LOG(WARNING) << s.message();
  };
  while (true) {
    const int signal_number = sigtimedwait(&signals, nullptr, &timeout);
    if (signal_number > 0) {
      notify(absl::StrCat("STOPPING=1\nSTATUS=stopping on signal ", signal_number));
      return signal_number;
    }
    std::string now_status = status ? status() : std::string();
    if (!ready_sent && ready()) {
      notify(absl::StrCat("READY=1\nSTATUS=", now_status));
      ready_sent = true;
      last_status = now_status;
    } else if (now_status != last_status) {
      notify(absl::StrCat("STATUS=", now_status));
      last_status = now_status;
    }
    if (ping > absl::ZeroDuration() && absl::Now() >= next_ping) {
      notify("WATCHDOG=1");
      next_ping = absl::Now() + ping;
    }
  }
}

}  // namespace vamp
