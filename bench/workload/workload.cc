#include "bench/workload/workload.h"

#include "absl/container/flat_hash_set.h"
#include "bench/workload/token_synth.h"

namespace vamp::workload {

int64_t Workload::NumTurns() const {
  int64_t n = 0;
  for (const Session& s : sessions) n += static_cast<int64_t>(s.turns.size());
  return n;
}

WorkloadSummary Summarize(const Workload& workload, int32_t block_size) {
  WorkloadSummary summary;
  // Chained block hashes of every prompt, as a prefix cache keys them.
  absl::flat_hash_set<uint64_t> seen;
  int64_t hit_tokens = 0;
  uint64_t output_stream = 0;
  for (const Session& session : workload.sessions) {
    ++summary.sessions;
    std::vector<int32_t> history;
    for (const Turn& turn : session.turns) {
      ++summary.turns;
      std::vector<int32_t> prompt = turn.extends_history ? history : std::vector<int32_t>();
      prompt.insert(prompt.end(), turn.new_tokens.begin(), turn.new_tokens.end());
      summary.prompt_tokens += static_cast<int64_t>(prompt.size());
      summary.output_tokens += turn.output_tokens;
      uint64_t parent = 0x12345;
      bool still_hitting = true;
      for (size_t start = 0; start + block_size <= prompt.size(); start += block_size) {
        uint64_t h = parent;
        for (int32_t i = 0; i < block_size; ++i) h = Mix64(h ^ static_cast<uint32_t>(prompt[start + i]));
        parent = h;
        const bool inserted = seen.insert(h).second;
        if (!inserted && still_hitting) {
          hit_tokens += block_size;
        } else {
          still_hitting = false;
        }
      }
      // The next turn sees this prompt plus outputs nobody else produced.
      history = std::move(prompt);
      std::vector<int32_t> out =
          SyntheticTokens(0x0u, ++output_stream, turn.output_tokens, workload.vocab_size);
      history.insert(history.end(), out.begin(), out.end());
    }
  }
  summary.ideal_prefix_hit_ratio =
      summary.prompt_tokens == 0 ? 0.0
                                 : static_cast<double>(hit_tokens) / summary.prompt_tokens;
  return summary;
}

}  // namespace vamp::workload
