#include "sim/sim_config.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "sim/calibration.h"

namespace vamp::sim {
namespace {

constexpr int64_t kInt32Max = 2147483647;
constexpr double kGiB = 1 << 30;
constexpr double kMiB = 1 << 20;
// Added to workload_seed for the low-reuse requests, so that they never repeat the sessions' text.
constexpr uint64_t kLowReuseSeedOffset = 7919;

absl::StatusOr<std::vector<int32_t>> ParseConcurrencies(const std::string& text) {
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

void DeclareSimFlags(ConfigSchema& s) {
  const SimConfig d;
  const SchedulerConfig& sc = d.sim.scheduler;
  const workload::MultiTurnOptions& mt = d.multi_turn;
  const workload::LowReuseOptions& lr = d.low_reuse;
  s.Enum("workload", d.workload, {"multi-turn", "mooncake", "lmcache", "low-reuse"},
         "Workload to replay")
      .String("policies", "static,vamp-10,vamp-15,vamp-20,vamp-25",
              "Comma-separated policies: static, vamp-<r> (offload cap r %), with optional "
              "+restore / +calib (e.g. vamp-25+restore+calib)")
      // Model and hardware.
      .String("calibration", d.calibration,
              "Calibration preset (qwen3-30b-a3b, qwen3-next-80b-a3b-tp2, "
              "qwen3-next-80b-a3b-h100-tp2, qwen3-next-80b-a3b-24l)")
      .String("calibration_file", d.calibration_file,
              "JSON calibration applied over the preset (sim/calibration.h)")
      .Double("kv_pool_gib", d.sim.offload.base_kv_bytes / kGiB, 1e-6, 1e6,
              "Baseline KV pool per GPU (GiB)")
      .Double("page_mib", d.sim.offload.page_bytes / kMiB, 1.0 / 1024, 1024, "VMM page size (MiB)")
      .Int("staging_buffer_experts", d.sim.offload.staging_buffer_experts, 0, kInt32Max,
           "E_buffer: experts a staging buffer holds (0 = what the cap needs)")
      .Enum("staging", "routed", {"whole", "routed", "routed_prefetch"},
            "What a staged step copies: whole (every offloaded byte behind compute), routed "
            "(the engine's routed staging: steps of at most --routed_staging_max_tokens copy "
            "only the experts their tokens route to, not hidden behind compute; larger ones the "
            "whole region) or routed_prefetch (every step copies only its routed experts, hidden "
            "behind compute: a what-if upper bound for predicting the next layer's experts)")
      .Int("routed_staging_max_tokens", d.sim.routed_staging_max_tokens, 0, kInt32Max,
           "With --staging=routed: the largest step (tokens) that copies only its routed "
           "experts, as the agent's flag of that name")
      .Int("snapshot_blocks", d.sim.snapshot_blocks, -1, kInt32Max,
           "Models with recurrent state: KV blocks a snapshot of it takes (-1: the engine's, the "
           "state's bytes over a KV block's; smaller: the what-if of keeping snapshots outside the "
           "KV pool, at the same hit points)")
      .Double("remap_us_per_group_layer", d.sim.remap.per_group_layer_micros, 0, 1e9,
              "Virtual time to remap one group in one layer (µs)")
      // Scheduler.
      .Int("block_size", sc.block_size, 1, 4096, "Tokens per KV block")
      .Int("max_num_batched_tokens", sc.max_num_batched_tokens, 1, kInt32Max,
           "Token budget per step")
      .Int("max_num_seqs", sc.max_num_seqs, 1, kInt32Max,
           "Most running requests (paper, H100: 128)")
      .Int("max_model_len", sc.max_model_len, 2, kInt32Max, "Most tokens per request")
      .Int("long_prefill_token_threshold", sc.long_prefill_token_threshold, 0, kInt32Max,
           "Most prefill tokens of one request per step (0 = no limit)")
      .Bool("enable_prefix_caching", sc.enable_prefix_caching, "Prefix caching")
      .Bool("snapshot_outputs", sc.snapshot_outputs,
            "Models with recurrent state: also keep a state snapshot at the last block boundary "
            "each output reaches (where a conversation's next turn continues), at one snapshot's "
            "blocks per running request")
      .Bool("admit_within_baseline", sc.admit_within_baseline,
            "While the arbiter finds the GPU compute-bound, admit new requests only while the "
            "running requests' KV fits the static pool (the offloaded groups serve cached "
            "prefixes and running requests' growth)")
      .Bool("enable_chunked_prefill", sc.enable_chunked_prefill, "Chunked prefill")
      // In-house multi-turn workload.
      .String("concurrency", absl::StrJoin(d.concurrencies, ","),
              "multi-turn: comma-separated session counts to sweep")
      .Int("turns", mt.turns, 1, kInt32Max, "multi-turn: turns per session")
      .Int("first_turn_tokens", mt.first_turn_tokens, 1, kInt32Max,
           "multi-turn: prompt tokens of turn 0")
      .Int("growth_tokens", mt.growth_tokens, 0, kInt32Max,
           "multi-turn: new tokens added each later turn (6144 puts the paper's H100 capacity "
           "boundaries at the concurrencies Figure 9 shows)")
      .Int("output_tokens", mt.output_tokens, 1, kInt32Max, "multi-turn: tokens generated per turn")
      .Double("think_time_s", mt.think_time_s, 0, 1e9,
              "multi-turn: pause between a turn's end and the next")
      .Double("stagger_s", mt.stagger_s, 0, 1e9, "multi-turn: session k starts at k × stagger_s")
      .Int("shared_system_tokens", mt.shared_system_tokens, 0, kInt32Max,
           "multi-turn: system-prompt tokens shared by all sessions")
      .Int("workload_seed", static_cast<int64_t>(mt.seed), 0, kInt32Max,
           "Seed of synthetic prompts")
      .Int("tail_sessions", d.tail_sessions, 0, kInt32Max,
           "multi-turn: extra sessions of the same shape starting at tail_start_s (a lighter "
           "second phase, e.g. to measure restore)")
      .Double("tail_start_s", d.tail_start_s, 0, 1e9, "multi-turn: when the tail sessions start")
      // Low-reuse family (bench/workload/low_reuse_generator.h).
      .Int("low_reuse_requests", lr.num_requests, 1, kInt32Max, "low-reuse: requests")
      .Double("low_reuse_rate", lr.rate_per_s, 1e-6, 1e6,
              "low-reuse: arrivals per second (Poisson)")
      .Int("low_reuse_prompt_tokens", lr.prompt_tokens, 1, kInt32Max,
           "low-reuse: mean prompt tokens")
      .Int("low_reuse_output_tokens", lr.output_tokens, 1, kInt32Max,
           "low-reuse: output tokens per request")
      .Double("low_reuse_probability", lr.reuse_probability, 0, 1,
              "low-reuse: share of requests that repeat an earlier request's prefix")
      .Double("low_reuse_fraction", lr.reuse_fraction, 0, 1,
              "low-reuse: share of the prompt repeated")
      .Double("low_reuse_distance", lr.mean_reuse_distance, 1, 1e9,
              "low-reuse: mean reuse distance in requests (exponential)")
      .Double("low_reuse_start_s", lr.start_s, 0, 1e9,
              "low-reuse: arrival of the first request; with --workload=multi-turn and "
              "--mix_low_reuse, when the low-reuse phase starts")
      .Bool("mix_low_reuse", d.mix_low_reuse,
            "multi-turn: add the low-reuse requests (low_reuse_* flags) to the sessions, for a "
            "workload that alternates high- and low-reuse phases (with tail_sessions)")
      // Traces.
      .String("mooncake_trace", d.mooncake_trace, "mooncake: trace file (JSONL)")
      .Int("mooncake_max_requests", d.mooncake.max_requests, 0, kInt32Max,
           "mooncake: first N records only (0 = all)")
      .Double("mooncake_time_scale", d.mooncake.time_scale, 1e-6, 1e6,
              "mooncake: multiply inter-arrival times (0.5 = twice the load)")
      .String("lmcache_dir", d.lmcache_dir, "lmcache: folder of session files")
      .Int("lmcache_sessions", d.lmcache.num_sessions, 0, kInt32Max,
           "lmcache: sessions to replay (0 = all files)")
      .Double("lmcache_stagger_s", d.lmcache.stagger_s, 0, 1e9,
              "lmcache: session k starts at k × stagger")
      .Double("lmcache_time_scale", d.lmcache.time_scale, 1e-6, 1e6,
              "lmcache: multiply recorded gaps")
      .String("lmcache_tokenizer_dir", d.lmcache_tokenizer_dir,
              "lmcache: a model folder whose tokenizer.json turns the traces' text into the "
              "model's token ids (empty: about 4 bytes a token)")
      .Double("lmcache_max_session_s", d.lmcache.max_session_duration_s, 0, 1e9,
              "lmcache: drop calls later than this in their session (0 = none)")
      // Measurement.
      .Enum("exclude_first_turn", "auto", {"auto", "yes", "no"},
            "Leave each session's turn 0 out of TTFT (auto: yes for multi-turn)")
      .Double("max_time_s", d.sim.max_time_s, 0, 1e12,
              "Stop at this virtual time (0 = when all turns are done)")
      .Double("sample_interval_s", d.sim.sample_interval_s, 1e-3, 1e9,
              "Time-series resolution (virtual s)")
      .Int("seed", static_cast<int64_t>(d.sim.seed), 0, kInt32Max,
           "Seed of the simulated agents' tokens")
      .Int("threads", d.threads, 0, 1024, "Worker threads (0 = one per core)")
      .Bool("progress", d.progress, "Progress lines on stderr")
      .Double("progress_interval_s", d.sim.progress_interval_s, 0.1, 1e6,
              "Wall seconds between progress lines")
      // Output.
      .String("report", d.report, "Markdown report to write (SVG charts next to it); empty = none")
      .String("decision_log_dir", d.decision_log_dir,
              "Write the newest arbiter decisions of each run to <dir>/<policy>[-c<c>].log")
      .Int("decision_log_entries", static_cast<int64_t>(d.sim.decision_log_capacity), 1, kInt32Max,
           "Decisions kept per run for the log")
      .String("title", d.title, "Report title (default: derived from the workload)")
      .Double("phase_split_s", d.phase_split_s, 0, 1e12,
              "Also report the turns arriving at or after this virtual time (0 = no)")
      .Bool("paper_figure9", d.paper_figure9,
            "Show the paper's Figure 9 (H100 TP2) TTFT p99 numbers next to the sweep");
  AddVampArbiterConfigFields(s);
}

}  // namespace

const ConfigSchema& SimConfigSchema() {
  static const ConfigSchema* schema = [] {
    auto* s = new ConfigSchema();
    DeclareSimFlags(*s);
    return s;
  }();
  return *schema;
}

absl::StatusOr<SimConfig> SimConfigFromConfig(const Config& config) {
  SimConfig c;
  c.workload = config.GetString("workload");
  VAMP_ASSIGN_OR_RETURN(VampArbiterConfig vamp, VampArbiterConfigFromConfig(config));
  for (absl::string_view p : absl::StrSplit(config.GetString("policies"), ',', absl::SkipEmpty())) {
    VAMP_ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicy(p, vamp));
    c.policies.push_back(std::move(spec));
  }
  if (c.policies.empty()) return absl::InvalidArgumentError("config field 'policies': empty list");

