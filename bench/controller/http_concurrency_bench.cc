// The HTTP front end at scale: how many concurrent streaming clients vamp-controller
// holds, whether every request reaches the scheduler (not a socket backlog), how /health answers
// meanwhile, and what an idle connection costs in controller memory.
//
// For each controller binary given (the one under test, and optionally a baseline build), the
// bench starts `<binary> --spawn_agents 1` on the tiny model (CPU agent), then:
//   1. opens --connections TCP connections and holds them idle for --idle_s, sampling the
//      controller's RSS before and after (bytes per idle connection);
//   2. sends one streaming completion (--max_tokens, ignore_eos) on every connection, and
//      reads every stream to its end on one epoll thread, until --deadline_s;
//   3. meanwhile, every --probe_ms: GET /health on a fresh connection (latency), and /metrics
//      (requests running + waiting in the scheduler: the most seen at once).
// It prints one table, a column per binary, with ratios against the first binary.
//
// Example:
//   build/release/bench/controller/vamp_bench_http_concurrency \
//     --controller build/release/controller/vamp-controller --connections 10000
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/vamp_bench/protocol.h"
#include "common/config.h"

namespace vamp {
namespace {

// The bench's flags, typed.
struct Flags {
  std::string controller;  // required
  std::string baseline_controller;
  std::string model_path;  // empty: tests/data/tiny-qwen3-moe of the source tree
  int64_t connections = 10000;
  double idle_s = 5;
  int64_t max_tokens = 16;
  int64_t max_num_seqs = 256;
  int64_t probe_ms = 100;
  double deadline_s = 300;
  std::string extra_flags;  // space-separated
};

const ConfigSchema& Schema() {
  static const ConfigSchema* s = [] {
    const Flags d;
    auto* s = new ConfigSchema();
    s->String("controller", d.controller,
              "vamp-controller binary under test (its vamp-agent must sit next to it)")
        .String("baseline_controller", d.baseline_controller,
                "optional second vamp-controller (e.g. an older build) run the same way; the "
                "table then shows both and the ratios")
        .String("model_path", d.model_path,
                "model folder; default: tests/data/tiny-qwen3-moe of the source tree this bench "
                "was built from")
        .Int("connections", d.connections, 1, 1000000, "concurrent client connections")
        .Double("idle_s", d.idle_s, 0, 3600, "seconds the connections stay idle before requesting")
        .Int("max_tokens", d.max_tokens, 1, 100000, "tokens each streaming request generates")
        .Int("max_num_seqs", d.max_num_seqs, 1, 1 << 20, "the controller's --max_num_seqs")
        .Int("probe_ms", d.probe_ms, 1, 60000, "interval of /health and /metrics probes (ms)")
        .Double("deadline_s", d.deadline_s, 1, 86400,
                "stop reading streams after this long (what finished by then is reported)")
        .String("extra_flags", d.extra_flags, "more controller flags, space-separated");
    return s;
  }();
  return *s;
}

// The only reader of the flags by name.
Flags FlagsFromConfig(const Config& config) {
  Flags f;
  f.controller = config.GetString("controller");
  f.baseline_controller = config.GetString("baseline_controller");
  f.model_path = config.GetString("model_path");
  f.connections = config.GetInt("connections");
  f.idle_s = config.GetDouble("idle_s");
  f.max_tokens = config.GetInt("max_tokens");
  f.max_num_seqs = config.GetInt("max_num_seqs");
  f.probe_ms = config.GetInt("probe_ms");
  f.deadline_s = config.GetDouble("deadline_s");
  f.extra_flags = config.GetString("extra_flags");
  return f;
}

int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      int64_t kb = 0;
      (void)absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(v), " kB"), &kb);
      return kb * 1024;
    }
  }
  return 0;
}

