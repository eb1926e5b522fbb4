#include "controller/server/agent_launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"

namespace vamp {

absl::StatusOr<std::string> AgentLauncher::FindAgentBinary(const std::string& self) {
  // `self` may be a link such as /proc/self/exe: look beside what it points to.
  std::error_code ec;
  std::filesystem::path resolved = std::filesystem::canonical(self, ec);
  if (ec) resolved = self;
  const std::filesystem::path dir = resolved.parent_path();
  for (const auto& candidate : {dir / "vamp-agent", dir / ".." / "agent" / "vamp-agent"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate.lexically_normal().string();
  }
  return absl::NotFoundError(absl::StrCat("no vamp-agent next to ", self,
                                          " (looked in its folder and ../agent/); build it or "
                                          "pass --agent_binary"));
}

absl::StatusOr<std::unique_ptr<AgentLauncher>> AgentLauncher::Start(AgentLauncherOptions options) {
  if (access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("agent_binary '", options.binary, "' is not an executable"));
  }
  std::unique_ptr<AgentLauncher> launcher(new AgentLauncher(std::move(options)));
  {
    absl::MutexLock lock(&launcher->mu_);
    launcher->pids_.assign(launcher->options_.num_agents, 0);
  }
  for (int r = 0; r < launcher->options_.num_agents; ++r) {
    absl::StatusOr<pid_t> pid = launcher->Spawn(r);
    if (!pid.ok()) {
      launcher->Stop(0);
      return pid.status();
    }
    absl::MutexLock lock(&launcher->mu_);
    launcher->pids_[r] = *pid;
  }
  launcher->monitor_ = std::thread([l = launcher.get()] { l->Monitor(); });
  return launcher;
}

absl::StatusOr<pid_t> AgentLauncher::Spawn(int rank) {
  std::vector<std::string> args = {options_.binary};
  args.insert(args.end(), options_.args.begin(), options_.args.end());
  args.push_back("--rank");
  args.push_back(std::to_string(rank));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The controller's environment minus systemd's notification variables: they address the
  // controller (the unit's main process), and the service manager rejects, and logs, every
  // message a child sends there. Built before fork: the child may only call exec.
  std::vector<std::string> env_strings;
  auto replaced = [this](absl::string_view entry) {
    for (const std::string& e : options_.env) {
      if (absl::StartsWith(entry, e.substr(0, e.find('=') + 1))) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    if (absl::StartsWith(entry, "NOTIFY_SOCKET=") || absl::StartsWith(entry, "WATCHDOG_USEC=") ||
        absl::StartsWith(entry, "WATCHDOG_PID=") || replaced(entry)) {
      continue;
    }
    env_strings.emplace_back(entry);
  }
  env_strings.insert(env_strings.end(), options_.env.begin(), options_.env.end());
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // The child: die with the controller, and get default signal handling back.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  VAMP_LOG(INFO) << "spawned agent rank " << rank << " (pid " << pid << ")";
  return pid;
}

void AgentLauncher::Monitor() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Only our own children are waited for: the process may have others (popen in tests).
    for (int r = 0; r < static_cast<int>(pids_.size()) && !stopping_; ++r) {
      const pid_t pid = pids_[r];
      int status = 0;
      if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid) continue;
      VAMP_LOG(ERROR) << "agent rank " << r << " (pid " << pid << ") exited with "
                      << (WIFEXITED(status) ? absl::StrCat("status ", WEXITSTATUS(status))
                                            : absl::StrCat("signal ", WTERMSIG(status)))
                      << "; restarting it in " << options_.restart_backoff_ms << " ms";
      pids_[r] = 0;
      mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                           absl::Milliseconds(options_.restart_backoff_ms));
      if (stopping_) return;
      absl::StatusOr<pid_t> respawned = Spawn(r);
      if (respawned.ok()) {
        pids_[r] = *respawned;
      } else {
        VAMP_LOG(ERROR) << "cannot restart agent rank " << r << ": " << respawned.status();
      }
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
  }
}

void AgentLauncher::KillAll() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  for (int r = 0; r < static_cast<int>(pids_.size()); ++r) {
    if (pids_[r] <= 0) continue;
    VAMP_LOG(WARNING) << "killing agent rank " << r << " (pid " << pids_[r] << ") to restart it";
    kill(pids_[r], SIGKILL);
  }
}

std::vector<pid_t> AgentLauncher::pids() const {
  absl::MutexLock lock(&mu_);
  return pids_;
}

void AgentLauncher::Stop(int64_t grace_ms) {
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && pids_.empty()) return;
    stopping_ = true;
    pids = pids_;
    pids_.clear();
  }
  if (monitor_.joinable()) monitor_.join();
  for (pid_t p : pids) {
    if (p > 0) kill(p, SIGTERM);
  }
  const int64_t deadline = SteadyClock::Get().NowMicros() + grace_ms * 1000;
  for (pid_t p : pids) {
    if (p <= 0) continue;
    while (waitpid(p, nullptr, WNOHANG) == 0) {
      if (SteadyClock::Get().NowMicros() > deadline) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        break;
      }
      usleep(20000);
    }
  }
}

AgentLauncher::~AgentLauncher() { Stop(); }

}  // namespace vamp
