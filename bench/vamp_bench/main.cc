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

void AddCommonFlags(ConfigSchema& s) {
  AddWorkloadFlags(s);
  s.String("out", "", "output folder for the report (<title>.md, .json, SVG charts); required")
      .String("title", "vamp-bench", "report title; files are named after it")
      .String("model", "", "\"model\" field of each request; empty: left out (the only model)")
      .String("api_key_file", "",
              "file holding the API key to send as 'Authorization: Bearer <key>' (one line); "
              "default: $VAMP_API_KEY when set")
      .Enum("protocol", "http", {"http", "grpc"},
            "how requests stream: http (POST /v1/completions, SSE) or grpc (Serving.Generate)")
      .Int("loops", 1, 1, 64, "event-loop threads for the client (sessions are dealt to them)")
      .Double("request_timeout_s", 600, 0.1, 1e6,
              "a request whose server sends nothing for this long fails")
      .Double("max_duration_s", 0, 0, 1e7,
              "cut a run off after this many seconds (unfinished requests count as misses); 0: "
              "run every turn to the end")
      .Double("sample_interval_s", 1.0, 0.05, 3600, "seconds between /metrics scrapes")
      .Bool("progress", true, "print a progress line on stderr once a second")
      .String("slo_ttft_s", "",
              "comma-separated TTFT limits T (s) of the Q(T, P) grid; empty: from the data")
      .String("slo_tpot_ms", "",
              "comma-separated TPOT limits P (ms) of the Q(T, P) grid; empty: from the data")
      .String("commit", "", "commit to print in the report header (e.g. $(git rev-parse HEAD))")
      .Bool("paper_reference", true,
            "draw the paper's numbers on the charts (Table IV TTFT p90/p99 and hit rates, its "
            "+31.1 % TPOT cost, Figure 9's TTFT p99 for multi-turn sweeps); --no-paper_reference: "
            "leave them out");
}

const ConfigSchema& RunSchema() {
  static const ConfigSchema* schema = [] {
    auto* s = new ConfigSchema();
    s->String("server", "127.0.0.1:8000",
              "host:port of the server's HTTP API (its /metrics is sampled; it streams unless "
              "--protocol=grpc)")
        .String("grpc_server", "127.0.0.1:50051",
                "host:port of the server's gRPC Serving API (--protocol=grpc)")
        .String("label", "live", "configuration name of this run in the report");
    AddCommonFlags(*s);
    return s;
  }();
  return *schema;
}

