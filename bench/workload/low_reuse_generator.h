// A low-reuse workload family: open-loop single-turn requests (Poisson arrivals), where only some
// requests repeat an earlier request's prefix, and then only after a chosen reuse distance. It is
// the traffic on which VAMP's paper cost model loses (lots of KV demand, little of it reusable),
// so an arbiter must show it does no harm here (issue "An arbiter that never loses").
//
// Request i arrives at a Poisson time (rate `rate_per_s`); its prompt has `prompt_tokens` tokens
// (uniform within ±prompt_jitter). With probability `reuse_probability` it starts with the
// leading `reuse_fraction` of the prompt of request i − d, where the reuse distance d (in
// requests) is drawn from an exponential distribution with mean `mean_reuse_distance` (at least
// 1); the rest of its tokens are new. The reusable footprint is what decides whether a larger KV
// pool would help: short distances hit in any pool, very long ones in none that offload can reach.
// Deterministic for a seed.
#ifndef VAMP_BENCH_WORKLOAD_LOW_REUSE_GENERATOR_H_
#define VAMP_BENCH_WORKLOAD_LOW_REUSE_GENERATOR_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/workload/workload.h"

namespace vamp::workload {

struct LowReuseOptions {
  int32_t num_requests = 2000;
  double rate_per_s = 2.0;
  int32_t prompt_tokens = 8192;
  double prompt_jitter = 0.5;        // prompt length uniform in prompt × [1 − j, 1 + j]
  int32_t output_tokens = 128;
  double reuse_probability = 0.3;    // share of requests that repeat an earlier prefix
  double reuse_fraction = 0.5;       // share of the prompt taken from it
  double mean_reuse_distance = 200;  // requests back (exponential, >= 1)
  double start_s = 0;                // arrival of the first request
  int32_t vocab_size = 151936;
  uint64_t seed = 1;
};

// InvalidArgument naming the field for values out of range.
absl::StatusOr<Workload> GenerateLowReuse(const LowReuseOptions& options);

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_LOW_REUSE_GENERATOR_H_