  SimOptions& o = c.sim;
  c.calibration = config.GetString("calibration");
  c.calibration_file = config.GetString("calibration_file");
  VAMP_ASSIGN_OR_RETURN(o.calibration, CalibrationPreset(c.calibration));
  if (!c.calibration_file.empty()) {
    VAMP_ASSIGN_OR_RETURN(o.calibration, LoadCalibration(c.calibration_file, o.calibration));
  }
  SchedulerConfig& sc = o.scheduler;
  sc.block_size = static_cast<int32_t>(config.GetInt("block_size"));
  sc.max_num_batched_tokens = static_cast<int32_t>(config.GetInt("max_num_batched_tokens"));
  sc.max_num_seqs = static_cast<int32_t>(config.GetInt("max_num_seqs"));
  sc.max_model_len = static_cast<int32_t>(config.GetInt("max_model_len"));
  sc.long_prefill_token_threshold =
      static_cast<int32_t>(config.GetInt("long_prefill_token_threshold"));
  sc.enable_prefix_caching = config.GetBool("enable_prefix_caching");
  sc.snapshot_outputs = config.GetBool("snapshot_outputs");
  sc.admit_within_baseline = config.GetBool("admit_within_baseline");
  sc.enable_chunked_prefill = config.GetBool("enable_chunked_prefill");
  o.offload.base_kv_bytes = static_cast<int64_t>(config.GetDouble("kv_pool_gib") * kGiB);
  o.offload.page_bytes = static_cast<int64_t>(config.GetDouble("page_mib") * kMiB);
  o.offload.staging_buffer_experts = static_cast<int32_t>(config.GetInt("staging_buffer_experts"));
  const std::string staging = config.GetString("staging");
  o.staging = staging == "routed"            ? StagingMode::kRouted
              : staging == "routed_prefetch" ? StagingMode::kRoutedPrefetch
                                             : StagingMode::kWholeRegion;
  o.routed_staging_max_tokens = config.GetInt("routed_staging_max_tokens");
  o.snapshot_blocks = static_cast<int32_t>(config.GetInt("snapshot_blocks"));
  o.remap.per_group_layer_micros = config.GetDouble("remap_us_per_group_layer");
  o.remap.h2d_bytes_per_s = o.calibration.hardware.h2d_bytes_per_s;
  o.max_time_s = config.GetDouble("max_time_s");
  o.sample_interval_s = config.GetDouble("sample_interval_s");
  o.seed = static_cast<uint64_t>(config.GetInt("seed"));
  o.progress_interval_s = config.GetDouble("progress_interval_s");
  o.decision_log_capacity = static_cast<size_t>(config.GetInt("decision_log_entries"));
  const std::string exclude = config.GetString("exclude_first_turn");
  o.exclude_first_turn = exclude == "yes" || (exclude == "auto" && c.workload == "multi-turn");