int Connect(int port, bool blocking) {
  const int fd = socket(AF_INET, SOCK_STREAM | (blocking ? 0 : SOCK_NONBLOCK), 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// One blocking GET on a fresh connection; the body, or "" on failure. Sets *seconds.
std::string Get(int port, const std::string& path, double* seconds, int timeout_ms = 5000) {
  const absl::Time start = absl::Now();
  const int fd = Connect(port, /*blocking=*/true);
  std::string out;
  if (fd >= 0) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string req = absl::StrCat("GET ", path, " HTTP/1.1\r\nConnection: close\r\n\r\n");
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
    close(fd);
  }
  if (seconds != nullptr) *seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return out;
}

// The value of the unlabelled sample `name` in a /metrics response (head and body, as Get returns
// it); 0 when absent or the body does not parse (a probe that failed).
double Metric(const std::string& response, absl::string_view name) {
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return 0;
  absl::StatusOr<std::vector<bench::PromSample>> samples =
      bench::ParsePrometheusText(absl::string_view(response).substr(body + 4));
  if (!samples.ok()) return 0;
  for (const bench::PromSample& s : *samples) {
    if (s.name == name && s.labels.empty()) return s.value;
  }
  return 0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

struct Result {
  int64_t connected = 0;
  int64_t completed = 0;  // streams that reached [DONE]
  int64_t failed = 0;     // closed or answered non-200 before [DONE]
  double rss_before = 0, rss_idle = 0;
  double max_in_scheduler = 0, max_running = 0;
  double health_p50 = 0, health_p99 = 0, health_max = 0;
  int64_t health_probes = 0, health_failures = 0;
  double seconds_to_all_done = 0;  // from the first request sent
};

struct Controller {
  pid_t pid = -1;
  int http_port = 0;
};

Controller StartController(const std::string& binary, const Flags& flags, const std::string& dir) {
  const std::string ready = absl::StrCat(dir, "/ready.json");
  std::remove(ready.c_str());
  std::string model = flags.model_path;
  if (model.empty()) model = std::string(VAMP_SOURCE_DIR) + "/tests/data/tiny-qwen3-moe";
  std::vector<std::string> args = {binary,
                                   "--model_path=" + model,
                                   "--spawn_agents=1",
                                   "--http_address=127.0.0.1:0",
                                   "--grpc_address=127.0.0.1:0",
                                   "--admin_address=127.0.0.1:0",
                                   "--metrics_address=",
                                   "--log_level=warning",
                                   absl::StrCat("--max_num_seqs=", flags.max_num_seqs),
                                   "--ready_file=" + ready};
  for (absl::string_view f : absl::StrSplit(flags.extra_flags, ' ', absl::SkipEmpty())) {
    args.emplace_back(f);
  }
  Controller c;
  c.pid = fork();
  if (c.pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    std::ifstream in(ready);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"http_port\": ");
    if (at != std::string::npos) {
      (void)absl::SimpleAtoi(text.substr(at + 13, text.find(',', at) - at - 13), &c.http_port);
      double s = 0;
      if (absl::StrContains(Get(c.http_port, "/health", &s), "\"serving\"")) return c;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::cerr << "controller " << binary << " did not start serving within 120 s\n";
  kill(c.pid, SIGKILL);
  c.pid = -1;
  return c;
}

Result RunOne(const std::string& binary, const Flags& flags) {
  Result r;
  char dir_template[] = "/tmp/vamp-http-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  Controller c = StartController(binary, flags, dir);
  if (c.pid < 0) return r;
  const int n = static_cast<int>(flags.connections);
  r.rss_before = static_cast<double>(RssBytes(c.pid));

  // 1. Open and hold idle connections.
  const int ep = epoll_create1(0);
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = Connect(c.http_port, /*blocking=*/false);
    if (fd < 0) {
      std::cerr << "connect " << i << " failed: " << strerror(errno) << "\n";
      break;
    }
    fds.push_back(fd);
    if (i % 1000 == 999) absl::SleepFor(absl::Milliseconds(20));  // let accept keep up
  }
  r.connected = static_cast<int64_t>(fds.size());
  std::cerr << "  " << fds.size() << " connections open; idle for " << flags.idle_s << " s\n";
  absl::SleepFor(absl::Seconds(flags.idle_s));
  r.rss_idle = static_cast<double>(RssBytes(c.pid));

  // 3. Probes, on their own thread.
  std::atomic<bool> stop{false};
  std::vector<double> health;
  const absl::Time probe_start = absl::Now();
  std::thread prober([&] {
    const auto interval = absl::Milliseconds(flags.probe_ms);
    while (!stop.load()) {
      double s = 0;
      const std::string h = Get(c.http_port, "/health", &s);
      ++r.health_probes;
      if (absl::StrContains(h, "200 OK")) {
        health.push_back(s);
        if (s > 0.05) {
          std::cerr << "  slow /health: " << s * 1e3 << " ms at "
                    << absl::ToDoubleSeconds(absl::Now() - probe_start) << " s\n";
        }
      } else {
        ++r.health_failures;
      }
      const std::string m = Get(c.http_port, "/metrics", nullptr);
      const double running = Metric(m, "vamp_scheduler_requests_running");
      r.max_running = std::max(r.max_running, running);
      r.max_in_scheduler =
          std::max(r.max_in_scheduler, running + Metric(m, "vamp_scheduler_requests_waiting"));
      absl::SleepFor(interval);
    }
  });

  // 2. One streaming request per connection; read all streams on this thread.
  const std::string body =
      absl::StrCat(R"({"prompt":[3,4,5,6],"stream":true,"ignore_eos":true,"max_tokens":)",
                   flags.max_tokens, "}");
  const std::string request =
      absl::StrCat("POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n",
                   "Content-Length: ", body.size(), "\r\n\r\n", body);
  const absl::Time start = absl::Now();
  std::vector<std::string> seen(fds.size());
  int64_t open_streams = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (send(fds[i], request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      ++r.failed;
      close(fds[i]);
      fds[i] = -1;
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
    ++open_streams;
  }
  const absl::Time deadline = start + absl::Seconds(flags.deadline_s);
  std::vector<epoll_event> events(1024);
  int64_t last_report = 0;
  while (open_streams > 0 && absl::Now() < deadline) {
    const int k = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 200);
    for (int e = 0; e < k; ++e) {
      const size_t i = events[e].data.u64;
      char buf[16384];
      const ssize_t got = recv(fds[i], buf, sizeof(buf), 0);
      bool done = false;
      if (got <= 0) {
        ++r.failed;
        done = true;
      } else {
        // Keep only a tail: enough to find the end marker across reads.
        seen[i].append(buf, static_cast<size_t>(got));
        if (absl::StrContains(seen[i], "data: [DONE]")) {
          ++r.completed;
          done = true;
        } else if (seen[i].size() > 64) {
          seen[i].erase(0, seen[i].size() - 64);
        }
      }
      if (done) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fds[i], nullptr);
        close(fds[i]);
        fds[i] = -1;
        --open_streams;
      }
    }
    if (r.completed / 1000 != last_report) {
      last_report = r.completed / 1000;
      std::cerr << "  " << r.completed << " streams done, " << open_streams << " open, "
                << absl::ToDoubleSeconds(absl::Now() - start) << " s\n";
    }
  }
  r.seconds_to_all_done = absl::ToDoubleSeconds(absl::Now() - start);
  stop.store(true);
  prober.join();
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  close(ep);
  r.health_p50 = Percentile(health, 0.5);
  r.health_p99 = Percentile(health, 0.99);
  r.health_max = Percentile(health, 1.0);
  kill(c.pid, SIGTERM);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return r;
}

