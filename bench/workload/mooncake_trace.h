// Reader for the Mooncake FAST'25 traces (shared/traces/mooncake/, JSONL: timestamp in ms,
// input_length, output_length, hash_ids of the prompt's 512-token blocks). Each record becomes a
// one-turn session issued open-loop at its timestamp; block hash ids map to deterministic tokens
// (TokensForHashBlock), so requests that share leading hash ids share a token prefix.
#ifndef VAMP_BENCH_WORKLOAD_MOONCAKE_TRACE_H_
#define VAMP_BENCH_WORKLOAD_MOONCAKE_TRACE_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/workload/workload.h"

namespace vamp::workload {

struct MooncakeOptions {
  int32_t vocab_size = 151936;  // Qwen3's
  int32_t trace_block_tokens = 512;
  // Keep only the first N records (0 = all).
  int64_t max_requests = 0;
  // Multiply inter-arrival times by this (0.5 = twice the load).
  double time_scale = 1.0;
};

// Errors name the file, the line and the field.
absl::StatusOr<Workload> ReadMooncakeTrace(const std::string& path,
                                           const MooncakeOptions& options = {});

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_MOONCAKE_TRACE_H_
