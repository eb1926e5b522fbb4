// vamp-bench: the load generator and A/B runner of VAMP (see --help).
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/vamp_bench/ab.h"
#include "bench/vamp_bench/workload_flags.h"
#include "common/config.h"
#include "common/secret.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {
namespace {

constexpr char kSummary[] =
    "The load generator of VAMP. Measures, as a client, TTFT, TPOT, inter-token and end-to-end\n"
    "latency, request and token throughput of an OpenAI-compatible server (streaming\n"
    "/v1/completions with token-id prompts), samples the server's /metrics once a second, and\n"
    "writes a markdown report with SVG charts and the raw JSON.\n\n"
    "  vamp-bench run --server HOST:PORT [flags]   one run against a live server\n"
    "  vamp-bench ab [flags]                      starts vamp-controller (spawning its agents)\n"
    "                                             for each configuration in --configs and each\n"
    "                                             value of --sessions_sweep, runs the same\n"
    "                                             workload on each, and compares them\n\n"
    "Examples:\n"
    "  vamp-bench run --server 127.0.0.1:8000 --workload multi_turn --sessions 4 --out out/run\n"
    "  vamp-bench ab --configs static,vamp --sessions_sweep 2,4,8 --out out/ab \\\n"
    "      --system_flags '--agent_host_memory_bytes=2097152'\n\n"
    "Exit status: 0 done, 2 bad flags, 1 a run could not be made.";

// The flags both commands take, typed. Defaults: ClientOptions, WorkloadFlags and the fields
// here; CommonFlagsFromConfig is the only reader of these flags by name.
struct CommonFlags {
  WorkloadFlags workload;
  // model, loops, request_timeout_s, max_duration_s, progress (the API key is read by
  // CommonSetup, from api_key_file or $VAMP_API_KEY).
  ClientOptions client;
  std::string api_key_file;
  std::string out;  // required
  std::string title = "vamp-bench";
  double sample_interval_s = AbOptions{}.sample_interval_s;
  std::string slo_ttft_s;   // comma-separated seconds
  std::string slo_tpot_ms;  // comma-separated milliseconds
  std::string commit;
  std::string protocol = "http";  // http | grpc
  bool paper_reference = ReportSpec{}.paper_reference;
};

struct RunFlags {
  CommonFlags common;
  std::string server = "127.0.0.1:8000";
  std::string grpc_server = "127.0.0.1:50051";
  std::string label = "live";
};

struct AbFlags {
  CommonFlags common;
  std::string configs = "static,vamp";
  std::string sessions_sweep;  // comma-separated; empty: --sessions alone
  int32_t repeats = AbOptions{}.repeats;
  std::string controller_binary;
  std::string agent_binary;
  std::string model_path = VAMP_BENCH_DEFAULT_MODEL;
  int32_t spawn_agents = SystemOptions{}.spawn_agents;
  std::string system_flags;
  bool one_system_per_config = AbOptions{}.one_system_per_config;
  double startup_timeout_s = SystemOptions{}.startup_timeout_s;
  // Whether --vocab_size was given (otherwise it is read from the model's config.json).
  bool vocab_size_given = false;
};

void AddCommonFlags(ConfigSchema& s) {
  const CommonFlags d;
  AddWorkloadFlags(s);
  s.String("out", d.out, "output folder for the report (<title>.md, .json, SVG charts); required")
      .String("title", d.title, "report title; files are named after it")
      .String("model", d.client.model,
              "\"model\" field of each request; empty: left out (the only model)")
      .String("api_key_file", d.api_key_file,
              "file holding the API key to send as 'Authorization: Bearer <key>' (one line); "
              "default: $VAMP_API_KEY when set")
      .Enum("protocol", d.protocol, {"http", "grpc"},
            "how requests stream: http (POST /v1/completions, SSE) or grpc (Serving.Generate)")
      .Int("loops", d.client.loops, 1, 64,
           "event-loop threads for the client (sessions are dealt to them)")
      .Double("request_timeout_s", d.client.request_timeout_s, 0.1, 1e6,
              "a request whose server sends nothing for this long fails")
      .Double("max_duration_s", d.client.max_duration_s, 0, 1e7,
              "cut a run off after this many seconds (unfinished requests count as misses); 0: "
              "run every turn to the end")
      .Double("sample_interval_s", d.sample_interval_s, 0.05, 3600,
              "seconds between /metrics scrapes")
      .Bool("progress", d.client.progress, "print a progress line on stderr once a second")
      .String("slo_ttft_s", d.slo_ttft_s,
              "comma-separated TTFT limits T (s) of the Q(T, P) grid; empty: from the data")
      .String("slo_tpot_ms", d.slo_tpot_ms,
              "comma-separated TPOT limits P (ms) of the Q(T, P) grid; empty: from the data")
      .String("commit", d.commit,
              "commit to print in the report header (e.g. $(git rev-parse HEAD))")
      .Bool("paper_reference", d.paper_reference,
            "draw the paper's numbers on the charts (Table IV TTFT p90/p99 and hit rates, its "
            "+31.1 % TPOT cost, Figure 9's TTFT p99 for multi-turn sweeps); --no-paper_reference: "
            "leave them out");
}

CommonFlags CommonFlagsFromConfig(const Config& c) {
  CommonFlags f;
  f.workload = WorkloadFlagsFromConfig(c);
  f.out = c.GetString("out");
  f.title = c.GetString("title");
  f.client.model = c.GetString("model");
  f.api_key_file = c.GetString("api_key_file");
  f.client.loops = static_cast<int32_t>(c.GetInt("loops"));
  f.client.request_timeout_s = c.GetDouble("request_timeout_s");
  f.client.max_duration_s = c.GetDouble("max_duration_s");
  f.sample_interval_s = c.GetDouble("sample_interval_s");
  f.client.progress = c.GetBool("progress");
  f.slo_ttft_s = c.GetString("slo_ttft_s");
  f.slo_tpot_ms = c.GetString("slo_tpot_ms");
  f.commit = c.GetString("commit");
  f.protocol = c.GetString("protocol");
  f.client.protocol = f.protocol == "grpc" ? StreamProtocol::kGrpc : StreamProtocol::kHttp;
  f.paper_reference = c.GetBool("paper_reference");
  return f;
}

const ConfigSchema& RunSchema() {
  static const ConfigSchema* schema = [] {
    const RunFlags d;
    auto* s = new ConfigSchema();
    s->String("server", d.server,
              "host:port of the server's HTTP API (its /metrics is sampled; it streams unless "
              "--protocol=grpc)")
        .String("grpc_server", d.grpc_server,
                "host:port of the server's gRPC Serving API (--protocol=grpc)")
        .String("label", d.label, "configuration name of this run in the report");
    AddCommonFlags(*s);
    return s;
  }();
  return *schema;
}

RunFlags RunFlagsFromConfig(const Config& c) {
  RunFlags f;
  f.common = CommonFlagsFromConfig(c);
  f.server = c.GetString("server");
  f.grpc_server = c.GetString("grpc_server");
  f.label = c.GetString("label");
  return f;
}

const ConfigSchema& AbSchema() {
  static const ConfigSchema* schema = [] {
    const AbFlags d;
    auto* s = new ConfigSchema();
    s->String("configs", d.configs,
              "comma-separated configurations: static (--arbiter=static --max_offload_ratio=0), "
              "vamp (shipped "
              "defaults), vamp-R (cap VAMP-R, --max_offload_ratio=R/100), paper / paper-R (the "
              "paper's cost model), or NAME:FLAGS (FLAGS separated by spaces); the first is the "
              "baseline of the comparison")
        .String("sessions_sweep", d.sessions_sweep,
                "comma-separated values of --sessions to sweep (the multi-turn concurrency); "
                "empty: --sessions alone")
        .Int("repeats", d.repeats, 1, 1000, "runs of each (configuration, sessions) point")
        .String("controller_binary", d.controller_binary,
                "vamp-controller to start; default: next to vamp-bench, or in the build tree")
        .String("agent_binary", d.agent_binary,
                "vamp-agent the controller spawns; default: next to vamp-bench, or in the build "
                "tree")
        .String("model_path", d.model_path,
                "checkpoint folder (config.json [+ safetensors]); its vocab_size sets the token "
                "range unless --vocab_size is given")
        .Int("spawn_agents", d.spawn_agents, 1, 64,
             "agents (tensor-parallel ranks) the controller spawns")
        .String("system_flags", d.system_flags,
                "extra vamp-controller flags for every configuration, separated by spaces (e.g. "
                "'--agent_device=cuda --load_format=dummy --gpu_memory_utilization=0.5')")
        .Bool("one_system_per_config", d.one_system_per_config,
              "start each configuration's system once and run every sweep point on it (each "
              "point with its own seed, so no prefix carries over); default: a fresh system per "
              "run")
        .Double("startup_timeout_s", d.startup_timeout_s, 1, 86400,
                "how long a system may take to serve before its configuration is reported failed");
    AddCommonFlags(*s);
    return s;
  }();
  return *schema;
}

AbFlags AbFlagsFromConfig(const Config& c) {
  AbFlags f;
  f.common = CommonFlagsFromConfig(c);
  f.configs = c.GetString("configs");
  f.sessions_sweep = c.GetString("sessions_sweep");
  f.repeats = static_cast<int32_t>(c.GetInt("repeats"));
  f.controller_binary = c.GetString("controller_binary");
  f.agent_binary = c.GetString("agent_binary");
  f.model_path = c.GetString("model_path");
  f.spawn_agents = static_cast<int32_t>(c.GetInt("spawn_agents"));
  f.system_flags = c.GetString("system_flags");
  f.one_system_per_config = c.GetBool("one_system_per_config");
  f.startup_timeout_s = c.GetDouble("startup_timeout_s");
  f.vocab_size_given = c.IsSet("vocab_size");
  return f;
}

absl::StatusOr<std::vector<double>> ParseList(const std::string& text, const char* flag,
                                              double scale) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a positive number"));
    }
    out.push_back(v * scale);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ExeDir() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

