#include "bench/vamp_bench/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/chart/paper_reference.h"
#include "bench/chart/svg_chart.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {
namespace {

using Json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// NaN-safe JSON number (null for NaN/inf).
Json Num(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

std::string Fmt(double v, const char* format = "%.3g") {
  return std::isfinite(v) ? absl::StrFormat(format, v) : std::string("–");
}

double MeanOf(const std::vector<double>& v) {
  double sum = 0;
  int n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  }
  return n > 0 ? sum / n : kNaN;
}

double SdOf(const std::vector<double>& v) {
  const double m = MeanOf(v);
  double sum = 0;
  int n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      sum += (x - m) * (x - m);
      ++n;
    }
  }
  return n > 1 ? std::sqrt(sum / (n - 1)) : kNaN;
}

// "m ± sd" (sd only with several runs), scaled by `scale`.
std::string MeanSd(const std::vector<double>& v, double scale = 1, const char* format = "%.3g") {
  std::vector<double> scaled;
  for (double x : v) scaled.push_back(x * scale);
  const double sd = SdOf(scaled);
  std::string s = Fmt(MeanOf(scaled), format);
  if (std::isfinite(sd)) absl::StrAppend(&s, " ± ", Fmt(sd, format));
  return s;
}

// The paper's numbers next to the concurrency charts (ReportSpec::paper_reference). Series of
// measured configurations keep their colours (their index in `configs`).
void AddPaperReferences(const std::vector<std::string>& configs, bool multi_turn_sweep,
                        chart::LineChart* p99, chart::LineChart* p90, chart::LineChart* tpot,
                        chart::LineChart* hit) {
  using chart::PaperHeadline;
  const std::string at = absl::StrCat(" (paper, ", PaperHeadline::kSetting, ")");
  p90->references.push_back({"vLLM 26.1 s" + at, PaperHeadline::kStaticTtftP90S});
  p90->references.push_back({"VAMP-15 1.10 s" + at, PaperHeadline::kVampTtftP90S});
  p99->references.push_back({"vLLM 32.7 s" + at, PaperHeadline::kStaticTtftP99S});
  p99->references.push_back({"VAMP-15 3.48 s" + at, PaperHeadline::kVampTtftP99S});
  hit->references.push_back({"vLLM 0.19 %" + at, 100 * PaperHeadline::kStaticHitRate});
  hit->references.push_back({"VAMP-15 89.8 %" + at, 100 * PaperHeadline::kVampHitRate});
  if (!configs.empty() && !tpot->series.empty() && !tpot->series[0].points.empty()) {
    // What the paper's TPOT cost (+31.1 %) would be over this run's first configuration.
    chart::ChartSeries cost;
    cost.name = absl::StrCat(configs[0], " × ", absl::StrFormat("%.3f", PaperHeadline::kTpotRatio),
                             " (the paper's TPOT cost)");
    cost.color = 0;
    cost.dashed = true;
    cost.hollow_markers = true;
    for (const auto& [x, y] : tpot->series[0].points) {
      cost.points.push_back({x, y * PaperHeadline::kTpotRatio});
    }
    tpot->series.push_back(std::move(cost));
  }
  if (!multi_turn_sweep) return;
  for (size_t k = 0; k < configs.size(); ++k) {
    chart::ChartSeries fig9;
    fig9.name = absl::StrCat(configs[k], " (paper Fig. 9, 2×H100 TP2)");
    fig9.color = static_cast<int>(k);
    fig9.dashed = true;
    fig9.hollow_markers = true;
    for (const chart::PaperPoint& p : chart::PaperFigure9H100()) {
      if (p.policy == configs[k] && p.ttft_p99_s > 0) {
        fig9.points.push_back({static_cast<double>(p.concurrency), p.ttft_p99_s});
      }
    }
    if (!fig9.points.empty()) p99->series.push_back(std::move(fig9));
  }
}

