#include "bench/workload/multi_turn_generator.h"

#include "absl/strings/str_cat.h"
#include "bench/workload/token_synth.h"

namespace vamp::workload {

absl::StatusOr<Workload> GenerateMultiTurn(const MultiTurnOptions& o) {
  if (o.concurrency < 1) return absl::InvalidArgumentError("multi-turn: concurrency must be >= 1");
  if (o.turns < 1) return absl::InvalidArgumentError("multi-turn: turns must be >= 1");
  if (o.first_turn_tokens < 1 || o.growth_tokens < 0 || o.output_tokens < 1) {
    return absl::InvalidArgumentError(
        "multi-turn: first_turn_tokens and output_tokens must be >= 1, growth_tokens >= 0");
  }
  if (o.shared_system_tokens < 0 || o.shared_system_tokens > o.first_turn_tokens) {
    return absl::InvalidArgumentError(
        "multi-turn: shared_system_tokens must be in [0, first_turn_tokens]");
  }
  if (o.think_time_s < 0 || o.stagger_s < 0 || o.vocab_size < 2) {
    return absl::InvalidArgumentError(
        "multi-turn: think_time_s and stagger_s must be >= 0, vocab_size >= 2");
  }
  Workload workload;
  workload.name = absl::StrCat("multi-turn-c", o.concurrency);
  workload.vocab_size = o.vocab_size;
  const std::vector<int32_t> system =
      SyntheticTokens(o.seed, /*stream=*/0, o.shared_system_tokens, o.vocab_size);
  for (int32_t s = 0; s < o.concurrency; ++s) {
    Session session;
    session.id = absl::StrCat("session-", s);
    session.start_s = s * o.stagger_s;
    for (int32_t t = 0; t < o.turns; ++t) {
      Turn turn;
      turn.after_previous = t > 0;
      turn.extends_history = t > 0;
      turn.think_time_s = t > 0 ? o.think_time_s : 0;
      turn.output_tokens = o.output_tokens;
      // Stream ids are unique per (session, turn) so no two sessions share text by accident.
      const uint64_t stream = 1 + static_cast<uint64_t>(s) * 1000003ULL + t;
      if (t == 0) {
        turn.new_tokens = system;
        std::vector<int32_t> own = SyntheticTokens(
            o.seed, stream, o.first_turn_tokens - o.shared_system_tokens, o.vocab_size);
        turn.new_tokens.insert(turn.new_tokens.end(), own.begin(), own.end());
      } else {
        turn.new_tokens = SyntheticTokens(o.seed, stream, o.growth_tokens, o.vocab_size);
      }
      session.turns.push_back(std::move(turn));
    }
    workload.sessions.push_back(std::move(session));
  }
  return workload;
}

}  // namespace vamp::workload
