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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/workload/lmcache_trace.h"
#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "sim/calibration.h"
#include "sim/report.h"
#include "sim/simulator.h"
#include "tokenizer/hf_tokenizer.h"

namespace vamp::sim {
namespace {

constexpr int64_t kInt32Max = 2147483647;

ConfigSchema Schema() {
  ConfigSchema s;
  s.Enum("workload", "multi-turn", {"multi-turn", "mooncake", "lmcache", "low-reuse"},
         "Workload to replay")
      .String("policies", "static,vamp-10,vamp-15,vamp-20,vamp-25",
              "Comma-separated policies: static, vamp-<r> (offload cap r %), with optional "
              "+restore / +calib (e.g. vamp-25+restore+calib)")
      // Model and hardware.
      .String("calibration", "qwen3-next-80b-a3b-h100-tp2",
              "Calibration preset (qwen3-30b-a3b, qwen3-next-80b-a3b-tp2, "
              "qwen3-next-80b-a3b-h100-tp2)")
      .String("calibration_file", "",
              "JSON calibration applied over the preset (sim/calibration.h)")
      .Double("kv_pool_gib", 8.0, 1e-6, 1e6, "Baseline KV pool per GPU (GiB)")
      .Double("page_mib", 2.0, 1.0 / 1024, 1024, "VMM page size (MiB)")
      .Int("staging_buffer_experts", 0, 0, kInt32Max,
           "E_buffer: experts a staging buffer holds (0 = what the cap needs)")
      .Double("remap_us_per_group_layer", RemapCosts{}.per_group_layer_micros, 0, 1e9,
              "Virtual time to remap one group in one layer (µs)")
      // Scheduler.
      .Int("block_size", 16, 1, 4096, "Tokens per KV block")
      .Int("max_num_batched_tokens", 8192, 1, kInt32Max, "Token budget per step")
      .Int("max_num_seqs", 128, 1, kInt32Max, "Most running requests (paper, H100: 128)")
      .Int("max_model_len", 262144, 2, kInt32Max, "Most tokens per request")
      .Int("long_prefill_token_threshold", 0, 0, kInt32Max,
           "Most prefill tokens of one request per step (0 = no limit)")
      .Bool("enable_prefix_caching", true, "Prefix caching")
      .Bool("enable_chunked_prefill", true, "Chunked prefill")
      // In-house multi-turn workload.
      .String("concurrency", "16,20,24,28", "multi-turn: comma-separated session counts to sweep")
      .Int("turns", 12, 1, kInt32Max, "multi-turn: turns per session")
      .Int("first_turn_tokens", 8192, 1, kInt32Max, "multi-turn: prompt tokens of turn 0")
      .Int("growth_tokens", 6144, 0, kInt32Max,
           "multi-turn: new tokens added each later turn (6144 puts the paper's H100 capacity "
           "boundaries at the concurrencies Figure 9 shows)")
      .Int("output_tokens", 256, 1, kInt32Max, "multi-turn: tokens generated per turn")
      .Double("think_time_s", 2.0, 0, 1e9, "multi-turn: pause between a turn's end and the next")
      .Double("stagger_s", 0.0, 0, 1e9, "multi-turn: session k starts at k × stagger_s")
      .Int("shared_system_tokens", 0, 0, kInt32Max,
           "multi-turn: system-prompt tokens shared by all sessions")
      .Int("workload_seed", 1, 0, kInt32Max, "Seed of synthetic prompts")
      .Int("tail_sessions", 0, 0, kInt32Max,
           "multi-turn: extra sessions of the same shape starting at tail_start_s (a lighter "
           "second phase, e.g. to measure restore)")
      .Double("tail_start_s", 0, 0, 1e9, "multi-turn: when the tail sessions start")
      // Low-reuse family (bench/workload/low_reuse_generator.h).
      .Int("low_reuse_requests", 2000, 1, kInt32Max, "low-reuse: requests")
      .Double("low_reuse_rate", 2.0, 1e-6, 1e6, "low-reuse: arrivals per second (Poisson)")
      .Int("low_reuse_prompt_tokens", 8192, 1, kInt32Max, "low-reuse: mean prompt tokens")
      .Int("low_reuse_output_tokens", 128, 1, kInt32Max, "low-reuse: output tokens per request")
      .Double("low_reuse_probability", 0.3, 0, 1,
              "low-reuse: share of requests that repeat an earlier request's prefix")
      .Double("low_reuse_fraction", 0.5, 0, 1, "low-reuse: share of the prompt repeated")
      .Double("low_reuse_distance", 200, 1, 1e9,
              "low-reuse: mean reuse distance in requests (exponential)")
      .Double("low_reuse_start_s", 0, 0, 1e9,
              "low-reuse: arrival of the first request; with --workload=multi-turn and "
              "--mix_low_reuse, when the low-reuse phase starts")
      .Bool("mix_low_reuse", false,
            "multi-turn: add the low-reuse requests (low_reuse_* flags) to the sessions, for a "
            "workload that alternates high- and low-reuse phases (with tail_sessions)")
      // Traces.
      .String("mooncake_trace", "../shared/traces/mooncake/synthetic_trace.jsonl",
              "mooncake: trace file (JSONL)")
      .Int("mooncake_max_requests", 0, 0, kInt32Max, "mooncake: first N records only (0 = all)")
      .Double("mooncake_time_scale", 1.0, 1e-6, 1e6,
              "mooncake: multiply inter-arrival times (0.5 = twice the load)")
      .String("lmcache_dir", "../shared/traces/lmcache-agent-trace/miniswe",
              "lmcache: folder of session files")
      .Int("lmcache_sessions", 0, 0, kInt32Max, "lmcache: sessions to replay (0 = all files)")
      .Double("lmcache_stagger_s", 5.0, 0, 1e9, "lmcache: session k starts at k × stagger")
      .Double("lmcache_time_scale", 1.0, 1e-6, 1e6, "lmcache: multiply recorded gaps")
      .String("lmcache_tokenizer_dir", "",
              "lmcache: a model folder whose tokenizer.json turns the traces' text into the "
              "model's token ids (empty: about 4 bytes a token)")
      .Double("lmcache_max_session_s", 0, 0, 1e9,
              "lmcache: drop calls later than this in their session (0 = none)")
      // Measurement.
      .Enum("exclude_first_turn", "auto", {"auto", "yes", "no"},
            "Leave each session's turn 0 out of TTFT (auto: yes for multi-turn)")
      .Double("max_time_s", 0, 0, 1e12, "Stop at this virtual time (0 = when all turns are done)")
      .Double("sample_interval_s", 5.0, 1e-3, 1e9, "Time-series resolution (virtual s)")
      .Int("seed", 1, 0, kInt32Max, "Seed of the simulated agents' tokens")
      .Int("threads", 0, 0, 1024, "Worker threads (0 = one per core)")
      .Bool("progress", true, "Progress lines on stderr")
      .Double("progress_interval_s", 5.0, 0.1, 1e6, "Wall seconds between progress lines")
      // Output.
      .String("report", "", "Markdown report to write (SVG charts next to it); empty = none")
      .String("decision_log_dir", "",
              "Write the newest arbiter decisions of each run to <dir>/<policy>[-c<c>].log")
      .Int("decision_log_entries", 256, 1, kInt32Max, "Decisions kept per run for the log")
      .String("title", "", "Report title (default: derived from the workload)")
      .Double("phase_split_s", 0, 0, 1e12,
              "Also report the turns arriving at or after this virtual time (0 = no)")
      .Bool("paper_figure9", false,
            "Show the paper's Figure 9 (H100 TP2) TTFT p99 numbers next to the sweep");
  AddVampArbiterConfigFields(s);
  return s;
}

absl::StatusOr<std::vector<int32_t>> ParseList(const std::string& text) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field 'concurrency': '", part, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError("config field 'concurrency': empty list");
  return out;
}

workload::LowReuseOptions LowReuseFromConfig(const Config& config, int32_t vocab) {
  workload::LowReuseOptions o;
  o.num_requests = static_cast<int32_t>(config.GetInt("low_reuse_requests"));
  o.rate_per_s = config.GetDouble("low_reuse_rate");
  o.prompt_tokens = static_cast<int32_t>(config.GetInt("low_reuse_prompt_tokens"));
  o.output_tokens = static_cast<int32_t>(config.GetInt("low_reuse_output_tokens"));
  o.reuse_probability = config.GetDouble("low_reuse_probability");
  o.reuse_fraction = config.GetDouble("low_reuse_fraction");
  o.mean_reuse_distance = config.GetDouble("low_reuse_distance");
  o.start_s = config.GetDouble("low_reuse_start_s");
  o.vocab_size = vocab;
  o.seed = static_cast<uint64_t>(config.GetInt("workload_seed")) + 7919;
  return o;
}

struct Job {
  int32_t concurrency = 0;
  const workload::Workload* workload = nullptr;
  PolicySpec policy;
};

absl::Status Main(int argc, char** argv) {
  const ConfigSchema schema = Schema();
  VAMP_ASSIGN_OR_RETURN(CommandLine cl, ParseCommandLine(schema, argc, argv));
  if (cl.version_requested) {
    std::cout << "vamp-sim " << kVersion << "\n";
    return absl::OkStatus();
  }
  if (cl.help_requested) {
    std::cout << schema.HelpText(
        "vamp-sim",
        "Replays a workload under memory policies (static vs. VAMP-r) with the real scheduler, "
        "KV block pool and arbiters, in virtual time, and reports TTFT, TPOT, throughput, "
        "prefix-cache hit rate, preemptions, decisions and KV pool size over time.");
    return absl::OkStatus();
  }
  const Config& config = cl.config;
  VAMP_ASSIGN_OR_RETURN(VampArbiterConfig vamp, VampArbiterConfigFromConfig(config));
  std::vector<PolicySpec> policies;
  for (absl::string_view p : absl::StrSplit(config.GetString("policies"), ',', absl::SkipEmpty())) {
    VAMP_ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicy(p, vamp));
    policies.push_back(std::move(spec));
  }
  if (policies.empty()) return absl::InvalidArgumentError("config field 'policies': empty list");

