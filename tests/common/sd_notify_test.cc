#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

// A datagram socket standing in for systemd's notification socket.
class FakeServiceManager {
 public:
  explicit FakeServiceManager(bool abstract) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    name_ = abstract ? absl::StrCat("@vamp-sd-notify-test-", getpid())
                     : absl::StrCat("/tmp/vamp-sd-notify-test-", getpid());
    std::memcpy(addr.sun_path, name_.data(), name_.size());
    if (abstract) addr.sun_path[0] = '\0';
    if (!abstract) unlink(name_.c_str());
    const socklen_t len = offsetof(sockaddr_un, sun_path) + name_.size();
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
    timeval timeout{2, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setenv("NOTIFY_SOCKET", name_.c_str(), 1);
  }
  ~FakeServiceManager() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    if (name_[0] == '/') unlink(name_.c_str());
  }
  std::string Receive() {
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : std::string();
  }

 private:
  int fd_ = -1;
  std::string name_;
};

TEST(SdNotifyTest, NoSocketIsANoOp) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotify("READY=1").ok());
}

TEST(SdNotifyTest, SendsToAPathSocket) {
  FakeServiceManager manager(/*abstract=*/false);
  ASSERT_TRUE(SdNotify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(manager.Receive(), "READY=1\nSTATUS=serving");
}

TEST(SdNotifyTest, SendsToAnAbstractSocket) {
  FakeServiceManager manager(/*abstract=*/true);
  ASSERT_TRUE(SdNotify("WATCHDOG=1").ok());
  EXPECT_EQ(manager.Receive(), "WATCHDOG=1");
}

TEST(SdNotifyTest, RejectsARelativeSocketName) {
  setenv("NOTIFY_SOCKET", "relative/socket", 1);
  absl::Status s = SdNotify("READY=1");
  unsetenv("NOTIFY_SOCKET");
  EXPECT_THAT(s.message(), ::testing::HasSubstr("NOTIFY_SOCKET 'relative/socket'"));
}

TEST(SdNotifyTest, WatchdogIntervalIsHalfOfWatchdogUsecForThisProcess) {
  unsetenv("WATCHDOG_PID");
  unsetenv("WATCHDOG_USEC");
  EXPECT_EQ(SdWatchdogPingInterval(), absl::ZeroDuration());
  setenv("WATCHDOG_USEC", "30000000", 1);
  EXPECT_EQ(SdWatchdogPingInterval(), absl::Seconds(15));
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  EXPECT_EQ(SdWatchdogPingInterval(), absl::Seconds(15));
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);
  EXPECT_EQ(SdWatchdogPingInterval(), absl::ZeroDuration());
  unsetenv("WATCHDOG_PID");
  setenv("WATCHDOG_USEC", "garbage", 1);
  EXPECT_EQ(SdWatchdogPingInterval(), absl::ZeroDuration());
  unsetenv("WATCHDOG_USEC");
}

TEST(SdNotifyTest, ServeUntilSignalSendsReadyWatchdogAndStopping) {
  FakeServiceManager manager(/*abstract=*/true);
  setenv("WATCHDOG_USEC", "200000", 1);  // pings every 100 ms
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  int ticks = 0;
  std::string messages;
  // status() runs every tick: ready from the third on; a signal to ourselves ends the loop at the
  // eighth, after a few watchdog pings.
  const int got = ServeUntilSignal(
      signals, [&] { return ticks >= 3; },
      [&] {
        if (++ticks == 8) kill(getpid(), SIGUSR1);
        return ticks >= 3 ? std::string("serving") : std::string("starting");
      });
  unsetenv("WATCHDOG_USEC");
  EXPECT_EQ(got, SIGUSR1);
  for (std::string m = manager.Receive(); !m.empty(); m = manager.Receive()) {
    messages += m + "|";
    if (m.rfind("STOPPING=1", 0) == 0) break;
  }
  EXPECT_THAT(messages, ::testing::HasSubstr("STATUS=starting|"));
  EXPECT_THAT(messages, ::testing::HasSubstr("READY=1\nSTATUS=serving|"));
  EXPECT_THAT(messages, ::testing::HasSubstr("WATCHDOG=1|"));
  EXPECT_THAT(messages, ::testing::HasSubstr("STOPPING=1"));
  // READY=1 is sent once.
  EXPECT_EQ(messages.find("READY=1"), messages.rfind("READY=1"));
}

}  // namespace
}  // namespace vamp
