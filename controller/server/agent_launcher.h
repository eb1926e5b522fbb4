// --spawn-agents N: runs N vamp-agent processes on this machine (ranks 0..N-1, loopback), restarts
// one that dies (the controller then re-initialises the group), and stops them all on exit. Each
// child also dies with the controller (PR_SET_PDEATHSIG), so no agent outlives it.
#ifndef VAMP_CONTROLLER_SERVER_AGENT_LAUNCHER_H_
#define VAMP_CONTROLLER_SERVER_AGENT_LAUNCHER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace vamp {

struct AgentLauncherOptions {
  std::string binary;  // path of vamp-agent
  int num_agents = 1;
  // Arguments for rank r: these, then "--rank r".
  std::vector<std::string> args;
  // Variables ("NAME=value") added to the agents' environment, replacing inherited ones of the
  // same name: how secrets reach them (argv is readable by every user of the machine, the
  // environment only by the same user).
  std::vector<std::string> env;
  // Wait before restarting an agent that exited (ms).
  int64_t restart_backoff_ms = 1000;
};

class AgentLauncher {
 public:
  static absl::StatusOr<std::unique_ptr<AgentLauncher>> Start(AgentLauncherOptions options);
  ~AgentLauncher();
  // SIGTERM to every agent, SIGKILL after `grace_ms`.
  void Stop(int64_t grace_ms = 5000);
  // SIGKILLs every agent (a frozen one too: SIGKILL ends a stopped process); the monitor
  // restarts them as it does any agent that exits.
  void KillAll();
  // Process ids by rank (0 while a rank is being restarted).
  std::vector<pid_t> pids() const;

  // The vamp-agent next to `self` (this executable): same folder, or ../agent/ in a build tree.
  static absl::StatusOr<std::string> FindAgentBinary(const std::string& self);

 private:
  explicit AgentLauncher(AgentLauncherOptions options) : options_(std::move(options)) {}
  absl::StatusOr<pid_t> Spawn(int rank);
  void Monitor();

  const AgentLauncherOptions options_;
  mutable absl::Mutex mu_;
  std::vector<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_AGENT_LAUNCHER_H_
