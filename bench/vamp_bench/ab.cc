#include "bench/vamp_bench/ab.h"

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/vamp_bench/metrics_sampler.h"

namespace vamp::bench {
namespace {

absl::StatusOr<std::string> CapFlag(absl::string_view spec, absl::string_view digits) {
  int cap = 0;
  if (!absl::SimpleAtoi(digits, &cap) || cap < 1 || cap > 95) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--configs: '", spec, "' needs a cap R in 1..95 (percent of experts), as in vamp-25"));
  }
  return absl::StrCat("--max_offload_ratio=", cap / 100.0);
}

}  // namespace

absl::StatusOr<AbConfig> ParseAbConfig(absl::string_view spec) {
  AbConfig c;
  c.name = std::string(spec);
  if (const size_t colon = spec.find(':'); colon != absl::string_view::npos) {
    c.name = std::string(spec.substr(0, colon));
    if (c.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--configs: '", spec, "' has no name"));
    }
    c.flags = SplitFlags(std::string(spec.substr(colon + 1)));
    return c;
  }
  if (spec == "static") {
    c.flags = {"--arbiter=static", "--max_offload_ratio=0"};
  } else if (spec == "vamp") {
    c.flags = {"--arbiter=vamp"};
  } else if (spec == "paper") {
    c.flags = {"--arbiter=vamp", "--vamp_cost_model=paper"};
  } else if (absl::StartsWith(spec, "vamp-")) {
    absl::StatusOr<std::string> cap = CapFlag(spec, spec.substr(5));
    if (!cap.ok()) return cap.status();
    c.flags = {"--arbiter=vamp", *cap};
  } else if (absl::StartsWith(spec, "paper-")) {
    absl::StatusOr<std::string> cap = CapFlag(spec, spec.substr(6));
    if (!cap.ok()) return cap.status();
    c.flags = {"--arbiter=vamp", "--vamp_cost_model=paper", *cap};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--configs: unknown configuration '", spec,
                     "' (static, vamp, vamp-R, paper, paper-R or NAME:FLAGS)"));
  }
  return c;
}

absl::StatusOr<std::vector<AbConfig>> ParseAbConfigs(absl::string_view specs) {
  std::vector<AbConfig> out;
  for (absl::string_view s : absl::StrSplit(specs, ',', absl::SkipWhitespace())) {
    absl::StatusOr<AbConfig> c = ParseAbConfig(absl::StripAsciiWhitespace(s));
    if (!c.ok()) return c.status();
    for (const AbConfig& o : out) {
      if (o.name == c->name) {
        return absl::InvalidArgumentError(
            absl::StrCat("--configs: configuration '", c->name, "' given twice"));
      }
    }
    out.push_back(*std::move(c));
  }
  if (out.empty()) return absl::InvalidArgumentError("--configs: no configuration given");
  return out;
}

absl::StatusOr<RunResult> MeasureRun(const workload::Workload& workload,
                                     const ClientOptions& client, const WindowRule& rule,
                                     double sample_interval_s) {
  const BenchClock::time_point start = BenchClock::now();
  SamplerOptions so;
  so.controller = client.endpoint;
  so.interval_s = sample_interval_s;
  MetricsSampler sampler(so, start);
  sampler.Start();
  ClientOptions c = client;
  if (c.progress && !c.progress_extra) {
    c.progress_extra = [&sampler] {
      const MetricsSample m = sampler.Latest();
      if (!m.ok) return std::string("server metrics: none yet");
      return absl::StrFormat(
          "KV %.0f blocks, %.0f%% used, offload %.0f%%, waiting %.0f, "
          "preempted %.0f",
          m.kv_pool_blocks, 100 * m.kv_usage_ratio, 100 * m.kv_offload_ratio, m.requests_waiting,
          m.preemptions_total);
    };
  }
  absl::StatusOr<ClientRun> run = RunWorkload(workload, c, start);
  // Its last sample comes after the last response, so the window's end is covered.
  sampler.Stop();
  if (!run.ok()) return run.status();
  RunResult r;
  r.samples = sampler.samples();
  r.duration_s = run->duration_s;
  r.cut_off = run->cut_off;
  r.stats = ComputeRunStats(run->records, run->turns_per_session, rule);
  r.server = ComputeServerStats(r.samples, r.stats.window);
  r.records = std::move(run->records);
  return r;
}

