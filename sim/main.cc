// vamp-sim: runs a workload under several memory policies (static, VAMP-r, with or without the
// extensions) in virtual time, with the real controller core, and writes a comparison report.
//
//   vamp-sim --workload=multi-turn --concurrency=16,20,24,28 --report=out.md
//   vamp-sim --workload=mooncake --report=mooncake.md
//
// Every flag is listed by --help. Runs are independent and go to --threads worker threads; the
// results do not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "bench/workload/lmcache_trace.h"
#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "sim/calibration.h"
#include "sim/report.h"
#include "sim/sim_config.h"
#include "sim/simulator.h"
#include "tokenizer/hf_tokenizer.h"

namespace vamp::sim {
namespace {

struct Job {
  int32_t concurrency = 0;
  const workload::Workload* workload = nullptr;
  PolicySpec policy;
};

constexpr char kSummary[] =
    "Replays a workload under memory policies (static vs. VAMP-r) with the real scheduler, KV "
    "block pool and arbiters, in virtual time, and reports TTFT, TPOT, throughput, prefix-cache "
    "hit rate, preemptions, decisions and KV pool size over time.";

// `argc` and `argv` go into the report as the command that made it.
absl::Status Run(const SimConfig& config, int argc, char** argv) {
  const std::vector<PolicySpec>& policies = config.policies;
  const SimOptions& options = config.sim;
  const SchedulerConfig& sc = options.scheduler;
  const std::string& kind = config.workload;

  // Workloads.
  std::vector<std::unique_ptr<workload::Workload>> workloads;
  std::vector<int32_t> concurrencies;
  std::vector<std::string> setting;
  if (kind == "multi-turn") {
    concurrencies = config.concurrencies;
    workload::MultiTurnOptions o = config.multi_turn;
    const int32_t tail = config.tail_sessions;
    const double tail_start = config.tail_start_s;
    for (int32_t c : concurrencies) {
      o.concurrency = c;
      VAMP_ASSIGN_OR_RETURN(workload::Workload w, workload::GenerateMultiTurn(o));
      if (config.mix_low_reuse) {
        VAMP_ASSIGN_OR_RETURN(workload::Workload extra,
                              workload::GenerateLowReuse(config.low_reuse));
        for (workload::Session& session : extra.sessions) w.sessions.push_back(std::move(session));
      }
      if (tail > 0) {
        workload::MultiTurnOptions t = o;
        t.concurrency = tail;
        t.seed = o.seed + 1000003;  // text of its own
        VAMP_ASSIGN_OR_RETURN(workload::Workload extra, workload::GenerateMultiTurn(t));
        for (workload::Session& session : extra.sessions) {
          session.id = absl::StrCat("tail-", session.id);
          session.start_s += tail_start;
          w.sessions.push_back(std::move(session));
        }
      }
      workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    }
    const int64_t last = o.first_turn_tokens +
                         static_cast<int64_t>(o.turns - 1) * (o.growth_tokens + o.output_tokens);
    setting.push_back(absl::StrFormat(
        "Workload: in-house multi-turn, c sessions × %d turns, turn 0 = %d tokens, +%d new tokens "
        "and %d output tokens per turn (last prompt %d tokens), think time %.1f s, stagger %.1f s; "
        "TTFT excludes each session's turn 0%s",
        o.turns, o.first_turn_tokens, o.growth_tokens, o.output_tokens, last, o.think_time_s,
        o.stagger_s,
        tail > 0 ? absl::StrFormat("; plus %d sessions of the same shape from t = %.0f s", tail,
                                   tail_start)
                 : ""));
  } else if (kind == "low-reuse") {
    const workload::LowReuseOptions& lr = config.low_reuse;
    VAMP_ASSIGN_OR_RETURN(workload::Workload w, workload::GenerateLowReuse(lr));
    workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    concurrencies.push_back(0);
    setting.push_back(absl::StrFormat(
        "Workload: low-reuse family, %d single-turn requests at %.2f/s (Poisson), prompts %d "
        "tokens ±50 %%, %d output tokens; %.0f %% repeat the leading %.0f %% of an earlier "
        "prompt at a mean distance of %.0f requests",
        lr.num_requests, lr.rate_per_s, lr.prompt_tokens, lr.output_tokens,
        100 * lr.reuse_probability, 100 * lr.reuse_fraction, lr.mean_reuse_distance));
  } else if (kind == "mooncake") {
    const workload::MooncakeOptions& o = config.mooncake;
    VAMP_ASSIGN_OR_RETURN(workload::Workload w,
                          workload::ReadMooncakeTrace(config.mooncake_trace, o));
    workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    concurrencies.push_back(0);
    setting.push_back(absl::StrFormat("Workload: Mooncake trace %s (time scale %g)",
                                      config.mooncake_trace, o.time_scale));
  } else {
    workload::LmcacheOptions o = config.lmcache;
    std::unique_ptr<HfTokenizer> tokenizer;
    if (!config.lmcache_tokenizer_dir.empty()) {
      absl::StatusOr<std::unique_ptr<HfTokenizer>> t =
          HfTokenizer::FromModelFolder(config.lmcache_tokenizer_dir);
      if (!t.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--lmcache_tokenizer_dir '", config.lmcache_tokenizer_dir, "': ", t.status().message()));
      }
      tokenizer = *std::move(t);
      o.tokenizer = tokenizer.get();
    }
    VAMP_ASSIGN_OR_RETURN(workload::Workload w, workload::ReadLmcacheTraces(config.lmcache_dir, o));
    workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    concurrencies.push_back(0);
    setting.push_back(absl::StrFormat(
        "Workload: LMCache agent traces %s, %d sessions, stagger %.1f s, time scale %g, text "
        "through %s",
        config.lmcache_dir, workloads.back()->sessions.size(), o.stagger_s, o.time_scale,
        config.lmcache_tokenizer_dir.empty() ? "about 4 bytes a token"
                                             : "the tokenizer of " + config.lmcache_tokenizer_dir));
  }
  for (size_t i = 0; i < workloads.size(); ++i) {
    const workload::WorkloadSummary sum = workload::Summarize(*workloads[i], sc.block_size);
    setting.push_back(absl::StrFormat(
        "Workload %s: %d sessions, %d turns, %.1f M prompt tokens, %.2f M output tokens, ideal "
        "prefix hit ratio %.1f %%",
        workloads[i]->name, sum.sessions, sum.turns, sum.prompt_tokens * 1e-6,
        sum.output_tokens * 1e-6, 100 * sum.ideal_prefix_hit_ratio));
  }

  // Geometry lines, per distinct cap.
  const SimModelShape& m = options.calibration.model;
  const HardwareCalibration& h = options.calibration.hardware;
  setting.push_back(absl::StrFormat(
      "Model: %s, TP %d, %d experts/layer (top-%d), %d layers (%d with KV); expert shard %.2f MiB, "
      "KV %.1f KiB/token/rank",
      m.name, m.tp_size, m.num_experts, m.top_k, m.num_layers, m.num_kv_layers,
      m.ExpertBytes() / 1048576.0, m.KvBytesPerToken() / 1024.0));
  if (const int64_t state = m.RecurrentStateBytesPerSeq(); state > 0) {
    const int64_t block = m.KvBytesPerToken() * sc.block_size;
    setting.push_back(absl::StrFormat(
        "Recurrent state (linear attention, %d layers): %.1f MiB/sequence/rank; a prefix-cache "
        "snapshot of it takes %d KV blocks",
        m.num_layers - m.num_kv_layers, state / 1048576.0, (state + block - 1) / block));
  }
  setting.push_back(absl::StrFormat(
      "Hardware: %s; weights %.2f TB/s, MoE %.0f TFLOP/s, attention %.0f TFLOP/s, pinned h2d "
      "%.1f GB/s, step overhead %.0f µs, all-reduce %.0f µs + volume at %.0f GB/s",
      h.name, h.weight_read_bytes_per_s * 1e-12, h.moe_flops_per_s * 1e-12,
      h.attention_flops_per_s * 1e-12, h.h2d_bytes_per_s * 1e-9, h.step_overhead_us, h.allreduce_us,
      h.allreduce_bytes_per_s * 1e-9));
  for (const PolicySpec& p : policies) {
    OffloadOptions o = options.offload;
    o.cap = p.offload_cap;
    o.block_size = sc.block_size;
    VAMP_ASSIGN_OR_RETURN(OffloadGeometry g, ComputeOffloadGeometry(m, o));
    if (p.arbiter == "static") {
      setting.push_back(absl::StrFormat(
          "%s: KV pool %.2f GiB/GPU = %d blocks of %d tokens (%.0f KiB/rank), %.2f M tokens",
          p.label, options.offload.base_kv_bytes / static_cast<double>(1 << 30), g.base_blocks(),
          sc.block_size, g.kv_block_bytes / 1024.0,
          g.base_blocks() * static_cast<double>(sc.block_size) * 1e-6));
    } else {
      setting.push_back(absl::StrFormat(
          "%s: group = %d experts (%.0f MiB/layer), one group in %d layers = %.0f MiB = %d blocks; "
          "cap %d experts/layer = %d groups → pool up to %d blocks (%.1f GiB, %.2f× base)",
          p.label, g.experts_per_group, g.group_bytes / 1048576.0, g.eligible_layers,
          g.bytes_per_group() / 1048576.0, g.BlocksWithGroups(1) - g.BlocksWithGroups(0),
          g.max_offload_experts, g.max_groups, g.BlocksWithGroups(g.max_groups),
          g.BlocksWithGroups(g.max_groups) * static_cast<double>(g.kv_block_bytes) / (1LL << 30),
          static_cast<double>(g.BlocksWithGroups(g.max_groups)) / g.base_blocks()));
    }
  }
  setting.push_back(absl::StrFormat(
      "Scheduler: block %d tokens, %d tokens/step, max %d running, max_model_len %d, chunked "
      "prefill %s, prefix caching %s",
      sc.block_size, sc.max_num_batched_tokens, sc.max_num_seqs, sc.max_model_len,
      sc.enable_chunked_prefill ? "on" : "off", sc.enable_prefix_caching ? "on" : "off"));

  // Jobs: every workload under every policy.
  std::vector<Job> jobs;
  for (size_t i = 0; i < workloads.size(); ++i) {
    for (const PolicySpec& p : policies) jobs.push_back({concurrencies[i], workloads[i].get(), p});
  }
  int threads = config.threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(jobs.size()));
  std::vector<absl::StatusOr<SimResult>> results(jobs.size(), absl::UnknownError("not run"));
  std::atomic<size_t> next{0};
  const bool progress = config.progress;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t j = next++; j < jobs.size(); j = next++) {
      SimOptions o = options;
      if (progress) {
        o.progress_label = jobs[j].concurrency > 0
                               ? absl::StrCat(jobs[j].policy.label, " c=", jobs[j].concurrency)
                               : jobs[j].policy.label;
      }
      results[j] = Simulate(*jobs[j].workload, jobs[j].policy, o);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<RunRecord> runs;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!results[j].ok()) {
      return absl::Status(results[j].status().code(),
                          absl::StrCat(jobs[j].policy.label, ": ", results[j].status().message()));
    }
    runs.push_back({jobs[j].concurrency, *std::move(results[j])});
  }
  const bool sweep = kind == "multi-turn";
  if (const std::string& dir = config.decision_log_dir; !dir.empty()) {
    std::filesystem::create_directories(dir);
    for (const RunRecord& run : runs) {
      const std::string name = run.concurrency > 0
                                   ? absl::StrCat(run.result.policy, "-c", run.concurrency, ".log")
                                   : absl::StrCat(run.result.policy, ".log");
      std::ofstream out(std::filesystem::path(dir) / name);
      for (const DecisionLogEntry& e : run.result.recent_decisions) {
        out << DecisionLog::Format(e) << "\n";
      }
      if (!out) return absl::InternalError(absl::StrCat("cannot write decision log in ", dir));
    }
  }
  std::cout << ResultsTable(runs, sweep);
  const double split = config.phase_split_s;
  if (split > 0) std::cout << PhaseTable(runs, sweep, split);
  std::cout << absl::StrFormat("total wall time %.1f s (%d runs, %d threads)\n", wall, runs.size(),
                               threads);

  const std::string& report_path = config.report;
  if (report_path.empty()) return absl::OkStatus();
  ReportSpec spec;
  spec.title =
      config.title.empty() ? absl::StrCat("vamp-sim: ", kind, " on ", m.name) : config.title;
  // The command as a shell takes it, from the repository root (where the build puts the binary).
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = i == 0 ? "build/release/sim/vamp-sim" : argv[i];
    const bool plain = std::all_of(a.begin(), a.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("_-=.,/:+@%", ch);
    });
    args.push_back(plain ? a : absl::StrCat("'", absl::StrReplaceAll(a, {{"'", "'\\''"}}), "'"));
  }
  spec.command = absl::StrJoin(args, " ");
  spec.setting = std::move(setting);
  for (const PolicySpec& p : policies) spec.policies.push_back(p.label);
  if (sweep) spec.concurrencies = concurrencies;
  spec.runs = std::move(runs);
  if (config.paper_figure9) spec.paper = PaperFigure9H100();
  const std::filesystem::path md(report_path);
  spec.svg_prefix = md.stem().string();
  spec.phase_split_s = split;
  spec.exclude_first_turn = options.exclude_first_turn;
  spec.window_ends_before_drain = config.tail_sessions == 0 && !config.mix_low_reuse;
  spec.total_wall_s = wall;
  spec.threads = threads;
  const RenderedReport rendered = RenderReport(spec);
  auto write = [](const std::filesystem::path& path, const std::string& text) -> absl::Status {
    std::ofstream out(path);
    out << text;
    if (!out) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
    return absl::OkStatus();
  };
  VAMP_RETURN_IF_ERROR(write(md, rendered.markdown));
  for (const auto& [name, contents] : rendered.svgs) {
    VAMP_RETURN_IF_ERROR(write(md.parent_path() / name, contents));
  }
  std::cerr << "wrote " << md.string() << " and " << rendered.svgs.size() << " charts\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace vamp::sim

int main(int argc, char** argv) {
  auto invocation =
      vamp::ParseInvocation(vamp::sim::SimConfigSchema(), "vamp-sim", vamp::sim::kSummary, argc,
                            argv, vamp::sim::SimConfigFromConfig);
  if (!invocation.options) return invocation.exit_code;
  absl::Status s = vamp::sim::Run(*invocation.options, argc, argv);
  if (!s.ok()) {
    std::cerr << "vamp-sim: " << s << "\n";
    return 1;
  }
  return 0;
}
