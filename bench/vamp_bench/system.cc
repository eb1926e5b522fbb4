#include "bench/vamp_bench/system.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {

std::string TailOfFile(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

std::vector<std::string> SplitFlags(const std::string& flags) {
  return absl::StrSplit(flags, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
}

absl::StatusOr<std::unique_ptr<RunningSystem>> RunningSystem::Start(
    const SystemOptions& o, const std::vector<std::string>& config_flags) {
  if (access(o.controller_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("--controller_binary: '", o.controller_binary, "' is not an executable file"));
  }
  std::unique_ptr<RunningSystem> sys(new RunningSystem());
  char ready[] = "/tmp/vamp-bench-ready-XXXXXX";
  const int fd = mkstemp(ready);
  if (fd < 0) return absl::InternalError("cannot create a ready file in /tmp");
  close(fd);
  unlink(ready);
  sys->ready_file_ = ready;

  std::vector<std::string> args = {o.controller_binary,
                                   "--model_path=" + o.model_path,
                                   absl::StrCat("--spawn_agents=", o.spawn_agents),
                                   "--grpc_address=127.0.0.1:0",
                                   "--admin_address=127.0.0.1:0",
                                   "--http_address=127.0.0.1:0",
                                   "--metrics_address=",
                                   "--ready_file=" + sys->ready_file_};
  if (!o.agent_binary.empty()) args.push_back("--agent_binary=" + o.agent_binary);
  args.insert(args.end(), o.flags.begin(), o.flags.end());
  args.insert(args.end(), config_flags.begin(), config_flags.end());
  sys->command_ = absl::StrJoin(args, " ");

  // fork + exec rather than posix_spawn, for PR_SET_PDEATHSIG: the controller (which stops its
  // agents) gets SIGTERM when vamp-bench ends for any reason, so no system outlives a killed
  // benchmark and holds on to its GPUs (the signal follows the thread that forks: Start runs on
  // the thread that drives the runs). Only async-signal-safe calls between fork and exec.
  const std::string log = o.log_path.empty() ? "/dev/null" : o.log_path;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("cannot fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  sys->pid_ = pid;

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.startup_timeout_s * 1e3));
  auto failed = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("vamp-controller ", why, " (", sys->command_,
                                               "); last lines of ", log, ":\n",
                                               TailOfFile(log, 15)));
  };
  bool have_port = false;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      sys->pid_ = -1;
      return failed(absl::StrCat("exited during start-up with status ",
                                 WIFEXITED(status) ? WEXITSTATUS(status) : -1));
    }
    if (!have_port) {
      std::ifstream in(sys->ready_file_);
      std::stringstream text;
      text << in.rdbuf();
      nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("http_port") &&
          j["http_port"].is_number_integer() && j.contains("grpc_port") &&
          j["grpc_port"].is_number_integer()) {
        sys->http_.host = sys->grpc_.host = "127.0.0.1";
        sys->http_.port = j["http_port"].get<int>();
        sys->grpc_.port = j["grpc_port"].get<int>();
        sys->http_.api_key = sys->grpc_.api_key = o.api_key;
        if (j.contains("admin_port") && j["admin_port"].is_number_integer()) {
          sys->admin_.port = j["admin_port"].get<int>();
        }
        have_port = true;
      }
    } else {
      absl::StatusOr<HttpResponse> h = HttpGet(sys->http_, "/health", 2.0);
      if (h.ok() && h->status == 200) return sys;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return failed(absl::StrCat("did not serve within ", o.startup_timeout_s, " s"));
}

RunningSystem::~RunningSystem() { Stop(); }

void RunningSystem::Stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 300 && !exited; ++i) {
      exited = waitpid(pid_, &status, WNOHANG) == pid_;
      if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!exited) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (!ready_file_.empty()) unlink(ready_file_.c_str());
}

}  // namespace vamp::bench
