// What one offload costs end to end, with CPU agents: the time Admin's ForceOffload and
// ForceRestore take (the step boundary they wait for, the controller's rounds to the agents, the
// agents' remap) and what a client stream sees meanwhile (the gaps between its tokens).
//
// For each controller binary given (the one under test, and optionally a baseline build run the
// same way in the same invocation), and for each tensor-parallel size of --tp (CPU agents; TP 2
// all-reduces over TCP), the bench starts `<binary> --spawn_agents <tp>` on the tiny model
// (--arbiter=static, so every offload is a forced one), then:
//   idle   --iterations times: ForceOffload(1 group), then ForceRestore(1 group), no request live;
//   busy   streaming Generates (ignore_eos, --stream_tokens tokens each) run back to back while
//          the same offload/restore pairs are forced; their inter-token gaps are recorded, and
//          the same streams for as long without remaps give the baseline gaps.
// It prints a table per TP size, a column per binary (the ratio of the first to the second when
// there are two): latencies in ms, p50 / p90 / max.
//
// Example (the before/after of issue 17: bench/results/2026-12-02-offload-round-trips.md):
//   build/release/bench/controller/vamp_bench_offload
//     --controller build/release/controller/vamp-controller
//     --baseline_controller /path/to/main/build/release/controller/vamp-controller
// (one command line)
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/vamp_bench/system.h"
#include "common/config.h"
#include "grpcpp/grpcpp.h"
#include "vamp/v1/admin.grpc.pb.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp {
namespace {

struct Flags {
  std::string controller;  // required
  std::string baseline_controller;
  std::string model_path;  // empty: tests/data/tiny-qwen3-moe of the source tree
  std::string tp = "1,2";
  int64_t iterations = 40;
  int64_t stream_tokens = 128;
  std::string extra_flags;  // space-separated
};

const ConfigSchema& Schema() {
  static const ConfigSchema* s = [] {
    const Flags d;
    auto* s = new ConfigSchema();
    s->String("controller", d.controller,
              "vamp-controller binary under test (its vamp-agent must sit next to it)")
        .String("baseline_controller", d.baseline_controller,
                "optional second vamp-controller (e.g. a build of main) run the same way")
        .String("model_path", d.model_path,
                "model folder; default: tests/data/tiny-qwen3-moe of the source tree this bench "
                "was built from")
        .String("tp", d.tp, "comma-separated tensor-parallel sizes (CPU agents each)")
        .Int("iterations", d.iterations, 1, 100000, "offload/restore pairs per phase")
        .Int("stream_tokens", d.stream_tokens, 16, 1000000,
             "tokens of each streaming request of the busy phase")
        .String("extra_flags", d.extra_flags, "more vamp-controller flags, space-separated");
    return s;
  }();
  return *s;
}

Flags FlagsFromConfig(const Config& c) {
  Flags f;
  f.controller = c.GetString("controller");
  f.baseline_controller = c.GetString("baseline_controller");
  f.model_path = c.GetString("model_path");
  f.tp = c.GetString("tp");
  f.iterations = c.GetInt("iterations");
  f.stream_tokens = c.GetInt("stream_tokens");
  f.extra_flags = c.GetString("extra_flags");
  return f;
}

// p-quantile (nearest rank) of `v`, ms; 0 for none.
double Quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

struct Latencies {
  std::vector<double> ms;
  std::string Summary() const {
    return absl::StrFormat("%.2f / %.2f / %.2f", Quantile(ms, 0.5), Quantile(ms, 0.9),
                           Quantile(ms, 1.0));
  }
};

struct Result {
  bool ok = false;
  Latencies idle_offload, idle_restore, busy_offload, busy_restore;
  Latencies stream_alone_gaps, stream_remapping_gaps;
};

// A controller with CPU agents that can offload (a host pool for the experts, a 75 % cap) and a
// static arbiter, so only the forced remaps move memory; `extra_flags` after these.
absl::StatusOr<std::unique_ptr<bench::RunningSystem>> StartController(const std::string& binary,
                                                                      const Flags& flags, int tp,
                                                                      const std::string& dir) {
  bench::SystemOptions o;
  o.controller_binary = binary;
  o.model_path = flags.model_path.empty()
                     ? std::string(VAMP_SOURCE_DIR) + "/tests/data/tiny-qwen3-moe"
                     : flags.model_path;
  o.spawn_agents = tp;
  o.flags = {"--agent_host_memory_bytes=268435456", "--agent_host_page_bytes=4096",
             "--max_offload_ratio=0.75", "--arbiter=static", "--log_level=warning"};
  o.log_path = absl::StrCat(dir, "/controller.log");
  o.startup_timeout_s = 120;
  return bench::RunningSystem::Start(o, bench::SplitFlags(flags.extra_flags));
}

// One Generate stream of `tokens` tokens; the gaps between its responses (ms) in `gaps`.
void Stream(vamp::v1::Serving::Stub* serving, int64_t tokens, std::vector<double>* gaps) {
  vamp::v1::GenerateRequest request;
  for (int i = 0; i < 24; ++i) request.add_prompt_token_ids(10 + i);
  request.mutable_stop()->set_max_tokens(static_cast<int32_t>(tokens));
  request.mutable_stop()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = serving->Generate(&ctx, request);
  vamp::v1::GenerateResponse response;
  absl::Time last = absl::InfinitePast();
  while (reader->Read(&response)) {
    const absl::Time now = absl::Now();
    if (last != absl::InfinitePast()) gaps->push_back(absl::ToDoubleMilliseconds(now - last));
    last = now;
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) std::cerr << "stream failed: " << s.error_message() << "\n";
}

// ForceOffload (offload) or ForceRestore of one group; its latency (ms), or -1 on an error.
double Remap(vamp::v1::Admin::Stub* admin, bool offload) {
  vamp::v1::ForceRemapRequest request;
  request.set_num_groups(1);
  vamp::v1::ForceRemapResponse response;
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  grpc::Status s = offload ? admin->ForceOffload(&ctx, request, &response)
                           : admin->ForceRestore(&ctx, request, &response);
  if (!s.ok()) {
    std::cerr << (offload ? "ForceOffload" : "ForceRestore") << ": " << s.error_message() << "\n";
    return -1;
  }
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

Result RunOne(const std::string& binary, const Flags& flags, int tp) {
  Result r;
  char dir_template[] = "/tmp/vamp-offload-bench-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return r;
  absl::StatusOr<std::unique_ptr<bench::RunningSystem>> system =
      StartController(binary, flags, tp, dir);
  if (!system.ok()) {
    std::cerr << system.status() << "\n";
    return r;
  }
  const bench::HttpEndpoint admin_at = (*system)->admin(), grpc_at = (*system)->grpc();
  if (admin_at.port <= 0) {
    std::cerr << "controller " << binary << " named no admin_port in its ready file\n";
    return r;
  }
  auto admin = vamp::v1::Admin::NewStub(grpc::CreateChannel(
      absl::StrCat(admin_at.host, ":", admin_at.port), grpc::InsecureChannelCredentials()));
  auto serving = vamp::v1::Serving::NewStub(grpc::CreateChannel(
      absl::StrCat(grpc_at.host, ":", grpc_at.port), grpc::InsecureChannelCredentials()));
  bool ok = true;
  auto pair = [&](Latencies* offload, Latencies* restore) {
    const double o = Remap(admin.get(), true);
    const double b = Remap(admin.get(), false);
    ok = ok && o >= 0 && b >= 0;
    offload->ms.push_back(o);
    restore->ms.push_back(b);
  };
  pair(&r.idle_offload, &r.idle_restore);  // warm-up, not counted
  r.idle_offload.ms.clear();
  r.idle_restore.ms.clear();
  for (int64_t i = 0; i < flags.iterations; ++i) pair(&r.idle_offload, &r.idle_restore);

  // Streams back to back while `phase` runs, their gaps in `gaps`.
  auto under_load = [&](Latencies* gaps, const std::function<void()>& phase) {
    std::atomic<bool> done{false};
    std::thread streams([&] {
      while (!done.load()) Stream(serving.get(), flags.stream_tokens, &gaps->ms);
    });
    absl::SleepFor(absl::Milliseconds(20));  // the first stream is decoding
    phase();
    done.store(true);
    streams.join();
  };
  // The stream alone, for as long as the remaps below take when idle.
  const double idle_ms = [&] {
    double sum = 0;
    for (double v : r.idle_offload.ms) sum += v;
    for (double v : r.idle_restore.ms) sum += v;
    return sum;
  }();
  under_load(&r.stream_alone_gaps,
             [&] { absl::SleepFor(absl::Milliseconds(static_cast<int64_t>(idle_ms) + 1)); });
  under_load(&r.stream_remapping_gaps, [&] {
    for (int64_t i = 0; i < flags.iterations; ++i) pair(&r.busy_offload, &r.busy_restore);
  });
  r.ok = ok;
  (*system)->Stop();
  return r;
}

int Main(int argc, char** argv) {
  auto invocation = ParseInvocation(
      Schema(), "vamp_bench_offload",
      "Times forced offloads and restores end to end against vamp-controller with CPU agents "
      "(tiny model), idle and under a streaming request, for one or two controller builds.",
      argc, argv, FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const Flags& flags = *invocation.options;
  if (flags.controller.empty()) {
    std::cerr << "vamp_bench_offload: --controller is required (see --help)\n";
    return 2;
  }
  std::vector<std::string> binaries = {flags.controller};
  if (!flags.baseline_controller.empty()) binaries.push_back(flags.baseline_controller);
  for (const std::string& b : binaries) {
    if (access(b.c_str(), X_OK) != 0) {
      std::cerr << "vamp_bench_offload: --" << (b == flags.controller ? "" : "baseline_")
                << "controller: '" << b << "' is not an executable file\n";
      return 2;
    }
  }
  std::vector<int> tps;
  for (absl::string_view t : absl::StrSplit(flags.tp, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 1) {
      std::cerr << "vamp_bench_offload: --tp: '" << t << "' is not a positive integer\n";
      return 2;
    }
    tps.push_back(v);
  }
  signal(SIGPIPE, SIG_IGN);
  int failed = 0;
  for (int tp : tps) {
    std::vector<Result> results;
    for (const std::string& b : binaries) {
      std::cerr << "== TP " << tp << ": " << b << "\n";
      results.push_back(RunOne(b, flags, tp));
      if (!results.back().ok) ++failed;
    }
    std::cout << "\nTP " << tp << " (CPU agents), " << flags.iterations
              << " offload/restore pairs of 1 group per phase; ms, p50 / p90 / max\n\n| |";
    for (const std::string& b : binaries) std::cout << " " << b << " |";
    if (results.size() == 2) std::cout << " p50 ratio (first / second) |";
    std::cout << "\n|---|";
    for (size_t i = 0; i < results.size() + (results.size() == 2 ? 1 : 0); ++i) std::cout << "---|";
    std::cout << "\n";
    auto row = [&](const std::string& name, Latencies Result::*field) {
      std::cout << "| " << name << " |";
      for (const Result& r : results) std::cout << " " << (r.*field).Summary() << " |";
      if (results.size() == 2) {
        const double b = Quantile((results[1].*field).ms, 0.5);
        std::cout << " " << absl::StrFormat("%.2f", b > 0 ? Quantile((results[0].*field).ms, 0.5) / b : 0)
                  << " |";
      }
      std::cout << "\n";
    };
    row("ForceOffload, idle", &Result::idle_offload);
    row("ForceRestore, idle", &Result::idle_restore);
    row("ForceOffload, while a request decodes", &Result::busy_offload);
    row("ForceRestore, while a request decodes", &Result::busy_restore);
    row("inter-token gap, stream alone", &Result::stream_alone_gaps);
    row("inter-token gap, stream during the remaps", &Result::stream_remapping_gaps);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) { return vamp::Main(argc, argv); }