const ConfigSchema& AbSchema() {
  static const ConfigSchema* schema = [] {
    auto* s = new ConfigSchema();
    s->String("configs", "static,vamp",
              "comma-separated configurations: static (--arbiter=static --max_offload_ratio=0), "
              "vamp (shipped "
              "defaults), vamp-R (cap VAMP-R, --max_offload_ratio=R/100), paper / paper-R (the "
              "paper's cost model), or NAME:FLAGS (FLAGS separated by spaces); the first is the "
              "baseline of the comparison")
        .String("sessions_sweep", "",
                "comma-separated values of --sessions to sweep (the multi-turn concurrency); "
                "empty: --sessions alone")
        .Int("repeats", 1, 1, 1000, "runs of each (configuration, sessions) point")
        .String("controller_binary", "",
                "vamp-controller to start; default: next to vamp-bench, or in the build tree")
        .String("agent_binary", "",
                "vamp-agent the controller spawns; default: next to vamp-bench, or in the build "
                "tree")
        .String("model_path", VAMP_BENCH_DEFAULT_MODEL,
                "checkpoint folder (config.json [+ safetensors]); its vocab_size sets the token "
                "range unless --vocab_size is given")
        .Int("spawn_agents", 1, 1, 64, "agents (tensor-parallel ranks) the controller spawns")
        .String("system_flags", "",
                "extra vamp-controller flags for every configuration, separated by spaces (e.g. "
                "'--agent_device=cuda --load_format=dummy --gpu_memory_utilization=0.5')")
        .Bool("one_system_per_config", false,
              "start each configuration's system once and run every sweep point on it (each "
              "point with its own seed, so no prefix carries over); default: a fresh system per "
              "run")
        .Double("startup_timeout_s", 300, 1, 86400,
                "how long a system may take to serve before its configuration is reported failed");
    AddCommonFlags(*s);
    return s;
  }();
  return *schema;
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
absl::Status CommonSetup(const Config& c, int argc, char** argv, ClientOptions* client,
                         ReportSpec* spec) {
  std::string key_file = c.GetString("api_key_file");
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
  client->model = c.GetString("model");
  client->protocol =
      c.GetString("protocol") == "grpc" ? StreamProtocol::kGrpc : StreamProtocol::kHttp;
  client->loops = static_cast<int32_t>(c.GetInt("loops"));
  client->request_timeout_s = c.GetDouble("request_timeout_s");
  client->max_duration_s = c.GetDouble("max_duration_s");
  client->progress = c.GetBool("progress");
  if (c.GetString("out").empty()) return absl::InvalidArgumentError("--out: required");
  spec->title = c.GetString("title");
  spec->svg_prefix = c.GetString("title");
  absl::StatusOr<std::vector<double>> t = ParseList(c.GetString("slo_ttft_s"), "slo_ttft_s", 1);
  if (!t.ok()) return t.status();
  absl::StatusOr<std::vector<double>> p =
      ParseList(c.GetString("slo_tpot_ms"), "slo_tpot_ms", 1e-3);
  if (!p.ok()) return p.status();
  spec->ttft_limits_s = *t;
  spec->tpot_limits_s = *p;
  spec->paper_reference = c.GetBool("paper_reference");
  spec->multi_turn_sweep = c.GetString("workload") == "multi_turn";
  std::vector<std::string> args(argv, argv + argc);
  spec->header_lines = {
      absl::StrCat("- date: ", Now()), absl::StrCat("- machine: ", Machine()),
      absl::StrCat("- commit: ",
                   c.GetString("commit").empty() ? "(not given)" : c.GetString("commit")),
      absl::StrCat("- command: `", absl::StrJoin(args, " "), "`")};
  return absl::OkStatus();
}

absl::Status WriteReport(const Config& c, const ReportSpec& spec,
                         const std::vector<RunResult>& runs) {
  const std::filesystem::path dir(c.GetString("out"));
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

absl::StatusOr<CommandLine> Parse(const ConfigSchema& schema, const char* name, int argc,
                                  char** argv) {
  // argv[0] is the subcommand here.
  return ParseCommandLine(schema, argc, argv);
}

int Fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "vamp-bench: %s\n", std::string(s.message()).c_str());
  return code;
}

int RunCommand(int argc, char** argv) {
  absl::StatusOr<CommandLine> cli = Parse(RunSchema(), "run", argc, argv);
  if (!cli.ok()) return Fail(cli.status(), 2);
  if (cli->help_requested) {
    std::cout << RunSchema().HelpText("vamp-bench run", kSummary);
    return 0;
  }
  const Config& c = cli->config;
  ClientOptions client;
  ReportSpec spec;
  if (absl::Status s = CommonSetup(c, argc, argv, &client, &spec); !s.ok()) return Fail(s, 2);
  absl::StatusOr<HttpEndpoint> e = ParseHostPort(c.GetString("server"), "--server");
  if (!e.ok()) return Fail(e.status(), 2);
  e->api_key = client.endpoint.api_key;
  client.endpoint = *e;
  absl::StatusOr<HttpEndpoint> g = ParseHostPort(c.GetString("grpc_server"), "--grpc_server");
  if (!g.ok()) return Fail(g.status(), 2);
  client.grpc_endpoint = *g;
  absl::StatusOr<workload::Workload> w = BuildWorkload(c, 0, 0, 0);
  if (!w.ok()) return Fail(w.status(), 2);
  spec.workload = DescribeWorkload(c, 0);
  absl::StatusOr<RunResult> r =
      MeasureRun(*w, client, WindowRuleFor(c), c.GetDouble("sample_interval_s"));
  if (!r.ok()) return Fail(r.status(), 1);
  r->config = c.GetString("label");
  r->sessions = static_cast<int32_t>(c.GetInt("sessions"));
  if (absl::Status s = WriteReport(c, spec, {*r}); !s.ok()) return Fail(s, 1);
  return 0;
}