  SimOptions options;
  VAMP_ASSIGN_OR_RETURN(options.calibration, CalibrationPreset(config.GetString("calibration")));
  if (!config.GetString("calibration_file").empty()) {
    VAMP_ASSIGN_OR_RETURN(options.calibration, LoadCalibration(config.GetString("calibration_file"),
                                                               options.calibration));
  }
  SchedulerConfig& sc = options.scheduler;
  sc.block_size = static_cast<int32_t>(config.GetInt("block_size"));
  sc.max_num_batched_tokens = static_cast<int32_t>(config.GetInt("max_num_batched_tokens"));
  sc.max_num_seqs = static_cast<int32_t>(config.GetInt("max_num_seqs"));
  sc.max_model_len = static_cast<int32_t>(config.GetInt("max_model_len"));
  sc.long_prefill_token_threshold =
      static_cast<int32_t>(config.GetInt("long_prefill_token_threshold"));
  sc.enable_prefix_caching = config.GetBool("enable_prefix_caching");
  sc.enable_chunked_prefill = config.GetBool("enable_chunked_prefill");
  options.offload.base_kv_bytes =
      static_cast<int64_t>(config.GetDouble("kv_pool_gib") * static_cast<double>(1LL << 30));
  options.offload.page_bytes =
      static_cast<int64_t>(config.GetDouble("page_mib") * static_cast<double>(1 << 20));
  options.offload.staging_buffer_experts =
      static_cast<int32_t>(config.GetInt("staging_buffer_experts"));
  options.remap.per_group_layer_micros = config.GetDouble("remap_us_per_group_layer");
  options.remap.h2d_bytes_per_s = options.calibration.hardware.h2d_bytes_per_s;
  options.max_time_s = config.GetDouble("max_time_s");
  options.sample_interval_s = config.GetDouble("sample_interval_s");
  options.seed = static_cast<uint64_t>(config.GetInt("seed"));
  options.progress_interval_s = config.GetDouble("progress_interval_s");
  options.decision_log_capacity = static_cast<size_t>(config.GetInt("decision_log_entries"));
  const std::string kind = config.GetString("workload");
  const std::string exclude = config.GetString("exclude_first_turn");
  options.exclude_first_turn = exclude == "yes" || (exclude == "auto" && kind == "multi-turn");

