#include "bench/stats/run_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vamp::bench {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

double RequestRecord::Tpot() const {
  if (output_tokens < 2 || first_token_s < 0 || finish_s < 0) return 0;
  return (finish_s - first_token_s) / static_cast<double>(output_tokens - 1);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

Distribution Distribute(const std::vector<double>& values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  d.mean = Mean(values);
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  d.max = values.empty() ? kNaN : *std::max_element(values.begin(), values.end());
  return d;
}

Window MeasurementWindow(const std::vector<RequestRecord>& records,
                         const std::vector<int32_t>& turns_per_session, const WindowRule& rule) {
  Window w;
  std::vector<double> finishes;
  double last_finish = 0;
  for (const RequestRecord& r : records) {
    if (r.finish_s >= 0) {
      last_finish = std::max(last_finish, r.finish_s);
      if (r.Completed()) finishes.push_back(r.finish_s);
    }
  }
  std::sort(finishes.begin(), finishes.end());
  if (rule.warmup_requests > 0 && !finishes.empty()) {
    const size_t k = std::min(finishes.size(), static_cast<size_t>(rule.warmup_requests));
    w.start_s = finishes[k - 1];
  }
  w.end_s = last_finish;
  if (rule.end_before_drain) {
    // Each session's first issue and, when its last turn ended, its completion.
    const size_t n = turns_per_session.size();
    std::vector<double> started(n, -1), completed(n, -1);
    for (const RequestRecord& r : records) {
      if (r.session < 0 || static_cast<size_t>(r.session) >= n) continue;
      double& s = started[r.session];
      if (s < 0 || r.issue_s < s) s = r.issue_s;
      if (r.turn == turns_per_session[r.session] - 1 && r.finish_s >= 0) {
        completed[r.session] = r.finish_s;
      }
    }
    double all_started = 0;
    bool every_session_started = true;
    for (double s : started) {
      if (s < 0) every_session_started = false;
      all_started = std::max(all_started, s);
    }
    double first_done = std::numeric_limits<double>::infinity();
    for (double c : completed) {
      if (c >= all_started) first_done = std::min(first_done, c);
    }
    if (every_session_started && std::isfinite(first_done)) w.end_s = first_done;
  }
  if (w.end_s < w.start_s) w.end_s = w.start_s;
  return w;
}

QGrid QualifiedThroughput(const std::vector<RequestRecord>& records, const Window& window,
                          const std::vector<double>& ttft_limits_s,
                          const std::vector<double>& tpot_limits_s) {
  QGrid g;
  g.ttft_limits_s = ttft_limits_s;
  g.tpot_limits_s = tpot_limits_s;
  g.q_per_s.assign(ttft_limits_s.size(), std::vector<double>(tpot_limits_s.size(), 0));
  const double w = window.Duration();
  if (w <= 0) return g;
  for (const RequestRecord& r : records) {
    if (!r.Completed() || !window.Contains(r.finish_s)) continue;
    for (size_t i = 0; i < ttft_limits_s.size(); ++i) {
      if (r.Ttft() > ttft_limits_s[i]) continue;
      for (size_t j = 0; j < tpot_limits_s.size(); ++j) {
        if (r.Tpot() <= tpot_limits_s[j]) g.q_per_s[i][j] += 1.0 / w;
      }
    }
  }
  return g;
}

std::vector<int> CellsWon(const std::vector<const QGrid*>& grids, double tie) {
  std::vector<int> wins(grids.size(), 0);
  const QGrid* shape = nullptr;
  for (const QGrid* g : grids) shape = shape != nullptr ? shape : g;
  if (shape == nullptr) return wins;
  for (size_t i = 0; i < shape->ttft_limits_s.size(); ++i) {
    for (size_t j = 0; j < shape->tpot_limits_s.size(); ++j) {
      double best = 0;
      for (const QGrid* g : grids) {
        if (g != nullptr) best = std::max(best, g->q_per_s[i][j]);
      }
      if (!(best > 0)) continue;
      for (size_t k = 0; k < grids.size(); ++k) {
        if (grids[k] != nullptr && grids[k]->q_per_s[i][j] >= best * (1 - tie) - 1e-12) {
          ++wins[k];
        }
      }
    }
  }
  return wins;
}

QComparison CompareQ(const QGrid& candidate, const QGrid& baseline) {
  QComparison c;
  double log_sum = 0;
  for (size_t i = 0; i < baseline.q_per_s.size() && i < candidate.q_per_s.size(); ++i) {
    for (size_t j = 0; j < baseline.q_per_s[i].size() && j < candidate.q_per_s[i].size(); ++j) {
      const double a = candidate.q_per_s[i][j], b = baseline.q_per_s[i][j];
      if (a > 0 && b > 0) {
        const double r = a / b;
        log_sum += std::log(r);
        c.worst_ratio = c.cells == 0 ? r : std::min(c.worst_ratio, r);
        c.best_ratio = c.cells == 0 ? r : std::max(c.best_ratio, r);
        ++c.cells;
      } else if (a > 0) {
        ++c.only_candidate;
      } else if (b > 0) {
        ++c.only_baseline;
      }
    }
  }
  if (c.cells > 0) c.geomean_ratio = std::exp(log_sum / c.cells);
  return c;
}

std::string DescribeQComparison(const QComparison& c) {
  if (c.cells == 0 && c.only_candidate == 0 && c.only_baseline == 0) return "–";
  std::string s = c.cells == 0 ? std::string("no common cell")
                               : absl::StrFormat("×%.3f (worst ×%.3f, best ×%.3f)",
                                                 c.geomean_ratio, c.worst_ratio, c.best_ratio);
  if (c.only_candidate > 0) absl::StrAppend(&s, absl::StrFormat("; %d cells only it", c.only_candidate));
  if (c.only_baseline > 0) absl::StrAppend(&s, absl::StrFormat("; %d cells only the baseline", c.only_baseline));
  return s;
}

namespace {

double RoundTo2(double v) {
  if (!(v > 0) || !std::isfinite(v)) return v;
  const double mag = std::pow(10, std::floor(std::log10(v)) - 1);
  return std::round(v / mag) * mag;
}

}  // namespace

std::vector<double> AutoLimits(std::vector<double> values) {
  std::vector<double> out;
  for (double p : {25.0, 50.0, 75.0, 90.0, 99.0}) {
    const double v = RoundTo2(Percentile(values, p));
    if (std::isfinite(v) && v > 0 && (out.empty() || v > out.back())) out.push_back(v);
  }
  if (out.empty()) out = {1.0};
  return out;
}

RunStats ComputeRunStats(const std::vector<RequestRecord>& records,
                         const std::vector<int32_t>& turns_per_session, const WindowRule& rule) {
  RunStats s;
  s.window = MeasurementWindow(records, turns_per_session, rule);
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t window_tokens = 0, prompt = 0, cached = 0;
  for (const RequestRecord& r : records) {
    ++s.requests;
    if (r.Completed()) ++s.completed;
    if (!r.ok && r.finish_s >= 0) ++s.failed;
    if (r.Completed() && s.window.Contains(r.finish_s)) {
      ++s.window_completed;
      window_tokens += r.output_tokens;
    }
    if (!s.window.Contains(r.issue_s)) continue;
    ++s.window_requests;
    if (!r.Completed()) continue;
    if (!(rule.exclude_first_turn && r.turn == 0)) ttft.push_back(r.Ttft());
    if (r.output_tokens >= 2) tpot.push_back(r.Tpot());
    itl.insert(itl.end(), r.inter_token_s.begin(), r.inter_token_s.end());
    e2e.push_back(r.E2e());
    if (r.cached_tokens >= 0) {
      prompt += r.prompt_tokens;
      cached += r.cached_tokens;
    }
  }
  s.ttft_s = Distribute(ttft);
  s.tpot_s = Distribute(tpot);
  s.itl_s = Distribute(itl);
  s.e2e_s = Distribute(e2e);
  const double w = s.window.Duration();
  if (w > 0) {
    s.request_throughput = static_cast<double>(s.window_completed) / w;
    s.output_tokens_per_s = static_cast<double>(window_tokens) / w;
  }
  s.client_cache_hit_ratio =
      prompt > 0 ? static_cast<double>(cached) / static_cast<double>(prompt) : kNaN;
  return s;
}

}  // namespace vamp::bench