  const int32_t vocab = o.calibration.model.vocab;
  const uint64_t workload_seed = static_cast<uint64_t>(config.GetInt("workload_seed"));
  if (c.workload == "multi-turn") {
    VAMP_ASSIGN_OR_RETURN(c.concurrencies, ParseConcurrencies(config.GetString("concurrency")));
  } else {
    c.concurrencies.clear();
  }
  workload::MultiTurnOptions& mt = c.multi_turn;
  mt.turns = static_cast<int32_t>(config.GetInt("turns"));
  mt.first_turn_tokens = static_cast<int32_t>(config.GetInt("first_turn_tokens"));
  mt.growth_tokens = static_cast<int32_t>(config.GetInt("growth_tokens"));
  mt.output_tokens = static_cast<int32_t>(config.GetInt("output_tokens"));
  mt.think_time_s = config.GetDouble("think_time_s");
  mt.stagger_s = config.GetDouble("stagger_s");
  mt.shared_system_tokens = static_cast<int32_t>(config.GetInt("shared_system_tokens"));
  mt.vocab_size = vocab;
  mt.seed = workload_seed;
  c.tail_sessions = static_cast<int32_t>(config.GetInt("tail_sessions"));
  c.tail_start_s = config.GetDouble("tail_start_s");
  workload::LowReuseOptions& lr = c.low_reuse;
  lr.num_requests = static_cast<int32_t>(config.GetInt("low_reuse_requests"));
  lr.rate_per_s = config.GetDouble("low_reuse_rate");
  lr.prompt_tokens = static_cast<int32_t>(config.GetInt("low_reuse_prompt_tokens"));
  lr.output_tokens = static_cast<int32_t>(config.GetInt("low_reuse_output_tokens"));
  lr.reuse_probability = config.GetDouble("low_reuse_probability");
  lr.reuse_fraction = config.GetDouble("low_reuse_fraction");
  lr.mean_reuse_distance = config.GetDouble("low_reuse_distance");
  lr.start_s = config.GetDouble("low_reuse_start_s");
  lr.vocab_size = vocab;
  lr.seed = workload_seed + kLowReuseSeedOffset;
  c.mix_low_reuse = config.GetBool("mix_low_reuse");
  c.mooncake_trace = config.GetString("mooncake_trace");
  c.mooncake.vocab_size = vocab;
  c.mooncake.max_requests = config.GetInt("mooncake_max_requests");
  c.mooncake.time_scale = config.GetDouble("mooncake_time_scale");
  c.lmcache_dir = config.GetString("lmcache_dir");
  c.lmcache.vocab_size = vocab;
  c.lmcache.num_sessions = static_cast<int32_t>(config.GetInt("lmcache_sessions"));
  c.lmcache.stagger_s = config.GetDouble("lmcache_stagger_s");
  c.lmcache.time_scale = config.GetDouble("lmcache_time_scale");
  c.lmcache.max_session_duration_s = config.GetDouble("lmcache_max_session_s");
  c.lmcache_tokenizer_dir = config.GetString("lmcache_tokenizer_dir");

  c.threads = static_cast<int32_t>(config.GetInt("threads"));
  c.progress = config.GetBool("progress");
  c.report = config.GetString("report");
  c.decision_log_dir = config.GetString("decision_log_dir");
  c.title = config.GetString("title");
  c.phase_split_s = config.GetDouble("phase_split_s");
  c.paper_figure9 = config.GetBool("paper_figure9");
  return c;
}

}  // namespace vamp::sim