std::string FindBinary(const std::string& given, const std::string& name,
                       const std::string& build_tree_dir) {
  if (!given.empty()) return given;
  const std::string dir = ExeDir();
  for (const std::string& c : {dir + "/" + name, dir + "/../../" + build_tree_dir + "/" + name}) {
    if (access(c.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(c).string();
  }
  return dir + "/" + name;
}

std::string Now() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

std::string Machine() {
  utsname u;
  if (uname(&u) != 0) return "unknown";
  return absl::StrCat(u.nodename, " (", u.sysname, " ", u.release, " ", u.machine, ", ",
                      sysconf(_SC_NPROCESSORS_ONLN), " cores)");
}

void RaiseFileLimit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// The report spec and client options the flags of both commands give.
absl::Status CommonSetup(const CommonFlags& c, int argc, char** argv, ClientOptions* client,
                         ReportSpec* spec) {
  const HttpEndpoint endpoint = client->endpoint;
  *client = c.client;
  client->endpoint = endpoint;
  const std::string& key_file = c.api_key_file;
  if (!key_file.empty()) {
    absl::StatusOr<std::string> key = ReadSecretFile(key_file, "--api_key_file");
    if (!key.ok()) return key.status();
    client->endpoint.api_key = *key;
  } else if (const char* env = std::getenv("VAMP_API_KEY"); env != nullptr && *env != '\0') {
    if (absl::Status s = ValidateSecret(env); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("$VAMP_API_KEY: ", s.message()));
    }
    client->endpoint.api_key = env;
  }
  if (c.out.empty()) return absl::InvalidArgumentError("--out: required");
  spec->title = c.title;
  spec->svg_prefix = c.title;
  absl::StatusOr<std::vector<double>> t = ParseList(c.slo_ttft_s, "slo_ttft_s", 1);
  if (!t.ok()) return t.status();
  absl::StatusOr<std::vector<double>> p = ParseList(c.slo_tpot_ms, "slo_tpot_ms", 1e-3);
  if (!p.ok()) return p.status();
  spec->ttft_limits_s = *t;
  spec->tpot_limits_s = *p;
  spec->paper_reference = c.paper_reference;
  spec->multi_turn_sweep = c.workload.workload == "multi_turn";
  std::vector<std::string> args(argv, argv + argc);
  spec->header_lines = {absl::StrCat("- date: ", Now()), absl::StrCat("- machine: ", Machine()),
                        absl::StrCat("- commit: ", c.commit.empty() ? "(not given)" : c.commit),
                        absl::StrCat("- command: `", absl::StrJoin(args, " "), "`")};
  return absl::OkStatus();
}

absl::Status WriteReport(const std::string& out, const ReportSpec& spec,
                         const std::vector<RunResult>& runs) {
  const std::filesystem::path dir(out);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out: cannot create '", dir.string(), "': ", ec.message()));
  }
  RenderedReport r = RenderReport(spec, runs);
  auto write = [&](const std::string& name, const std::string& text) -> absl::Status {
    std::ofstream out(dir / name);
    out << text;
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", (dir / name).string()));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = write(spec.title + ".md", r.markdown); !s.ok()) return s;
  if (absl::Status s = write(spec.title + ".json", r.json); !s.ok()) return s;
  for (const auto& [name, svg] : r.svgs) {
    if (absl::Status s = write(name, svg); !s.ok()) return s;
  }
  std::fprintf(stderr, "vamp-bench: wrote %s (raw data: %s, %zu charts)\n",
               (dir / (spec.title + ".md")).string().c_str(),
               (dir / (spec.title + ".json")).string().c_str(), r.svgs.size());
  return absl::OkStatus();
}

int Fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "vamp-bench: %s\n", std::string(s.message()).c_str());
  return code;
}