chart::LineChart Line(std::string title, std::string x, std::string y, bool log_y = false) {
  chart::LineChart c;
  c.title = std::move(title);
  c.x_label = std::move(x);
  c.y_label = std::move(y);
  c.log_y = log_y;
  c.width = 760;
  return c;
}

}  // namespace

ServerStats ComputeServerStats(const std::vector<MetricsSample>& samples, const Window& window) {
  ServerStats s;
  s.hit_rate = kNaN;
  s.preemptions = kNaN;
  s.server_tpot_s = kNaN;
  s.mean_kv_usage = kNaN;
  s.min_pool_blocks = kNaN;
  s.max_pool_blocks = kNaN;
  const MetricsSample* first = nullptr;  // last sample at or before the window's start
  const MetricsSample* last = nullptr;   // first sample at or after its end
  const MetricsSample* first_any = nullptr;
  const MetricsSample* last_any = nullptr;
  double usage_sum = 0;
  int usage_n = 0;
  for (const MetricsSample& m : samples) {
    if (!m.ok) continue;
    ++s.samples;
    if (first_any == nullptr) first_any = &m;
    last_any = &m;
    if (m.t_s <= window.start_s || first == nullptr) {
      if (m.t_s <= window.start_s || first == nullptr) first = &m;
    }
    if (last == nullptr && m.t_s >= window.end_s) last = &m;
    s.peak_offload_ratio = std::max(s.peak_offload_ratio, m.kv_offload_ratio);
    s.max_waiting = std::max(s.max_waiting, m.requests_waiting);
    s.min_pool_blocks = std::isfinite(s.min_pool_blocks)
                            ? std::min(s.min_pool_blocks, m.kv_pool_blocks)
                            : m.kv_pool_blocks;
    s.max_pool_blocks = std::isfinite(s.max_pool_blocks)
                            ? std::max(s.max_pool_blocks, m.kv_pool_blocks)
                            : m.kv_pool_blocks;
    if (window.Contains(m.t_s)) {
      usage_sum += m.kv_usage_ratio;
      ++usage_n;
    }
  }
  if (last == nullptr) last = last_any;
  if (usage_n > 0) s.mean_kv_usage = usage_sum / usage_n;
  if (first != nullptr && last != nullptr && last != first) {
    const double q = last->prefix_query_tokens_total - first->prefix_query_tokens_total;
    const double h = last->prefix_hit_tokens_total - first->prefix_hit_tokens_total;
    if (q > 0) s.hit_rate = h / q;
    s.preemptions = last->preemptions_total - first->preemptions_total;
    const double n = last->itl_count - first->itl_count;
    if (n > 0) s.server_tpot_s = (last->itl_sum_s - first->itl_sum_s) / n;
  }
  if (first_any != nullptr && last_any != nullptr) {
    for (const auto& [action, n] : last_any->decisions_total) {
      auto it = first_any->decisions_total.find(action);
      const double d = n - (it == first_any->decisions_total.end() ? 0 : it->second);
      if (d > 0) s.decisions[action] = d;
    }
  }
  return s;
}

