// Reader for the LMCache agent traces (shared/traces/lmcache-agent-trace/<kind>/<session>.jsonl:
// one LLM call per line with its full prompt text, output text and a wall-clock timestamp in
// microseconds). Sessions were recorded one after another; here they are replayed concurrently:
// session k starts at k * stagger_s and keeps the recorded gaps between its calls, each call also
// waiting for the previous one to finish (an agent cannot send its next call earlier).
// Text becomes tokens through the serving model's tokenizer when one is given (the ids a client
// sending that text would cause), else with TokenizeText (about 4 characters a token).
#ifndef VAMP_BENCH_WORKLOAD_LMCACHE_TRACE_H_
#define VAMP_BENCH_WORKLOAD_LMCACHE_TRACE_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/workload/workload.h"
#include "tokenizer/tokenizer.h"

namespace vamp::workload {

struct LmcacheOptions {
  int32_t vocab_size = 151936;
  // Not owned; may be null. When set, a call's prompt is tokenizer->Encode(its input text) and its
  // output length the token count of its output text; chars_per_token is then unused. Every id
  // must be below vocab_size.
  const Tokenizer* tokenizer = nullptr;
  int32_t chars_per_token = 4;
  // Sessions to replay (0 = all files); when more than there are files, files are reused in
  // order, each copy under its own id (so copies share no cache salt but do share text).
  int32_t num_sessions = 0;
  double stagger_s = 5.0;
  // Recorded gaps are multiplied by this.
  double time_scale = 1.0;
  // Drop calls whose offset within their session is past this (0 = no limit).
  double max_session_duration_s = 0;
};

// Reads every *.jsonl file of `directory` in name order. Errors name the file, line and field.
absl::StatusOr<Workload> ReadLmcacheTraces(const std::string& directory,
                                           const LmcacheOptions& options = {});

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_LMCACHE_TRACE_H_