absl::StatusOr<std::vector<RunResult>> RunAb(
    const AbOptions& o,
    const std::function<absl::StatusOr<workload::Workload>(int32_t sessions, int32_t run)>&
        make_workload) {
  if (o.configs.empty()) return absl::InvalidArgumentError("--configs: no configuration given");
  if (o.sessions.empty()) return absl::InvalidArgumentError("--sessions_sweep: no value given");
  struct Point {
    int32_t sessions;
    int32_t repeat;
    int32_t run;
  };
  std::vector<Point> points;
  for (int32_t n : o.sessions) {
    for (int32_t rep = 0; rep < o.repeats; ++rep) {
      points.push_back({n, rep, static_cast<int32_t>(points.size())});
    }
  }
  std::vector<workload::Workload> workloads;
  for (const Point& p : points) {
    absl::StatusOr<workload::Workload> w = make_workload(p.sessions, p.run);
    if (!w.ok()) return w.status();
    workloads.push_back(*std::move(w));
  }
  std::vector<RunResult> results;
  std::unique_ptr<RunningSystem> shared;
  std::string shared_error;
  auto run_one = [&](const AbConfig& config, const Point& p) {
    RunResult result;
    std::unique_ptr<RunningSystem> own;
    RunningSystem* sys = shared.get();
    if (!o.one_system_per_config) {
      SystemOptions so = o.system;
      if (!o.log_dir.empty()) {
        so.log_path =
            absl::StrCat(o.log_dir, "/", config.name, "-s", p.sessions, "-r", p.repeat + 1, ".log");
      }
      std::fprintf(stderr, "vamp-bench ab: %s, %d sessions, run %d/%d: starting the system\n",
                   config.name.c_str(), p.sessions, p.repeat + 1, o.repeats);
      absl::StatusOr<std::unique_ptr<RunningSystem>> started =
          RunningSystem::Start(so, config.flags);
      if (started.ok()) {
        own = *std::move(started);
        sys = own.get();
      } else {
        shared_error = std::string(started.status().message());
      }
    } else {
      std::fprintf(stderr, "vamp-bench ab: %s, %d sessions, run %d/%d\n", config.name.c_str(),
                   p.sessions, p.repeat + 1, o.repeats);
    }
    if (sys == nullptr) {
      result.error = shared_error;
      std::fprintf(stderr, "vamp-bench ab: %s\n", result.error.c_str());
    } else {
      ClientOptions c = o.client;
      c.endpoint = sys->http();
      c.grpc_endpoint = sys->grpc();
      absl::StatusOr<RunResult> r = MeasureRun(workloads[p.run], c, o.rule, o.sample_interval_s);
      if (r.ok()) {
        result = *std::move(r);
      } else {
        result.error = std::string(r.status().message());
      }
      result.command = sys->command();
    }
    if (own != nullptr) own->Stop();
    result.config = config.name;
    result.config_flags = absl::StrJoin(config.flags, " ");
    result.sessions = p.sessions;
    result.repeat = p.repeat;
    if (o.on_run) o.on_run(result);
    results.push_back(std::move(result));
  };
  if (o.one_system_per_config) {
    for (const AbConfig& config : o.configs) {
      SystemOptions so = o.system;
      if (!o.log_dir.empty()) so.log_path = absl::StrCat(o.log_dir, "/", config.name, ".log");
      std::fprintf(stderr, "vamp-bench ab: %s: starting the system\n", config.name.c_str());
      absl::StatusOr<std::unique_ptr<RunningSystem>> started =
          RunningSystem::Start(so, config.flags);
      shared_error = started.ok() ? "" : std::string(started.status().message());
      shared = started.ok() ? *std::move(started) : nullptr;
      for (const Point& p : points) run_one(config, p);
      if (shared != nullptr) shared->Stop();
      shared.reset();
    }
  } else {
    for (const Point& p : points) {
      for (const AbConfig& config : o.configs) run_one(config, p);
    }
  }
  return results;
}

}  // namespace vamp::bench
