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
  s.Enum("workload", "multi_turn", {"multi_turn", "mooncake", "lmcache", "low_reuse"},
         "multi_turn: the paper's in-house workload (c sessions x turns, deterministic growth, "
         "think times); mooncake: replay of a Mooncake trace by its timestamps; lmcache: LMCache "
         "agent traces as sessions with their recorded think times; low_reuse: open-loop "
         "requests that rarely share a prefix")
      .Int("sessions", 8, 1, kMax,
           "multi_turn: concurrent sessions c; lmcache: sessions replayed (files reused in order)")
      .Int("turns", 12, 1, 100000, "multi_turn: turns per session")
      .Int("first_turn_tokens", 2048, 1, kMax, "multi_turn: prompt tokens of turn 0")
      .Int("growth_tokens", 1024, 0, kMax, "multi_turn: new prompt tokens each later turn")
      .Int("output_tokens", 128, 1, kMax, "multi_turn and low_reuse: tokens generated per turn")
      .Double("think_time_s", 1.0, 0, 1e6, "multi_turn: seconds between a turn's end and the next")
      .Double("stagger_s", 0.0, 0, 1e6,
              "multi_turn: session k starts at k * stagger_s; lmcache: the same (0 = 5 s)")
      .Int("shared_system_tokens", 0, 0, kMax,
           "multi_turn: tokens of a system prompt every session shares")
      .Int("seed", 1, 0, kMax, "multi_turn and low_reuse: generator seed")
      .Int("vocab_size", 151936, 2, kMax,
           "token ids are drawn from [0, vocab_size); vamp-bench ab reads it from the model's "
           "config.json")
      .String("trace", "/work/shared/traces/mooncake/synthetic_trace.jsonl",
              "mooncake: the JSONL trace file")
      .String("trace_dir", "/work/shared/traces/lmcache-agent-trace/miniswe",
              "lmcache: the folder of per-session *.jsonl traces")
      .Int("max_requests", 0, 0, kMax, "mooncake: replay only the first N records (0 = all)")
      .Double("time_scale", 1.0, 1e-6, 1e6,
              "mooncake, lmcache: multiply recorded gaps by this (0.5 = twice the load)")
      .Int("chars_per_token", 4, 1, 1024, "lmcache without a tokenizer: bytes of text per token")
      .String("tokenizer_dir", "",
              "lmcache: a model folder whose tokenizer.json turns the traces' text into the "
              "model's token ids; empty: vamp-bench ab uses --model_path's when it has one, run "
              "uses --chars_per_token")
      .Double("max_session_duration_s", 0, 0, 1e9,
              "lmcache: drop calls later than this in their session (0 = keep all)")
      .Int("num_requests", 200, 1, kMax, "low_reuse: requests")
      .Double("rate_per_s", 2.0, 1e-6, 1e6, "low_reuse: Poisson arrival rate")
      .Int("prompt_tokens", 2048, 1, kMax, "low_reuse: mean prompt tokens")
      .Double("reuse_probability", 0.3, 0, 1, "low_reuse: share of requests repeating a prefix")
      .Double("mean_reuse_distance", 200, 1, 1e9, "low_reuse: mean requests back to the reused one")
      .Int("warmup_requests", 0, 0, kMax,
           "the measurement window starts when this many requests have completed")
      .Bool("end_before_drain", true,
            "the measurement window ends when the first session completes after all sessions "
            "started (the paper's rule); --no-end_before_drain: at the last response")
      .Bool("include_first_turn", false,
            "multi_turn: count each session's turn 0 in the TTFT percentiles (the paper leaves "
            "it out: it is issued at t = 0 and no cache can serve it)");
}

