// A workload: sessions of turns, each turn one request. Used by vamp-bench (against a live
// server) and vamp-sim (against simulated agents); both issue turns by the same rules:
//
//   A turn becomes due at   max(session.start_s + turn.arrival_offset_s,
//                               finish time of the session's previous turn + turn.think_time_s)
//   (the second term only when turn.after_previous is true).
//   Its prompt is           history + turn.new_tokens   when turn.extends_history is true,
//                           turn.new_tokens             otherwise,
//   where history is the previous turn's prompt followed by the tokens it generated. So a
//   multi-turn conversation re-sends its whole context each turn, and prefix caching can reuse
//   it, exactly as a chat or agent client does.
//
// Times are seconds from the start of the run; token ids are in [0, vocab_size).
#ifndef VAMP_BENCH_WORKLOAD_WORKLOAD_H_
#define VAMP_BENCH_WORKLOAD_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

namespace vamp::workload {

struct Turn {
  // Earliest issue time, relative to Session::start_s.
  double arrival_offset_s = 0;
  // Wait after the previous turn finished (when after_previous).
  double think_time_s = 0;
  bool after_previous = false;
  bool extends_history = false;
  std::vector<int32_t> new_tokens;
  // Tokens to generate (the request's max_tokens; EOS is ignored so the length is exact).
  int32_t output_tokens = 1;
};

struct Session {
  std::string id;
  double start_s = 0;
  std::vector<Turn> turns;
};

struct Workload {
  std::string name;
  int32_t vocab_size = 0;
  std::vector<Session> sessions;

  int64_t NumTurns() const;
};

// Token counts of a workload, computed without running it.
struct WorkloadSummary {
  int64_t sessions = 0;
  int64_t turns = 0;
  // Prompt tokens over all turns, assuming each turn's output has its full length.
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  // Fraction of prompt tokens (0..1) that an infinite prefix cache with `block_size`-token blocks
  // would serve, counting only whole blocks; outputs are taken as distinct tokens per turn.
  double ideal_prefix_hit_ratio = 0;
};

WorkloadSummary Summarize(const Workload& workload, int32_t block_size);

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_WORKLOAD_H_