int RunCommand(int argc, char** argv) {
  // argv[0] is the subcommand here.
  auto invocation =
      ParseInvocation(RunSchema(), "vamp-bench run", kSummary, argc, argv, RunFlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const RunFlags& f = *invocation.options;
  const CommonFlags& c = f.common;
  ClientOptions client;
  ReportSpec spec;
  if (absl::Status s = CommonSetup(c, argc, argv, &client, &spec); !s.ok()) return Fail(s, 2);
  absl::StatusOr<HttpEndpoint> e = ParseHostPort(f.server, "--server");
  if (!e.ok()) return Fail(e.status(), 2);
  e->api_key = client.endpoint.api_key;
  client.endpoint = *e;
  absl::StatusOr<HttpEndpoint> g = ParseHostPort(f.grpc_server, "--grpc_server");
  if (!g.ok()) return Fail(g.status(), 2);
  client.grpc_endpoint = *g;
  absl::StatusOr<workload::Workload> w = BuildWorkload(c.workload, 0, 0, 0);
  if (!w.ok()) return Fail(w.status(), 2);
  spec.workload = DescribeWorkload(c.workload, 0);
  absl::StatusOr<RunResult> r = MeasureRun(*w, client, c.workload.window, c.sample_interval_s);
  if (!r.ok()) return Fail(r.status(), 1);
  r->config = f.label;
  r->sessions = c.workload.sessions;
  if (absl::Status s = WriteReport(c.out, spec, {*r}); !s.ok()) return Fail(s, 1);
  return 0;
}

int AbCommand(int argc, char** argv) {
  auto invocation =
      ParseInvocation(AbSchema(), "vamp-bench ab", kSummary, argc, argv, AbFlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const AbFlags& f = *invocation.options;
  const CommonFlags& c = f.common;
  AbOptions o;
  ReportSpec spec;
  if (absl::Status s = CommonSetup(c, argc, argv, &o.client, &spec); !s.ok()) return Fail(s, 2);
  absl::StatusOr<std::vector<AbConfig>> configs = ParseAbConfigs(f.configs);
  if (!configs.ok()) return Fail(configs.status(), 2);
  o.configs = *configs;
  if (f.sessions_sweep.empty()) {
    o.sessions = {c.workload.sessions};
  } else {
    absl::StatusOr<std::vector<double>> v = ParseList(f.sessions_sweep, "sessions_sweep", 1);
    if (!v.ok()) return Fail(v.status(), 2);
    for (double x : *v) o.sessions.push_back(static_cast<int32_t>(x));
  }
  o.repeats = f.repeats;
  o.rule = c.workload.window;
  o.one_system_per_config = f.one_system_per_config;
  o.sample_interval_s = c.sample_interval_s;
  o.system.controller_binary = FindBinary(f.controller_binary, "vamp-controller", "controller");
  o.system.agent_binary = FindBinary(f.agent_binary, "vamp-agent", "agent");
  o.system.model_path = f.model_path;
  o.system.spawn_agents = f.spawn_agents;
  o.system.flags = SplitFlags(f.system_flags);
  o.system.startup_timeout_s = f.startup_timeout_s;
  o.system.api_key = o.client.endpoint.api_key;
  int32_t vocab = 0;
  if (!f.vocab_size_given) {
    const std::string config_json = o.system.model_path + "/config.json";
    std::ifstream in(config_json);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("vocab_size") ||
        !j["vocab_size"].is_number_integer()) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("--model_path: cannot read vocab_size from '",
                                                  config_json, "' (give --vocab_size)")),
          2);
    }
    vocab = j["vocab_size"].get<int32_t>();
  }
  std::error_code ec;
  std::filesystem::create_directories(c.out + "/logs", ec);
  if (ec) return Fail(absl::InvalidArgumentError("--out: cannot create " + c.out), 2);
  o.log_dir = c.out + "/logs";
  // The ideal hit rate at the sweep's first point, for the hit-rate chart.
  const std::string& model_dir = o.system.model_path;
  if (absl::StatusOr<workload::Workload> w =
          BuildWorkload(c.workload, o.sessions.front(), vocab, 0, model_dir);
      w.ok()) {
    spec.ideal_hit_rate = workload::Summarize(*w, 16).ideal_prefix_hit_ratio;
    spec.ideal_hit_rate_label =
        absl::StrCat("ideal, 16-token blocks, ", o.sessions.front(), " sessions");
  }
  // A sweep of one point describes that point (not --sessions, which the sweep overrides).
  spec.workload =
      DescribeWorkload(c.workload, o.sessions.size() == 1 ? o.sessions.front() : 0, model_dir);
  if (o.sessions.size() > 1) {
    absl::StrAppend(&spec.workload, "; sessions swept over ", absl::StrJoin(o.sessions, ", "));
  }
  spec.header_lines.push_back(
      absl::StrCat("- system: `", o.system.controller_binary, " --model_path=", o.system.model_path,
                   " --spawn_agents=", o.system.spawn_agents, " ", f.system_flags,
                   "` + each configuration's "
                   "flags (full command lines in the JSON)"));
  std::vector<RunResult> done;
  o.on_run = [&](const RunResult& r) {
    if (r.error.empty()) {
      std::fprintf(stderr,
                   "vamp-bench ab: %s, %d sessions: TTFT p50 %.3f s p99 %.3f s, TPOT %.1f ms, "
                   "%.2f req/s, hit rate %.1f%%, preemptions %.0f, peak offload %.0f%%\n",
                   r.config.c_str(), r.sessions, r.stats.ttft_s.p50, r.stats.ttft_s.p99,
                   1e3 * r.stats.tpot_s.mean, r.stats.request_throughput, 100 * r.server.hit_rate,
                   r.server.preemptions, 100 * r.server.peak_offload_ratio);
    }
    done.push_back(r);
    // A partial report after every run, so an interrupted sweep still leaves one.
    absl::Status s = WriteReport(c.out, spec, done);
    if (!s.ok()) std::fprintf(stderr, "vamp-bench ab: %s\n", std::string(s.message()).c_str());
  };
  absl::StatusOr<std::vector<RunResult>> runs = RunAb(o, [&](int32_t sessions, int32_t run) {
    // One system serving several runs: a seed per run, so no run reuses another's prefixes.
    return BuildWorkload(c.workload, sessions, vocab, o.one_system_per_config ? run : 0, model_dir);
  });
  if (!runs.ok()) return Fail(runs.status(), 1);
  for (const RunResult& r : *runs) {
    if (!r.error.empty()) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace vamp::bench

int main(int argc, char** argv) {
  vamp::bench::RaiseFileLimit();
  vamp::bench::InitLibevent();
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "run") return vamp::bench::RunCommand(argc - 1, argv + 1);
  if (command == "ab") return vamp::bench::AbCommand(argc - 1, argv + 1);
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << "Usage: vamp-bench run|ab [flags]   (vamp-bench run --help, vamp-bench ab --help)"
                 "\n\n"
              << vamp::bench::kSummary << "\n";
    return 0;
  }
  std::fprintf(
      stderr, "vamp-bench: %s (expected 'run' or 'ab'; see vamp-bench --help)\n",
      command.empty() ? "no command given" : ("unknown command '" + command + "'").c_str());
  return 2;
}