absl::StatusOr<workload::Workload> BuildWorkload(const Config& c, int32_t sessions,
                                                 int32_t vocab_size, int32_t seed_offset,
                                                 const std::string& default_tokenizer_dir) {
  const std::string& kind = c.GetString("workload");
  const int32_t vocab = vocab_size > 0 ? vocab_size : static_cast<int32_t>(c.GetInt("vocab_size"));
  const int32_t n = sessions > 0 ? sessions : static_cast<int32_t>(c.GetInt("sessions"));
  if (kind == "multi_turn") {
    workload::MultiTurnOptions o;
    o.concurrency = n;
    o.turns = static_cast<int32_t>(c.GetInt("turns"));
    o.first_turn_tokens = static_cast<int32_t>(c.GetInt("first_turn_tokens"));
    o.growth_tokens = static_cast<int32_t>(c.GetInt("growth_tokens"));
    o.output_tokens = static_cast<int32_t>(c.GetInt("output_tokens"));
    o.think_time_s = c.GetDouble("think_time_s");
    o.stagger_s = c.GetDouble("stagger_s");
    o.shared_system_tokens = static_cast<int32_t>(c.GetInt("shared_system_tokens"));
    o.vocab_size = vocab;
    o.seed = static_cast<uint64_t>(c.GetInt("seed") + seed_offset);
    return workload::GenerateMultiTurn(o);
  }
  if (kind == "mooncake") {
    workload::MooncakeOptions o;
    o.vocab_size = vocab;
    o.max_requests = c.GetInt("max_requests");
    o.time_scale = c.GetDouble("time_scale");
    return workload::ReadMooncakeTrace(c.GetString("trace"), o);
  }
  if (kind == "lmcache") {
    workload::LmcacheOptions o;
    o.vocab_size = vocab;
    o.chars_per_token = static_cast<int32_t>(c.GetInt("chars_per_token"));
    o.num_sessions = n;
    if (c.GetDouble("stagger_s") > 0) o.stagger_s = c.GetDouble("stagger_s");
    o.time_scale = c.GetDouble("time_scale");
    o.max_session_duration_s = c.GetDouble("max_session_duration_s");
    const std::string dir = TokenizerDirFor(c, default_tokenizer_dir);
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
    return workload::ReadLmcacheTraces(c.GetString("trace_dir"), o);
  }
  workload::LowReuseOptions o;
  o.num_requests = static_cast<int32_t>(c.GetInt("num_requests"));
  o.rate_per_s = c.GetDouble("rate_per_s");
  o.prompt_tokens = static_cast<int32_t>(c.GetInt("prompt_tokens"));
  o.output_tokens = static_cast<int32_t>(c.GetInt("output_tokens"));
  o.reuse_probability = c.GetDouble("reuse_probability");
  o.mean_reuse_distance = c.GetDouble("mean_reuse_distance");
  o.vocab_size = vocab;
  o.seed = static_cast<uint64_t>(c.GetInt("seed") + seed_offset);
  return workload::GenerateLowReuse(o);
}

std::string TokenizerDirFor(const Config& c, const std::string& default_tokenizer_dir) {
  if (c.GetString("workload") != "lmcache") return "";
  if (!c.GetString("tokenizer_dir").empty()) return c.GetString("tokenizer_dir");
  if (default_tokenizer_dir.empty()) return "";
  std::error_code ec;
  return std::filesystem::exists(default_tokenizer_dir + "/tokenizer.json", ec)
             ? default_tokenizer_dir
             : "";
}

WindowRule WindowRuleFor(const Config& c) {
  WindowRule r;
  r.warmup_requests = c.GetInt("warmup_requests");
  r.end_before_drain = c.GetBool("end_before_drain");
  r.exclude_first_turn =
      c.GetString("workload") == "multi_turn" && !c.GetBool("include_first_turn");
  return r;
}

std::string DescribeWorkload(const Config& c, int32_t sessions,
                             const std::string& default_tokenizer_dir) {
  const std::string& kind = c.GetString("workload");
  const int64_t n = sessions > 0 ? sessions : c.GetInt("sessions");
  if (kind == "multi_turn") {
    return absl::StrFormat(
        "multi_turn: %d sessions x %d turns, turn 0 %d tokens, +%d tokens a turn, %d output "
        "tokens, think %.2f s, stagger %.2f s, seed %d",
        n, c.GetInt("turns"), c.GetInt("first_turn_tokens"), c.GetInt("growth_tokens"),
        c.GetInt("output_tokens"), c.GetDouble("think_time_s"), c.GetDouble("stagger_s"),
        c.GetInt("seed"));
  }
  if (kind == "mooncake") {
    return absl::StrFormat("mooncake replay of %s, first %d records (0 = all), time scale %.3g",
                           c.GetString("trace"), c.GetInt("max_requests"),
                           c.GetDouble("time_scale"));
  }
  if (kind == "lmcache") {
    const std::string dir = TokenizerDirFor(c, default_tokenizer_dir);
    return absl::StrFormat("lmcache traces of %s, %d sessions, time scale %.3g, text through %s",
                           c.GetString("trace_dir"), n, c.GetDouble("time_scale"),
                           dir.empty() ? absl::StrCat(c.GetInt("chars_per_token"), " bytes a token")
                                       : absl::StrCat("the tokenizer of ", dir));
  }
  return absl::StrFormat(
      "low_reuse: %d requests at %.3g/s, %d prompt tokens, %d output, reuse p %.2f, mean "
      "distance %.0f, seed %d",
      c.GetInt("num_requests"), c.GetDouble("rate_per_s"), c.GetInt("prompt_tokens"),
      c.GetInt("output_tokens"), c.GetDouble("reuse_probability"),
      c.GetDouble("mean_reuse_distance"), c.GetInt("seed"));
}

}  // namespace vamp::bench