int Main(int argc, char** argv) {
  auto invocation = ParseInvocation(
      Schema(), "vamp_bench_http_concurrency",
      "Holds thousands of streaming clients against vamp-controller (CPU agent, tiny model) and "
      "reports what reached the scheduler, /health latency and memory per idle connection.",
      argc, argv, FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const Flags& flags = *invocation.options;
  std::vector<std::string> binaries;
  if (flags.controller.empty()) {
    std::cerr << "vamp_bench_http_concurrency: --controller is required (see --help)\n";
    return 2;
  }
  binaries.push_back(flags.controller);
  if (!flags.baseline_controller.empty()) {
    binaries.push_back(flags.baseline_controller);
  }
  rlimit limit;
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  signal(SIGPIPE, SIG_IGN);
  std::vector<Result> results;
  for (const std::string& b : binaries) {
    std::cerr << "== " << b << "\n";
    results.push_back(RunOne(b, flags));
  }
  const int64_t n = flags.connections;
  std::cout << "connections asked: " << n << ", max_tokens " << flags.max_tokens
            << ", max_num_seqs " << flags.max_num_seqs << "\n\n| metric |";
  for (const auto& b : binaries) std::cout << " " << b << " |";
  if (results.size() == 2) std::cout << " ratio (first / second) |";
  std::cout << "\n|---|";
  for (size_t i = 0; i < results.size() + (results.size() == 2 ? 1 : 0); ++i) std::cout << "---|";
  std::cout << "\n";
  auto row = [&](const std::string& name, auto get) {
    std::cout << "| " << name << " |";
    for (const Result& r : results) std::cout << " " << get(r) << " |";
    if (results.size() == 2) {
      const double b = get(results[1]);
      std::cout << " " << (b != 0 ? get(results[0]) / b : 0) << " |";
    }
    std::cout << "\n";
  };
  row("connections held", [](const Result& r) { return static_cast<double>(r.connected); });
  row("streams completed", [](const Result& r) { return static_cast<double>(r.completed); });
  row("streams failed", [](const Result& r) { return static_cast<double>(r.failed); });
  row("most requests in the scheduler at once",
      [](const Result& r) { return r.max_in_scheduler; });
  row("most requests running at once", [](const Result& r) { return r.max_running; });
  row("seconds until all streams ended", [](const Result& r) { return r.seconds_to_all_done; });
  row("/health p50 (ms)", [](const Result& r) { return r.health_p50 * 1e3; });
  row("/health p99 (ms)", [](const Result& r) { return r.health_p99 * 1e3; });
  row("/health max (ms)", [](const Result& r) { return r.health_max * 1e3; });
  row("/health probes failed", [](const Result& r) { return static_cast<double>(r.health_failures); });
  row("controller RSS before (MiB)", [](const Result& r) { return r.rss_before / 1048576; });
  row("controller RSS per idle connection (KiB)", [](const Result& r) {
    return r.connected > 0 ? (r.rss_idle - r.rss_before) / static_cast<double>(r.connected) / 1024
                           : 0;
  });
  return 0;
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) { return vamp::Main(argc, argv); }