  // Workloads.
  std::vector<std::unique_ptr<workload::Workload>> workloads;
  std::vector<int32_t> concurrencies;
  std::vector<std::string> setting;
  const int32_t vocab = options.calibration.model.vocab;
  if (kind == "multi-turn") {
    VAMP_ASSIGN_OR_RETURN(concurrencies, ParseList(config.GetString("concurrency")));
    workload::MultiTurnOptions o;
    o.turns = static_cast<int32_t>(config.GetInt("turns"));
    o.first_turn_tokens = static_cast<int32_t>(config.GetInt("first_turn_tokens"));
    o.growth_tokens = static_cast<int32_t>(config.GetInt("growth_tokens"));
    o.output_tokens = static_cast<int32_t>(config.GetInt("output_tokens"));
    o.think_time_s = config.GetDouble("think_time_s");
    o.stagger_s = config.GetDouble("stagger_s");
    o.shared_system_tokens = static_cast<int32_t>(config.GetInt("shared_system_tokens"));
    o.vocab_size = vocab;
    o.seed = static_cast<uint64_t>(config.GetInt("workload_seed"));
    const int32_t tail = static_cast<int32_t>(config.GetInt("tail_sessions"));
    const double tail_start = config.GetDouble("tail_start_s");
    for (int32_t c : concurrencies) {
      o.concurrency = c;
      VAMP_ASSIGN_OR_RETURN(workload::Workload w, workload::GenerateMultiTurn(o));
      if (config.GetBool("mix_low_reuse")) {
        workload::LowReuseOptions lr = LowReuseFromConfig(config, vocab);
        VAMP_ASSIGN_OR_RETURN(workload::Workload extra, workload::GenerateLowReuse(lr));
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
        config.GetInt("tail_sessions") > 0
            ? absl::StrFormat("; plus %d sessions of the same shape from t = %.0f s",
                              config.GetInt("tail_sessions"), config.GetDouble("tail_start_s"))
            : ""));
  } else if (kind == "low-reuse") {
    const workload::LowReuseOptions lr = LowReuseFromConfig(config, vocab);
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
    workload::MooncakeOptions o;
    o.vocab_size = vocab;
    o.max_requests = config.GetInt("mooncake_max_requests");
    o.time_scale = config.GetDouble("mooncake_time_scale");
    VAMP_ASSIGN_OR_RETURN(workload::Workload w,
                          workload::ReadMooncakeTrace(config.GetString("mooncake_trace"), o));
    workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    concurrencies.push_back(0);
    setting.push_back(absl::StrFormat("Workload: Mooncake trace %s (time scale %g)",
                                      config.GetString("mooncake_trace"), o.time_scale));
  } else {
    workload::LmcacheOptions o;
    o.vocab_size = vocab;
    o.num_sessions = static_cast<int32_t>(config.GetInt("lmcache_sessions"));
    o.stagger_s = config.GetDouble("lmcache_stagger_s");
    o.time_scale = config.GetDouble("lmcache_time_scale");
    o.max_session_duration_s = config.GetDouble("lmcache_max_session_s");
    const std::string& tokenizer_dir = config.GetString("lmcache_tokenizer_dir");
    std::unique_ptr<HfTokenizer> tokenizer;
    if (!tokenizer_dir.empty()) {
      absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromModelFolder(tokenizer_dir);
      if (!t.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--lmcache_tokenizer_dir '", tokenizer_dir, "': ", t.status().message()));
      }
      tokenizer = *std::move(t);
      o.tokenizer = tokenizer.get();
    }
    VAMP_ASSIGN_OR_RETURN(workload::Workload w,
                          workload::ReadLmcacheTraces(config.GetString("lmcache_dir"), o));
    workloads.push_back(std::make_unique<workload::Workload>(std::move(w)));
    concurrencies.push_back(0);
    setting.push_back(absl::StrFormat(
        "Workload: LMCache agent traces %s, %d sessions, stagger %.1f s, time scale %g, text "
        "through %s",
        config.GetString("lmcache_dir"), workloads.back()->sessions.size(), o.stagger_s,
        o.time_scale,
        tokenizer_dir.empty() ? "about 4 bytes a token" : "the tokenizer of " + tokenizer_dir));
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
  setting.push_back(absl::StrFormat(
      "Hardware: %s; weights %.2f TB/s, MoE %.0f TFLOP/s, attention %.0f TFLOP/s, pinned h2d "
      "%.1f GB/s, step overhead %.0f µs, all-reduce %.0f µs + volume at %.0f GB/s",
      h.name, h.weight_read_bytes_per_s * 1e-12, h.moe_flops_per_s * 1e-12,
      h.attention_flops_per_s * 1e-12, h.h2d_bytes_per_s * 1e-9, h.step_overhead_us, h.allreduce_us,
      h.allreduce_bytes_per_s * 1e-9));
  for (const PolicySpec& p : policies) {
    OffloadOptions o = options.offload;
    o.max_offload_ratio = p.max_offload_ratio;
    o.block_size = sc.block_size;
    VAMP_ASSIGN_OR_RETURN(OffloadGeometry g, ComputeOffloadGeometry(m, o));
    if (p.arbiter == "static") {
      setting.push_back(absl::StrFormat(
          "%s: KV pool %.2f GiB/GPU = %d blocks of %d tokens (%.0f KiB/rank), %.2f M tokens",
          p.label, config.GetDouble("kv_pool_gib"), g.base_blocks(), sc.block_size,
          g.kv_block_bytes / 1024.0, g.base_blocks() * static_cast<double>(sc.block_size) * 1e-6));
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
  int threads = static_cast<int>(config.GetInt("threads"));
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(jobs.size()));
  std::vector<absl::StatusOr<SimResult>> results(jobs.size(), absl::UnknownError("not run"));
  std::atomic<size_t> next{0};
  const bool progress = config.GetBool("progress");
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
  if (const std::string dir = config.GetString("decision_log_dir"); !dir.empty()) {
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
  const double split = config.GetDouble("phase_split_s");
  if (split > 0) std::cout << PhaseTable(runs, sweep, split);
  std::cout << absl::StrFormat("total wall time %.1f s (%d runs, %d threads)\n", wall, runs.size(),
                               threads);

  const std::string report_path = config.GetString("report");
  if (report_path.empty()) return absl::OkStatus();
  ReportSpec spec;
  spec.title = config.GetString("title").empty() ? absl::StrCat("vamp-sim: ", kind, " on ", m.name)
                                                 : config.GetString("title");
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
  if (config.GetBool("paper_figure9")) spec.paper = PaperFigure9H100();
  const std::filesystem::path md(report_path);
  spec.svg_prefix = md.stem().string();
  spec.phase_split_s = split;
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
  absl::Status s = vamp::sim::Main(argc, argv);
  if (!s.ok()) {
    std::cerr << "vamp-sim: " << s << "\n";
    return 1;
  }
  return 0;
}
