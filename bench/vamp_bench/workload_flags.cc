#include "bench/vamp_bench/workload_flags.h"

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/workload/lmcache_trace.h"
#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "tokenizer/hf_tokenizer.h"

namespace vamp::bench {

void AddWorkloadFlags(ConfigSchema& s) {
  constexpr int64_t kMax = 1 << 30;
  const WorkloadFlags d;
  const workload::MultiTurnOptions& mt = d.multi_turn;
  const workload::LowReuseOptions& lr = d.low_reuse;
  s.Enum("workload", d.workload, {"multi_turn", "mooncake", "lmcache", "low_reuse"},
         "multi_turn: the paper's in-house workload (c sessions x turns, deterministic growth, "
         "think times); mooncake: replay of a Mooncake trace by its timestamps; lmcache: LMCache "
         "agent traces as sessions with their recorded think times; low_reuse: open-loop "
         "requests that rarely share a prefix")
      .Int("sessions", d.sessions, 1, kMax,
           "multi_turn: concurrent sessions c; lmcache: sessions replayed (files reused in order)")
      .Int("turns", mt.turns, 1, 100000, "multi_turn: turns per session")
      .Int("first_turn_tokens", mt.first_turn_tokens, 1, kMax,
           "multi_turn: prompt tokens of turn 0")
      .Int("growth_tokens", mt.growth_tokens, 0, kMax,
           "multi_turn: new prompt tokens each later turn")
      .Int("output_tokens", mt.output_tokens, 1, kMax,
           "multi_turn and low_reuse: tokens generated per turn")
      .Double("think_time_s", mt.think_time_s, 0, 1e6,
              "multi_turn: seconds between a turn's end and the next")
      .Double("stagger_s", mt.stagger_s, 0, 1e6,
              absl::StrCat("multi_turn: session k starts at k * stagger_s; lmcache: the same (0 = ",
                           d.lmcache.stagger_s, " s)"))
      .Int("shared_system_tokens", mt.shared_system_tokens, 0, kMax,
           "multi_turn: tokens of a system prompt every session shares")
      .Int("seed", static_cast<int64_t>(mt.seed), 0, kMax,
           "multi_turn and low_reuse: generator seed")
      .Int("vocab_size", d.vocab_size, 2, kMax,
           "token ids are drawn from [0, vocab_size); vamp-bench ab reads it from the model's "
           "config.json")
      .String("trace", d.trace, "mooncake: the JSONL trace file")
      .String("trace_dir", d.trace_dir, "lmcache: the folder of per-session *.jsonl traces")
      .Int("max_requests", d.mooncake.max_requests, 0, kMax,
           "mooncake: replay only the first N records (0 = all)")
      .Double("time_scale", d.mooncake.time_scale, 1e-6, 1e6,
              "mooncake, lmcache: multiply recorded gaps by this (0.5 = twice the load)")
      .Int("chars_per_token", d.lmcache.chars_per_token, 1, 1024,
           "lmcache without a tokenizer: bytes of text per token")
      .String("tokenizer_dir", d.tokenizer_dir,
              "lmcache: a model folder whose tokenizer.json turns the traces' text into the "
              "model's token ids; empty: vamp-bench ab uses --model_path's when it has one, run "
              "uses --chars_per_token")
      .Double("max_session_duration_s", d.lmcache.max_session_duration_s, 0, 1e9,
              "lmcache: drop calls later than this in their session (0 = keep all)")
      .Int("num_requests", lr.num_requests, 1, kMax, "low_reuse: requests")
      .Double("rate_per_s", lr.rate_per_s, 1e-6, 1e6, "low_reuse: Poisson arrival rate")
      .Int("prompt_tokens", lr.prompt_tokens, 1, kMax, "low_reuse: mean prompt tokens")
      .Double("reuse_probability", lr.reuse_probability, 0, 1,
              "low_reuse: share of requests repeating a prefix")
      .Double("mean_reuse_distance", lr.mean_reuse_distance, 1, 1e9,
              "low_reuse: mean requests back to the reused one")
      .Int("warmup_requests", d.window.warmup_requests, 0, kMax,
           "the measurement window starts when this many requests have completed")
      .Bool("end_before_drain", d.window.end_before_drain,
            "the measurement window ends when the first session completes after all sessions "
            "started (the paper's rule); --no-end_before_drain: at the last response")
      .Bool("include_first_turn", !d.window.exclude_first_turn,
            "multi_turn: count each session's turn 0 in the TTFT percentiles (the paper leaves "
            "it out: it is issued at t = 0 and no cache can serve it)");
}

WorkloadFlags WorkloadFlagsFromConfig(const Config& c) {
  WorkloadFlags f;
  f.workload = c.GetString("workload");
  f.sessions = static_cast<int32_t>(c.GetInt("sessions"));
  f.vocab_size = static_cast<int32_t>(c.GetInt("vocab_size"));
  const int32_t output_tokens = static_cast<int32_t>(c.GetInt("output_tokens"));
  const uint64_t seed = static_cast<uint64_t>(c.GetInt("seed"));
  const double stagger_s = c.GetDouble("stagger_s");
  const double time_scale = c.GetDouble("time_scale");
  workload::MultiTurnOptions& mt = f.multi_turn;
  mt.turns = static_cast<int32_t>(c.GetInt("turns"));
  mt.first_turn_tokens = static_cast<int32_t>(c.GetInt("first_turn_tokens"));
  mt.growth_tokens = static_cast<int32_t>(c.GetInt("growth_tokens"));
  mt.output_tokens = output_tokens;
  mt.think_time_s = c.GetDouble("think_time_s");
  mt.stagger_s = stagger_s;
  mt.shared_system_tokens = static_cast<int32_t>(c.GetInt("shared_system_tokens"));
  mt.seed = seed;
  f.trace = c.GetString("trace");
  f.mooncake.max_requests = c.GetInt("max_requests");
  f.mooncake.time_scale = time_scale;
  f.trace_dir = c.GetString("trace_dir");
  f.lmcache.chars_per_token = static_cast<int32_t>(c.GetInt("chars_per_token"));
  if (stagger_s > 0) f.lmcache.stagger_s = stagger_s;
  f.lmcache.time_scale = time_scale;
  f.lmcache.max_session_duration_s = c.GetDouble("max_session_duration_s");
  f.tokenizer_dir = c.GetString("tokenizer_dir");
  workload::LowReuseOptions& lr = f.low_reuse;
  lr.num_requests = static_cast<int32_t>(c.GetInt("num_requests"));
  lr.rate_per_s = c.GetDouble("rate_per_s");
  lr.prompt_tokens = static_cast<int32_t>(c.GetInt("prompt_tokens"));
  lr.output_tokens = output_tokens;
  lr.reuse_probability = c.GetDouble("reuse_probability");
  lr.mean_reuse_distance = c.GetDouble("mean_reuse_distance");
  lr.seed = seed;
  f.window.warmup_requests = c.GetInt("warmup_requests");
  f.window.end_before_drain = c.GetBool("end_before_drain");
  f.window.exclude_first_turn = f.workload == "multi_turn" && !c.GetBool("include_first_turn");
  return f;
}

std::string TokenizerDirFor(const WorkloadFlags& f, const std::string& default_tokenizer_dir) {
  if (f.workload != "lmcache") return "";
  if (!f.tokenizer_dir.empty()) return f.tokenizer_dir;
  if (default_tokenizer_dir.empty()) return "";
  std::error_code ec;
  return std::filesystem::exists(default_tokenizer_dir + "/tokenizer.json", ec)
             ? default_tokenizer_dir
             : "";
}

absl::StatusOr<workload::Workload> BuildWorkload(const WorkloadFlags& f, int32_t sessions,
                                                 int32_t vocab_size, int32_t seed_offset,
                                                 const std::string& default_tokenizer_dir) {
  const int32_t vocab = vocab_size > 0 ? vocab_size : f.vocab_size;
  const int32_t n = sessions > 0 ? sessions : f.sessions;
  if (f.workload == "multi_turn") {
    workload::MultiTurnOptions o = f.multi_turn;
    o.concurrency = n;
    o.vocab_size = vocab;
    o.seed += static_cast<uint64_t>(seed_offset);
    return workload::GenerateMultiTurn(o);
  }
  if (f.workload == "mooncake") {
    workload::MooncakeOptions o = f.mooncake;
    o.vocab_size = vocab;
    return workload::ReadMooncakeTrace(f.trace, o);
  }
  if (f.workload == "lmcache") {
    workload::LmcacheOptions o = f.lmcache;
    o.vocab_size = vocab;
    o.num_sessions = n;
    const std::string dir = TokenizerDirFor(f, default_tokenizer_dir);
    std::unique_ptr<HfTokenizer> tokenizer;
    if (!dir.empty()) {
      absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromModelFolder(dir);
      if (!t.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokenizer_dir '", dir, "': ", t.status().message()));
      }
      tokenizer = *std::move(t);
      o.tokenizer = tokenizer.get();
    }
    return workload::ReadLmcacheTraces(f.trace_dir, o);
  }
  workload::LowReuseOptions o = f.low_reuse;
  o.vocab_size = vocab;
  o.seed += static_cast<uint64_t>(seed_offset);
  return workload::GenerateLowReuse(o);
}

std::string DescribeWorkload(const WorkloadFlags& f, int32_t sessions,
                             const std::string& default_tokenizer_dir) {
  const int64_t n = sessions > 0 ? sessions : f.sessions;
  if (f.workload == "multi_turn") {
    const workload::MultiTurnOptions& o = f.multi_turn;
    return absl::StrFormat(
        "multi_turn: %d sessions x %d turns, turn 0 %d tokens, +%d tokens a turn, %d output "
        "tokens, think %.2f s, stagger %.2f s, seed %d",
        n, o.turns, o.first_turn_tokens, o.growth_tokens, o.output_tokens, o.think_time_s,
        o.stagger_s, o.seed);
  }
  if (f.workload == "mooncake") {
    return absl::StrFormat("mooncake replay of %s, first %d records (0 = all), time scale %.3g",
                           f.trace, f.mooncake.max_requests, f.mooncake.time_scale);
  }
  if (f.workload == "lmcache") {
    const std::string dir = TokenizerDirFor(f, default_tokenizer_dir);
    return absl::StrFormat(
        "lmcache traces of %s, %d sessions, time scale %.3g, text through %s", f.trace_dir, n,
        f.lmcache.time_scale,
        dir.empty() ? absl::StrCat(f.lmcache.chars_per_token, " bytes a token")
                    : absl::StrCat("the tokenizer of ", dir));
  }
  const workload::LowReuseOptions& o = f.low_reuse;
  return absl::StrFormat(
      "low_reuse: %d requests at %.3g/s, %d prompt tokens, %d output, reuse p %.2f, mean "
      "distance %.0f, seed %d",
      o.num_requests, o.rate_per_s, o.prompt_tokens, o.output_tokens, o.reuse_probability,
      o.mean_reuse_distance, o.seed);
}

}  // namespace vamp::bench