int AbCommand(int argc, char** argv) {
  absl::StatusOr<CommandLine> cli = Parse(AbSchema(), "ab", argc, argv);
  if (!cli.ok()) return Fail(cli.status(), 2);
  if (cli->help_requested) {
    std::cout << AbSchema().HelpText("vamp-bench ab", kSummary);
    return 0;
  }
  const Config& c = cli->config;
  AbOptions o;
  ReportSpec spec;
  if (absl::Status s = CommonSetup(c, argc, argv, &o.client, &spec); !s.ok()) return Fail(s, 2);
  absl::StatusOr<std::vector<AbConfig>> configs = ParseAbConfigs(c.GetString("configs"));
  if (!configs.ok()) return Fail(configs.status(), 2);
  o.configs = *configs;
  if (c.GetString("sessions_sweep").empty()) {
    o.sessions = {static_cast<int32_t>(c.GetInt("sessions"))};
  } else {
    absl::StatusOr<std::vector<double>> v =
        ParseList(c.GetString("sessions_sweep"), "sessions_sweep", 1);
    if (!v.ok()) return Fail(v.status(), 2);
    for (double x : *v) o.sessions.push_back(static_cast<int32_t>(x));
  }
  o.repeats = static_cast<int32_t>(c.GetInt("repeats"));
  o.rule = WindowRuleFor(c);
  o.one_system_per_config = c.GetBool("one_system_per_config");
  o.sample_interval_s = c.GetDouble("sample_interval_s");
  o.system.controller_binary =
      FindBinary(c.GetString("controller_binary"), "vamp-controller", "controller");
  o.system.agent_binary = FindBinary(c.GetString("agent_binary"), "vamp-agent", "agent");
  o.system.model_path = c.GetString("model_path");
  o.system.spawn_agents = static_cast<int32_t>(c.GetInt("spawn_agents"));
  o.system.flags = SplitFlags(c.GetString("system_flags"));
  o.system.startup_timeout_s = c.GetDouble("startup_timeout_s");
  o.system.api_key = o.client.endpoint.api_key;
  int32_t vocab = 0;
  if (!c.IsSet("vocab_size")) {
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
  std::filesystem::create_directories(c.GetString("out") + "/logs", ec);
  if (ec) return Fail(absl::InvalidArgumentError("--out: cannot create " + c.GetString("out")), 2);
  o.log_dir = c.GetString("out") + "/logs";
  // The ideal hit rate at the sweep's first point, for the hit-rate chart.
  const std::string& model_dir = o.system.model_path;
  if (absl::StatusOr<workload::Workload> w =
          BuildWorkload(c, o.sessions.front(), vocab, 0, model_dir);
      w.ok()) {
    spec.ideal_hit_rate = workload::Summarize(*w, 16).ideal_prefix_hit_ratio;
    spec.ideal_hit_rate_label =
        absl::StrCat("ideal, 16-token blocks, ", o.sessions.front(), " sessions");
  }
  spec.workload = DescribeWorkload(c, 0, model_dir);
  if (o.sessions.size() > 1) {
    absl::StrAppend(&spec.workload, "; sessions swept over ", absl::StrJoin(o.sessions, ", "));
  }
  spec.header_lines.push_back(
      absl::StrCat("- system: `", o.system.controller_binary, " --model_path=", o.system.model_path,
                   " --spawn_agents=", o.system.spawn_agents, " ", c.GetString("system_flags"),
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
    absl::Status s = WriteReport(c, spec, done);
    if (!s.ok()) std::fprintf(stderr, "vamp-bench ab: %s\n", std::string(s.message()).c_str());
  };
  absl::StatusOr<std::vector<RunResult>> runs = RunAb(o, [&](int32_t sessions, int32_t run) {
    // One system serving several runs: a seed per run, so no run reuses another's prefixes.
    return BuildWorkload(c, sessions, vocab, o.one_system_per_config ? run : 0, model_dir);
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