namespace {

Json DistJson(const Distribution& d) {
  return {{"count", d.count},  {"mean", Num(d.mean)}, {"p50", Num(d.p50)},
          {"p90", Num(d.p90)}, {"p99", Num(d.p99)},   {"max", Num(d.max)}};
}

Json StatsJson(const RunStats& s) {
  return {{"window_start_s", s.window.start_s},
          {"window_end_s", s.window.end_s},
          {"requests", s.requests},
          {"completed", s.completed},
          {"failed", s.failed},
          {"window_requests", s.window_requests},
          {"window_completed", s.window_completed},
          {"ttft_s", DistJson(s.ttft_s)},
          {"tpot_s", DistJson(s.tpot_s)},
          {"itl_s", DistJson(s.itl_s)},
          {"e2e_s", DistJson(s.e2e_s)},
          {"request_throughput_per_s", Num(s.request_throughput)},
          {"output_tokens_per_s", Num(s.output_tokens_per_s)},
          {"client_cache_hit_ratio", Num(s.client_cache_hit_ratio)}};
}

Json ServerJson(const ServerStats& s) {
  return {{"samples", s.samples},
          {"hit_rate", Num(s.hit_rate)},
          {"preemptions", Num(s.preemptions)},
          {"server_tpot_s", Num(s.server_tpot_s)},
          {"peak_offload_ratio", Num(s.peak_offload_ratio)},
          {"min_pool_blocks", Num(s.min_pool_blocks)},
          {"max_pool_blocks", Num(s.max_pool_blocks)},
          {"mean_kv_usage", Num(s.mean_kv_usage)},
          {"max_waiting", Num(s.max_waiting)},
          {"decisions", s.decisions}};
}

Json RunJsonObject(const RunResult& r, bool with_raw) {
  Json j = {{"config", r.config},          {"config_flags", r.config_flags},
            {"sessions", r.sessions},      {"repeat", r.repeat},
            {"command", r.command},        {"error", r.error},
            {"duration_s", r.duration_s},  {"cut_off", r.cut_off},
            {"stats", StatsJson(r.stats)}, {"server", ServerJson(r.server)}};
  if (!with_raw) return j;
  Json records = Json::array();
  for (const RequestRecord& q : r.records) {
    records.push_back({{"session", q.session},
                       {"turn", q.turn},
                       {"issue_s", q.issue_s},
                       {"first_token_s", q.first_token_s},
                       {"finish_s", q.finish_s},
                       {"prompt_tokens", q.prompt_tokens},
                       {"output_tokens", q.output_tokens},
                       {"cached_tokens", q.cached_tokens},
                       {"ok", q.ok},
                       {"error", q.error}});
  }
  j["records"] = std::move(records);
  Json samples = Json::array();
  for (const MetricsSample& m : r.samples) {
    if (!m.ok) {
      samples.push_back({{"t_s", m.t_s}, {"ok", false}, {"error", m.error}});
      continue;
    }
    samples.push_back({{"t_s", m.t_s},
                       {"ok", true},
                       {"kv_pool_blocks", m.kv_pool_blocks},
                       {"kv_usage_ratio", m.kv_usage_ratio},
                       {"kv_offload_ratio", m.kv_offload_ratio},
                       {"experts_offloaded_groups", m.experts_offloaded_groups},
                       {"requests_running", m.requests_running},
                       {"requests_waiting", m.requests_waiting},
                       {"preemptions_total", m.preemptions_total},
                       {"prefix_query_tokens_total", m.prefix_query_tokens_total},
                       {"prefix_hit_tokens_total", m.prefix_hit_tokens_total},
                       {"steps_total", m.steps_total},
                       {"itl_sum_s", m.itl_sum_s},
                       {"itl_count", m.itl_count},
                       {"decisions_total", m.decisions_total},
                       {"agents_scraped", m.agents_scraped},
                       {"agent_kv_pool_bytes", m.agent_kv_pool_bytes},
                       {"agent_offloaded_expert_bytes", m.agent_offloaded_expert_bytes},
                       {"agent_resident_expert_bytes", m.agent_resident_expert_bytes}});
  }
  j["samples"] = std::move(samples);
  return j;
}

// The runs of one (config, sessions) point.
struct Point {
  std::string config;
  int32_t sessions = 0;
  std::vector<const RunResult*> runs;
  template <typename F>
  std::vector<double> Each(F f) const {
    std::vector<double> v;
    for (const RunResult* r : runs) v.push_back(f(*r));
    return v;
  }
};

}  // namespace

std::string RunJson(const RunResult& run) {
  return RunJsonObject(run, true).dump(1, ' ', false, Json::error_handler_t::replace);
}

