// vamp-bench's workload flags: which workload of bench/workload to run and its parameters, and
// the measurement-window rule that goes with it.
#ifndef VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_
#define VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/stats/run_stats.h"
#include "bench/workload/lmcache_trace.h"
#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "bench/workload/workload.h"
#include "common/config.h"

namespace vamp::bench {

// What the workload flags say. Each family's parameters are the generator's or reader's own
// options struct, whose defaults are the flags' defaults unless set here; flags that several
// families share (--output_tokens, --seed, --stagger_s, --time_scale, --vocab_size) are set in
// each of them.
struct WorkloadFlags {
  std::string workload = "multi_turn";  // multi_turn | mooncake | lmcache | low_reuse
  // multi_turn: the concurrency c; lmcache: sessions replayed.
  int32_t sessions = 8;
  int32_t vocab_size = workload::MultiTurnOptions{}.vocab_size;
  workload::MultiTurnOptions multi_turn;
  std::string trace = "/work/shared/traces/mooncake/synthetic_trace.jsonl";
  workload::MooncakeOptions mooncake;
  std::string trace_dir = "/work/shared/traces/lmcache-agent-trace/miniswe";
  workload::LmcacheOptions lmcache;  // its tokenizer is set by BuildWorkload
  // A model folder whose tokenizer.json turns the LMCache text into token ids ("" = see
  // TokenizerDirFor).
  std::string tokenizer_dir;
  workload::LowReuseOptions low_reuse = [] {
    workload::LowReuseOptions o;
    o.num_requests = 200;  // a run of minutes against a live server, not the simulator's hour
    o.prompt_tokens = 2048;
    return o;
  }();
  // The paper's window rule for the chosen workload (stats.h): the multi-turn sweep leaves out
  // first turns from TTFT percentiles; --warmup_requests and --end_before_drain apply to all.
  WindowRule window;
};

// Declares --workload and the parameters of every workload family.
void AddWorkloadFlags(ConfigSchema& schema);
// The workload flags of a config whose schema AddWorkloadFlags declared them in: the only reader
// of those flags by name.
WorkloadFlags WorkloadFlagsFromConfig(const Config& config);

// Builds the workload the flags describe. `sessions` > 0 overrides --sessions (the multi-turn
// concurrency c; the LMCache session count); `vocab_size` > 0 overrides --vocab_size;
// `seed_offset` is added to --seed (generated workloads only: traces have no seed);
// `default_tokenizer_dir` is the model folder whose tokenizer.json the LMCache text goes through
// when --tokenizer_dir is not given (ignored unless it has one).
// Errors name the flag (or the trace file) at fault.
absl::StatusOr<workload::Workload> BuildWorkload(const WorkloadFlags& flags, int32_t sessions,
                                                 int32_t vocab_size, int32_t seed_offset = 0,
                                                 const std::string& default_tokenizer_dir = "");

// The model folder whose tokenizer the LMCache workload uses ("" = none: --chars_per_token):
// --tokenizer_dir, else `default_tokenizer_dir` when it has a tokenizer.json.
std::string TokenizerDirFor(const WorkloadFlags& flags, const std::string& default_tokenizer_dir);

// One line describing the workload's parameters, for reports.
std::string DescribeWorkload(const WorkloadFlags& flags, int32_t sessions,
                             const std::string& default_tokenizer_dir = "");

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_
