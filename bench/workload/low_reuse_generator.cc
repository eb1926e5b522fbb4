#include "bench/workload/low_reuse_generator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "bench/workload/token_synth.h"

namespace vamp::workload {

absl::StatusOr<Workload> GenerateLowReuse(const LowReuseOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("low-reuse workload: '", field, "' ", why));
  };
  if (o.num_requests < 1) return bad("num_requests", "must be >= 1");
  if (!(o.rate_per_s > 0)) return bad("rate_per_s", "must be > 0");
  if (o.prompt_tokens < 1) return bad("prompt_tokens", "must be >= 1");
  if (!(o.prompt_jitter >= 0 && o.prompt_jitter < 1)) return bad("prompt_jitter", "must be in [0, 1)");
  if (o.output_tokens < 1) return bad("output_tokens", "must be >= 1");
  if (!(o.reuse_probability >= 0 && o.reuse_probability <= 1)) {
    return bad("reuse_probability", "must be in [0, 1]");
  }
  if (!(o.reuse_fraction >= 0 && o.reuse_fraction <= 1)) {
    return bad("reuse_fraction", "must be in [0, 1]");
  }
  if (!(o.mean_reuse_distance >= 1)) return bad("mean_reuse_distance", "must be >= 1");
  if (o.vocab_size < 2) return bad("vocab_size", "must be >= 2");

  Workload w;
  w.name = absl::StrCat("low-reuse-p", o.reuse_probability, "-d", o.mean_reuse_distance, "-r",
                        o.rate_per_s);
  w.vocab_size = o.vocab_size;
  std::mt19937_64 rng(Mix64(o.seed ^ 0x6c6f772d72657573ULL));
  std::exponential_distribution<double> gap(o.rate_per_s);
  std::exponential_distribution<double> distance(1.0 / o.mean_reuse_distance);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(o.num_requests);
  double t = o.start_s;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    if (i > 0) t += gap(rng);
    const double scale = 1.0 + o.prompt_jitter * (2.0 * unit(rng) - 1.0);
    const int32_t length = std::max<int32_t>(1, static_cast<int32_t>(std::lround(o.prompt_tokens * scale)));
    std::vector<int32_t> prompt;
    prompt.reserve(length);
    if (i > 0 && unit(rng) < o.reuse_probability) {
      const int64_t d = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(distance(rng))), 1, i);
      const std::vector<int32_t>& source = prompts[i - d];
      const size_t take = std::min<size_t>(
          source.size(), static_cast<size_t>(std::lround(o.reuse_fraction * length)));
      prompt.assign(source.begin(), source.begin() + static_cast<std::ptrdiff_t>(take));
    }
    const std::vector<int32_t> fresh = SyntheticTokens(
        o.seed, static_cast<uint64_t>(i) + 1, length - static_cast<int64_t>(prompt.size()),
        o.vocab_size);
    prompt.insert(prompt.end(), fresh.begin(), fresh.end());
    Session s;
    s.id = absl::StrCat("lr-", i);
    s.start_s = t;
    Turn& turn = s.turns.emplace_back();
    turn.new_tokens = prompt;
    turn.output_tokens = o.output_tokens;
    prompts.push_back(std::move(prompt));
    w.sessions.push_back(std::move(s));
  }
  return w;
}

}  // namespace vamp::workload