RenderedReport RenderReport(const ReportSpec& spec, const std::vector<RunResult>& runs) {
  RenderedReport out;
  // Order of configurations and sessions as first seen.
  std::vector<std::string> configs;
  std::vector<int32_t> sessions;
  for (const RunResult& r : runs) {
    if (std::find(configs.begin(), configs.end(), r.config) == configs.end()) {
      configs.push_back(r.config);
    }
    if (std::find(sessions.begin(), sessions.end(), r.sessions) == sessions.end()) {
      sessions.push_back(r.sessions);
    }
  }
  std::sort(sessions.begin(), sessions.end());
  auto point = [&](const std::string& c, int32_t n) {
    Point p;
    p.config = c;
    p.sessions = n;
    for (const RunResult& r : runs) {
      if (r.config == c && r.sessions == n && r.error.empty()) p.runs.push_back(&r);
    }
    return p;
  };

  // The Q(T, P) grid, the same for every run.
  std::vector<double> ttft_limits = spec.ttft_limits_s, tpot_limits = spec.tpot_limits_s;
  if (ttft_limits.empty() || tpot_limits.empty()) {
    std::vector<double> ttfts, tpots;
    for (const RunResult& r : runs) {
      for (const RequestRecord& q : r.records) {
        if (!q.Completed()) continue;
        ttfts.push_back(q.Ttft());
        if (q.output_tokens >= 2) tpots.push_back(q.Tpot());
      }
    }
    if (ttft_limits.empty()) ttft_limits = AutoLimits(ttfts);
    if (tpot_limits.empty()) tpot_limits = AutoLimits(tpots);
  }
  std::vector<QGrid> grids;
  for (const RunResult& r : runs) {
    grids.push_back(QualifiedThroughput(r.records, r.stats.window, ttft_limits, tpot_limits));
  }
  auto grid_of = [&](const RunResult* r) { return &grids[r - runs.data()]; };
  // Mean Q over a point's runs.
  auto mean_q = [&](const Point& p, size_t i, size_t j) {
    std::vector<double> v;
    for (const RunResult* r : p.runs) v.push_back(grid_of(r)->q_per_s[i][j]);
    return MeanOf(v);
  };

  std::string& md = out.markdown;
  absl::StrAppend(&md, "# ", spec.title, "\n\n");
  for (const std::string& line : spec.header_lines) absl::StrAppend(&md, line, "\n");
  absl::StrAppend(&md, "\nWorkload: ", spec.workload, "\n\n");
  if (std::isfinite(spec.ideal_hit_rate)) {
    absl::StrAppend(&md, "Hit rate an infinite prefix cache would reach: ",
                    Fmt(100 * spec.ideal_hit_rate, "%.1f"), "% (", spec.ideal_hit_rate_label,
                    ").\n\n");
  }
  absl::StrAppend(&md, "Configurations:\n\n");
  for (const std::string& c : configs) {
    for (const RunResult& r : runs) {
      if (r.config != c) continue;
      absl::StrAppend(&md, "- `", c, "`: `", r.config_flags.empty() ? "(defaults)" : r.config_flags,
                      "`\n");
      break;
    }
  }
  absl::StrAppend(
      &md,
      "\nClient-measured latencies over the measurement window (TTFT percentiles leave out each "
      "session's first turn in the multi-turn workload); hit rate, preemptions and offload from "
      "the server's metrics, sampled once a second. Mean ± SD over runs where there are "
      "several.\n\n");
  absl::StrAppend(&md,
                  "| config | sessions | runs | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | TPOT "
                  "mean (ms) | TPOT p99 (ms) | server TPOT (ms) | ITL p99 (ms) | E2E p50 (s) | "
                  "req/s | output tok/s "
                  "| hit rate | preemptions | peak offload | failed or unfinished | decisions |\n");
  absl::StrAppend(&md,
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  "---:|---|\n");
  for (int32_t n : sessions) {
    for (const std::string& c : configs) {
      Point p = point(c, n);
      if (p.runs.empty()) continue;
      std::map<std::string, double> decisions;
      for (const RunResult* r : p.runs) {
        for (const auto& [a, k] : r->server.decisions) decisions[a] += k / p.runs.size();
      }
      std::vector<std::string> d;
      for (const auto& [a, k] : decisions) d.push_back(absl::StrFormat("%s %.0f", a, k));
      absl::StrAppend(
          &md, "| ", c, " | ", n, " | ", p.runs.size(), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.ttft_s.p50; })), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.ttft_s.p90; })), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.ttft_s.p99; })), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.tpot_s.mean; }), 1e3), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.tpot_s.p99; }), 1e3), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.server.server_tpot_s; }), 1e3), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.itl_s.p99; }), 1e3), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.e2e_s.p50; })), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.request_throughput; })), " | ",
          MeanSd(p.Each([](const RunResult& r) { return r.stats.output_tokens_per_s; }), 1, "%.1f"),
          " | ",
          MeanSd(p.Each([](const RunResult& r) { return 100 * r.server.hit_rate; }), 1, "%.1f"),
          "% | ",
          MeanSd(p.Each([](const RunResult& r) { return r.server.preemptions; }), 1, "%.1f"), " | ",
          MeanSd(p.Each([](const RunResult& r) { return 100 * r.server.peak_offload_ratio; }), 1,
                 "%.0f"),
          "% | ", MeanSd(p.Each([](const RunResult& r) {
            return static_cast<double>(r.stats.failed +
                                       (r.stats.requests - r.stats.completed - r.stats.failed));
          })),
          " | ", d.empty() ? "–" : absl::StrJoin(d, ", "), " |\n");
    }
  }
  for (const RunResult& r : runs) {
    if (r.cut_off) {
      absl::StrAppend(&md, "\n", r.config, " at ", r.sessions, " sessions, run ", r.repeat + 1,
                      ": cut off after ", Fmt(r.duration_s, "%.0f"),
                      " s; requests still in flight count as misses (the failed column).\n");
    }
  }
  // The distinct request errors (up to 5 per configuration), so a failing run says why.
  for (const std::string& c : configs) {
    std::map<std::string, int> errors;
    for (const RunResult& r : runs) {
      if (r.config != c) continue;
      for (const RequestRecord& q : r.records) {
        if (!q.ok && q.finish_s >= 0) ++errors[q.error.substr(0, 200)];
      }
    }
    int shown = 0;
    for (const auto& [message, n] : errors) {
      if (shown++ == 5) break;
      absl::StrAppend(&md, "\n**", c, "**: ", n, " request(s) failed: ", message, "\n");
    }
  }
  for (const RunResult& r : runs) {
    if (!r.error.empty()) {
      absl::StrAppend(&md, "\n**", r.config, " at ", r.sessions, " sessions, run ", r.repeat + 1,
                      " failed:** ", r.error, "\n");
    }
  }

  // Against the first configuration (the baseline).
  if (configs.size() > 1) {
    const std::string& base = configs[0];
    absl::StrAppend(
        &md, "\n## Against `", base, "`\n\n",
        "TTFT p90 and p99 as baseline ÷ configuration (× lower); TPOT, request and "
        "token throughput as the configuration's change.\n\n",
        "| sessions | config | TTFT p90 × lower | TTFT p99 × lower | TPOT mean | req/s | "
        "output tok/s |\n|---:|---|---:|---:|---:|---:|---:|\n");
    for (int32_t n : sessions) {
      Point b = point(base, n);
      if (b.runs.empty()) continue;
      auto mean = [](const Point& p, double (*f)(const RunResult&)) {
        std::vector<double> v;
        for (const RunResult* r : p.runs) v.push_back(f(*r));
        return MeanOf(v);
      };
      auto p90 = +[](const RunResult& r) { return r.stats.ttft_s.p90; };
      auto p99 = +[](const RunResult& r) { return r.stats.ttft_s.p99; };
      auto tpot = +[](const RunResult& r) { return r.stats.tpot_s.mean; };
      auto rps = +[](const RunResult& r) { return r.stats.request_throughput; };
      auto tps = +[](const RunResult& r) { return r.stats.output_tokens_per_s; };
      for (size_t k = 1; k < configs.size(); ++k) {
        Point p = point(configs[k], n);
        if (p.runs.empty()) continue;
        auto change = [&](double (*f)(const RunResult&)) {
          return Fmt(100 * (mean(p, f) / mean(b, f) - 1), "%+.1f%%");
        };
        absl::StrAppend(&md, "| ", n, " | ", configs[k], " | ",
                        Fmt(mean(b, p90) / mean(p, p90), "%.2f×"), " | ",
                        Fmt(mean(b, p99) / mean(p, p99), "%.2f×"), " | ", change(tpot), " | ",
                        change(rps), " | ", change(tps), " |\n");
      }
    }
  }

  // Q(T, P).
  absl::StrAppend(
      &md, "\n## SLO-qualified throughput Q(T, P)\n\n",
      "Q(T, P) = requests completing inside the measurement window with TTFT ≤ T and "
      "client-measured TPOT ≤ P, per second of window (the paper's §VI-E; failed and unfinished "
      "requests are misses). T: ",
      absl::StrJoin(ttft_limits, ", ", [](std::string* o, double v) { absl::StrAppend(o, v); }),
      " s; P: ",
      absl::StrJoin(tpot_limits, ", ",
                    [](std::string* o, double v) { absl::StrAppend(o, Fmt(v * 1e3, "%.4g")); }),
      " ms", spec.ttft_limits_s.empty() ? " (percentiles 25/50/75/90/99 of all runs' values)" : "",
      ".\n\nCells won (highest mean Q; within 2 % of it counts as a tie) out of ",
      ttft_limits.size() * tpot_limits.size(), ":\n\n| sessions |");
  for (const std::string& c : configs) absl::StrAppend(&md, " ", c, " |");
  absl::StrAppend(&md, "\n|---:|");
  for (size_t k = 0; k < configs.size(); ++k) absl::StrAppend(&md, "---:|");
  absl::StrAppend(&md, "\n");
  std::string against;  // Q of each configuration against the first, by sessions
  for (int32_t n : sessions) {
    // Each configuration's grid at this point: Q averaged over its runs.
    std::vector<QGrid> means(configs.size());
    std::vector<const QGrid*> measured(configs.size(), nullptr);
    for (size_t k = 0; k < configs.size(); ++k) {
      Point p = point(configs[k], n);
      if (p.runs.empty()) continue;
      means[k].ttft_limits_s = ttft_limits;
      means[k].tpot_limits_s = tpot_limits;
      means[k].q_per_s.assign(ttft_limits.size(), std::vector<double>(tpot_limits.size()));
      for (size_t i = 0; i < ttft_limits.size(); ++i) {
        for (size_t j = 0; j < tpot_limits.size(); ++j) means[k].q_per_s[i][j] = mean_q(p, i, j);
      }
      measured[k] = &means[k];
    }
    const std::vector<int> wins = CellsWon(measured);
    absl::StrAppend(&md, "| ", n, " |");
    for (int w : wins) absl::StrAppend(&md, " ", w, " |");
    absl::StrAppend(&md, "\n");
    for (size_t k = 1; k < configs.size() && measured[0] != nullptr; ++k) {
      if (measured[k] == nullptr) continue;
      absl::StrAppend(&against, "| ", n, " | ", configs[k], " | ",
                      DescribeQComparison(CompareQ(*measured[k], *measured[0])), " |\n");
    }
  }
  if (!against.empty()) {
    absl::StrAppend(&md, "\nQ against `", configs[0],
                    "`, cell by cell (geometric mean of Q ÷ its Q where both qualified "
                    "someone):\n\n| sessions | config | Q ratio |\n|---:|---|---|\n", against);
  }
  if (!sessions.empty()) {
    const int32_t n = sessions.back();
    absl::StrAppend(&md, "\nQ(T, P) in requests/s at ", n,
                    " sessions (rows T, columns P; each cell lists the configurations in order: ",
                    absl::StrJoin(configs, " / "), "):\n\n| T \\ P |");
    for (double p : tpot_limits) absl::StrAppend(&md, " ", Fmt(p * 1e3, "%.4g"), " ms |");
    absl::StrAppend(&md, "\n|---:|");
    for (size_t j = 0; j < tpot_limits.size(); ++j) absl::StrAppend(&md, "---|");
    absl::StrAppend(&md, "\n");
    for (size_t i = 0; i < ttft_limits.size(); ++i) {
      absl::StrAppend(&md, "| ", Fmt(ttft_limits[i], "%.4g"), " s |");
      for (size_t j = 0; j < tpot_limits.size(); ++j) {
        std::vector<std::string> cell;
        for (const std::string& c : configs) cell.push_back(Fmt(mean_q(point(c, n), i, j), "%.3g"));
        absl::StrAppend(&md, " ", absl::StrJoin(cell, " / "), " |");
      }
      absl::StrAppend(&md, "\n");
    }
  }

  // Charts.
  absl::StrAppend(&md, "\n## Charts\n\n");
  auto svg = [&](const std::string& name, std::string contents, const std::string& alt) {
    const std::string file = absl::StrCat(spec.svg_prefix, "-", name, ".svg");
    out.svgs.push_back({file, std::move(contents)});
    absl::StrAppend(&md, "![", alt, "](", file, ")\n\n");
  };
  {
    chart::LineChart p99 = Line("TTFT p99 (steady state)", "concurrent sessions", "TTFT p99 (s)",
                                /*log_y=*/true);
    chart::LineChart p90 = Line("TTFT p90 (steady state)", "concurrent sessions", "TTFT p90 (s)",
                                /*log_y=*/true);
    chart::LineChart tpot = Line("Mean TPOT (client)", "concurrent sessions", "TPOT (ms)");
    chart::LineChart hit =
        Line("Prefix-cache hit rate (server)", "concurrent sessions", "hit rate (%)");
    chart::LineChart rps = Line("Request throughput", "concurrent sessions", "requests/s");
    for (size_t k = 0; k < configs.size(); ++k) {
      chart::ChartSeries a, b, t, h, q;
      a.name = b.name = t.name = h.name = q.name = configs[k];
      a.color = b.color = t.color = h.color = q.color = static_cast<int>(k);
      for (int32_t n : sessions) {
        Point p = point(configs[k], n);
        if (p.runs.empty()) continue;
        const double x = n;
        a.points.push_back(
            {x, MeanOf(p.Each([](const RunResult& r) { return r.stats.ttft_s.p99; }))});
        b.points.push_back(
            {x, MeanOf(p.Each([](const RunResult& r) { return r.stats.ttft_s.p90; }))});
        t.points.push_back(
            {x, 1e3 * MeanOf(p.Each([](const RunResult& r) { return r.stats.tpot_s.mean; }))});
        h.points.push_back(
            {x, 100 * MeanOf(p.Each([](const RunResult& r) { return r.server.hit_rate; }))});
        q.points.push_back(
            {x, MeanOf(p.Each([](const RunResult& r) { return r.stats.request_throughput; }))});
      }
      p99.series.push_back(a);
      p90.series.push_back(b);
      tpot.series.push_back(t);
      hit.series.push_back(h);
      rps.series.push_back(q);
    }
    if (spec.paper_reference)
      AddPaperReferences(configs, spec.multi_turn_sweep, &p99, &p90, &tpot, &hit);
    svg("ttft-p99", chart::RenderLineChart(p99), "TTFT p99 against concurrency");
    svg("ttft-p90", chart::RenderLineChart(p90), "TTFT p90 against concurrency");
    svg("tpot", chart::RenderLineChart(tpot), "Mean TPOT against concurrency");
    if (std::isfinite(spec.ideal_hit_rate)) {
      hit.references.push_back({spec.ideal_hit_rate_label, 100 * spec.ideal_hit_rate});
    }
    svg("hit-rate", chart::RenderLineChart(hit), "Prefix-cache hit rate against concurrency");
    svg("throughput", chart::RenderLineChart(rps), "Request throughput against concurrency");
  }
  if (!sessions.empty()) {
    // Over time, at the highest concurrency (first run of each configuration).
    const int32_t n = sessions.back();
    const std::string at = absl::StrCat(" (", n, " sessions)");
    chart::LineChart ttft =
        Line("TTFT of each request" + at, "time since start (s)", "TTFT (s)", /*log_y=*/true);
    chart::LineChart pool = Line("KV pool size" + at, "time since start (s)", "KV blocks");
    chart::LineChart ratio =
        Line("Expert offload ratio (of the cap)" + at, "time since start (s)", "offload ratio (%)");
    chart::LineChart usage = Line("KV usage" + at, "time since start (s)", "used blocks (%)");
    chart::LineChart waiting = Line("Waiting requests" + at, "time since start (s)", "requests");
    for (size_t k = 0; k < configs.size(); ++k) {
      Point p = point(configs[k], n);
      if (p.runs.empty()) continue;
      const RunResult& r = *p.runs[0];
      chart::ChartSeries t, b, o, u, w;
      t.name = b.name = o.name = u.name = w.name = configs[k];
      t.color = b.color = o.color = u.color = w.color = static_cast<int>(k);
      t.line = false;
      b.markers = o.markers = u.markers = w.markers = false;
      for (const RequestRecord& q : r.records) {
        if (q.Completed()) t.points.push_back({q.issue_s, q.Ttft()});
      }
      std::sort(t.points.begin(), t.points.end());
      for (const MetricsSample& m : r.samples) {
        if (!m.ok) continue;
        b.points.push_back({m.t_s, m.kv_pool_blocks});
        o.points.push_back({m.t_s, 100 * m.kv_offload_ratio});
        u.points.push_back({m.t_s, 100 * m.kv_usage_ratio});
        w.points.push_back({m.t_s, m.requests_waiting});
      }
      ttft.series.push_back(t);
      pool.series.push_back(b);
      ratio.series.push_back(o);
      usage.series.push_back(u);
      waiting.series.push_back(w);
    }
    svg("ttft-time", chart::RenderLineChart(ttft), "TTFT of each request over time");
    svg("kv-pool", chart::RenderLineChart(pool), "KV pool size over time");
    svg("offload-ratio", chart::RenderLineChart(ratio), "Offload ratio over time");
    svg("kv-usage", chart::RenderLineChart(usage), "KV usage over time");
    svg("waiting", chart::RenderLineChart(waiting), "Waiting requests over time");

    // Q(T, P) against T, one chart per P... kept to the middle and loosest P to stay readable.
    for (size_t j : std::set<size_t>{tpot_limits.size() / 2, tpot_limits.size() - 1}) {
      chart::LineChart qc =
          Line(absl::StrCat("Q(T, P = ", Fmt(tpot_limits[j] * 1e3, "%.4g"), " ms)", at),
               "TTFT limit T (s)", "qualified requests/s");
      for (size_t k = 0; k < configs.size(); ++k) {
        Point p = point(configs[k], n);
        if (p.runs.empty()) continue;
        chart::ChartSeries s;
        s.name = configs[k];
        s.color = static_cast<int>(k);
        for (size_t i = 0; i < ttft_limits.size(); ++i) {
          s.points.push_back({ttft_limits[i], mean_q(p, i, j)});
        }
        qc.series.push_back(s);
      }
      svg(absl::StrCat("q-p", j), chart::RenderLineChart(qc),
          absl::StrCat("Q(T, P) at P = ", Fmt(tpot_limits[j] * 1e3, "%.4g"), " ms"));
    }
  }

  Json all = Json::object();
  all["title"] = spec.title;
  all["header"] = spec.header_lines;
  all["workload"] = spec.workload;
  all["ttft_limits_s"] = ttft_limits;
  all["tpot_limits_s"] = tpot_limits;
  Json rs = Json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    Json j = RunJsonObject(runs[i], true);
    j["q_per_s"] = grids[i].q_per_s;
    rs.push_back(std::move(j));
  }
  all["runs"] = std::move(rs);
  out.json = all.dump(1, ' ', false, Json::error_handler_t::replace);
  return out;
}

}  // namespace vamp::bench
