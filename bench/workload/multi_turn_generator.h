// The in-house multi-turn workload of the VAMP paper (§VI-A, §VI-C): c concurrent sessions, each
// a fixed number of turns with deterministic per-turn context growth, closed-loop with a think
// time between turns. Every turn re-sends the whole conversation (extends_history), so the
// reusable prefix footprint grows with c × context.
#ifndef VAMP_BENCH_WORKLOAD_MULTI_TURN_GENERATOR_H_
#define VAMP_BENCH_WORKLOAD_MULTI_TURN_GENERATOR_H_

#include "absl/status/statusor.h"
#include "bench/workload/workload.h"

namespace vamp::workload {

struct MultiTurnOptions {
  int32_t concurrency = 16;         // sessions, all starting together (plus stagger)
  int32_t turns = 12;
  int32_t first_turn_tokens = 2048; // system prompt + first user message
  int32_t growth_tokens = 1024;     // new user/tool tokens added each later turn
  int32_t output_tokens = 128;      // generated per turn
  double think_time_s = 1.0;        // between a turn's end and the next turn
  double stagger_s = 0.0;           // session k starts at k * stagger_s
  // Tokens of a system prompt shared by all sessions at the start of turn 0 (0 = none).
  int32_t shared_system_tokens = 0;
  int32_t vocab_size = 151936;
  uint64_t seed = 1;
};

absl::StatusOr<Workload> GenerateMultiTurn(const MultiTurnOptions& options);

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_MULTI_TURN_GENERATOR_H_
