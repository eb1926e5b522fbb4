// vamp-bench's workload flags: which workload of bench/workload to run and its parameters, and
// the measurement-window rule that goes with it.
#ifndef VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_
#define VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/stats/run_stats.h"
#include "bench/workload/workload.h"
#include "common/config.h"

namespace vamp::bench {

// Declares --workload and the parameters of every workload family.
void AddWorkloadFlags(ConfigSchema& schema);

// Builds the workload the flags describe. `sessions` > 0 overrides --sessions (the multi-turn
// concurrency c; the LMCache session count); `vocab_size` > 0 overrides --vocab_size;
// `seed_offset` is added to --seed (generated workloads only: traces have no seed);
// `default_tokenizer_dir` is the model folder whose tokenizer.json the LMCache text goes through
// when --tokenizer_dir is not given (ignored unless it has one).
// Errors name the flag (or the trace file) at fault.
absl::StatusOr<workload::Workload> BuildWorkload(const Config& config, int32_t sessions,
                                                 int32_t vocab_size, int32_t seed_offset = 0,
                                                 const std::string& default_tokenizer_dir = "");

// The model folder whose tokenizer the LMCache workload uses ("" = none: --chars_per_token):
// --tokenizer_dir, else `default_tokenizer_dir` when it has a tokenizer.json.
std::string TokenizerDirFor(const Config& config, const std::string& default_tokenizer_dir);

// The paper's window rule for the chosen workload (stats.h): the multi-turn sweep leaves out
// first turns from TTFT percentiles; --warmup_requests and --end_before_drain apply to all.
WindowRule WindowRuleFor(const Config& config);

// One line describing the workload's parameters, for reports.
std::string DescribeWorkload(const Config& config, int32_t sessions,
                             const std::string& default_tokenizer_dir = "");

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_WORKLOAD_FLAGS_H_
