// systemd integration without linking libsystemd: the sd_notify datagram protocol (READY=1,
// STATUS=..., WATCHDOG=1, STOPPING=1 sent to the socket in $NOTIFY_SOCKET) and the watchdog
// interval from $WATCHDOG_USEC. The protocol is a few lines and is specified as a stable
// interface (sd_notify(3), "Interface Portability and Stability"), so implementing it here keeps
// the build free of an optional dependency and the binaries portable to hosts and containers
// without libsystemd. Outside systemd (no NOTIFY_SOCKET) everything here is a no-op.
#ifndef VAMP_COMMON_SD_NOTIFY_H_
#define VAMP_COMMON_SD_NOTIFY_H_

#include <signal.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vamp {

// Sends `state` (newline-separated VAR=value assignments) to $NOTIFY_SOCKET. OK without doing
// anything when the variable is unset; an error when it is set but the datagram cannot be sent.
absl::Status SdNotify(absl::string_view state);

// How often to send WATCHDOG=1: half of $WATCHDOG_USEC when the service manager enabled the
// watchdog for this process ($WATCHDOG_PID unset or equal to getpid()), else zero.
absl::Duration SdWatchdogPingInterval();

// The main loop of a daemon whose threads all block `signals`: waits for one of them and returns
// it. Meanwhile sends READY=1 (with STATUS=status()) the first time `ready()` is true, STATUS=
// whenever status() changes, and WATCHDOG=1 at SdWatchdogPingInterval(). The watchdog is fed from
// here so that a wedged main loop stops the pings; STOPPING=1 is sent before returning.
int ServeUntilSignal(const sigset_t& signals, const std::function<bool()>& ready,
                     const std::function<std::string()>& status);

}  // namespace vamp

#endif  // VAMP_COMMON_SD_NOTIFY_H_
