#include "sim/report.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/chart/svg_chart.h"
#include "bench/stats/run_stats.h"

namespace vamp::sim {

using chart::BarChart;
using chart::BarGroup;
using chart::ChartSeries;
using chart::LineChart;
using chart::RenderBarChart;
using chart::RenderLineChart;

namespace {

double TtftP(const SimResult& r, double p) { return Percentile(r.ttft_s, p); }

LineChart Line(std::string title, std::string x_label, std::string y_label, bool log_y = false) {
  LineChart c;
  c.title = std::move(title);
  c.x_label = std::move(x_label);
  c.y_label = std::move(y_label);
  c.log_y = log_y;
  return c;
}

ChartSeries Series(std::string name, bool markers = true) {
  ChartSeries s;
  s.name = std::move(name);
  s.markers = markers;
  return s;
}

std::string Decisions(const SimResult& r) {
  std::vector<std::string> parts;
  for (const auto& [choice, n] : r.decisions) parts.push_back(absl::StrCat(choice, " ", n));
  return parts.empty() ? "–" : absl::StrJoin(parts, ", ");
}

double PoolGiB(const SimResult& r, int32_t blocks) {
  return static_cast<double>(blocks) * static_cast<double>(r.geometry.kv_block_bytes) /
         static_cast<double>(1LL << 30);
}

double PeakOffloadPercent(const SimResult& r) {
  return r.geometry.experts_per_layer == 0
             ? 0
             : 100.0 * r.max_groups * r.geometry.experts_per_group / r.geometry.experts_per_layer;
}

const SimResult* Find(const std::vector<RunRecord>& runs, const std::string& policy, int32_t c) {
  for (const RunRecord& r : runs) {
    if (r.result.policy == policy && r.concurrency == c) return &r.result;
  }
  return nullptr;
}

std::string PaperCell(const std::vector<PaperPoint>& paper, const std::string& policy, int32_t c) {
  for (const PaperPoint& p : paper) {
    if (p.policy == policy && p.concurrency == c) return p.note;
  }
  return "";
}

}  // namespace

std::string ResultsTable(const std::vector<RunRecord>& runs, bool with_concurrency) {
  std::string s = absl::StrCat(
      "| ", with_concurrency ? "c | " : "",
      "policy | turns | TTFT p50 / p90 / p99 (s) | TPOT mean (ms) | req/s | out tok/s | "
      "hit rate | preempt | preempt/1k turns | queue mean (s) | peak pool GiB (×base) | "
      "peak offload | arbiter decisions | steps | sim wall (s) |\n|",
      with_concurrency ? " ---: |" : "",
      " --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | "
      "---: | ---: |\n");
  for (const RunRecord& run : runs) {
    const SimResult& r = run.result;
    const double turns = static_cast<double>(std::max<int64_t>(1, r.turns_completed));
    absl::StrAppend(
        &s, "| ", with_concurrency ? absl::StrCat(run.concurrency, " | ") : "", r.policy, " | ",
        r.turns_completed,
        r.turns_rejected > 0 ? absl::StrCat(" (", r.turns_rejected, " rej.)") : "",
        r.stalled ? " STALLED" : "",
        absl::StrFormat(" | %.2f / %.2f / %.2f | %.1f | %.3f | %.1f | %.1f %% | %d | %.1f | %.2f ",
                        TtftP(r, 50), TtftP(r, 90), TtftP(r, 99), r.MeanTpotMs(),
                        r.RequestThroughput(), r.OutputTokensPerSecond(),
                        100 * r.counters.prefix_cache.HitRate(), r.counters.num_preemptions,
                        1000.0 * r.counters.num_preemptions / turns, r.MeanQueueSeconds()),
        absl::StrFormat("| %.1f (%.2f×) | %.1f %% | ", PoolGiB(r, r.max_blocks),
                        static_cast<double>(r.max_blocks) / std::max(1, r.base_blocks),
                        PeakOffloadPercent(r)),
        Decisions(r), absl::StrFormat(" | %d | %.1f |\n", r.steps, r.wall_s));
  }
  return s;
}

std::string PhaseTable(const std::vector<RunRecord>& runs, bool with_concurrency, double from_s) {
  std::string s = absl::StrCat(
      "| ", with_concurrency ? "c | " : "",
      "policy | turns | TTFT p50 / p99 (s) | TPOT mean (ms) | restores | pool at end (GiB) | "
      "offload at end |\n|",
      with_concurrency ? " ---: |" : "", " --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const RunRecord& run : runs) {
    const SimResult& r = run.result;
    std::vector<double> ttft, tpot;
    for (const TurnRecord& t : r.turn_records) {
      if (t.arrival_s < from_s) continue;
      ttft.push_back(t.ttft_s);
      if (t.tpot_ms >= 0) tpot.push_back(t.tpot_ms);
    }
    double tpot_mean = 0;
    for (double v : tpot) tpot_mean += v / static_cast<double>(tpot.size());
    const TimeSample last = r.series.empty() ? TimeSample{} : r.series.back();
    absl::StrAppend(&s, "| ", with_concurrency ? absl::StrCat(run.concurrency, " | ") : "",
                    r.policy,
                    absl::StrFormat(" | %d | %.2f / %.2f | %.1f | %d | %.1f | %.1f %% |\n",
                                    ttft.size(), Percentile(ttft, 50), Percentile(ttft, 99),
                                    tpot_mean, r.counters.num_restores, PoolGiB(r, last.num_blocks),
                                    100 * last.offload_ratio));
  }
  return s;
}

std::vector<bench::RequestRecord> RequestRecords(const SimResult& r) {
  std::vector<bench::RequestRecord> records;
  records.reserve(r.turn_records.size());
  for (const TurnRecord& t : r.turn_records) {
    bench::RequestRecord q;
    q.session = static_cast<int32_t>(t.session);
    q.turn = static_cast<int32_t>(t.turn);
    q.issue_s = t.arrival_s;
    q.first_token_s = t.arrival_s + t.ttft_s;
    q.finish_s = t.finish_s;
    q.output_tokens = t.output_tokens;
    q.ok = true;
    records.push_back(q);
  }
  return records;
}

namespace {

// Q(T, P) over the paper's measurement window, as vamp-bench reports it for measured runs
// (bench/stats): the cells each policy wins at every concurrency, and the whole grid where the
// report focuses (the largest concurrency, or the single workload).
// The runs as vamp-bench would have measured them: latency over the paper's window (turn 0 left
// out of TTFT where the report does so), for comparisons with GPU runs.
std::string WindowTable(const ReportSpec& spec, bool sweep) {
  bench::WindowRule rule;
  rule.exclude_first_turn = spec.exclude_first_turn;
  rule.end_before_drain = spec.window_ends_before_drain;
  std::string md = absl::StrCat(
      "## Over the measurement window, as vamp-bench measures\n\n",
      spec.window_ends_before_drain
          ? "The paper's window: it ends when the first session completes after all have started"
          : "The whole run (later phases would fall outside the paper's window)",
      spec.exclude_first_turn ? "; TTFT leaves out each session's turn 0" : "",
      " (bench/stats, the rules vamp-bench applies to GPU runs).\n\n| ", sweep ? "c | " : "",
      "policy | window (s) | TTFT p50 / p90 / p99 (s) | TPOT mean (ms) | E2E p50 / p99 (s) | "
      "req/s |\n|",
      sweep ? "---:|" : "", "---|---:|---:|---:|---:|---:|\n");
  for (const RunRecord& run : spec.runs) {
    const bench::RunStats st =
        bench::ComputeRunStats(RequestRecords(run.result), run.result.turns_per_session, rule);
    absl::StrAppend(
        &md, "| ", sweep ? absl::StrCat(run.concurrency, " | ") : "", run.result.policy,
        absl::StrFormat(" | %.1f | %.2f / %.2f / %.2f | %.1f | %.2f / %.2f | %.3f |\n",
                        st.window.Duration(), st.ttft_s.p50, st.ttft_s.p90, st.ttft_s.p99,
                        1e3 * st.tpot_s.mean, st.e2e_s.p50, st.e2e_s.p99, st.request_throughput));
  }
  return absl::StrCat(md, "\n");
}

std::string QualifiedThroughputSection(const ReportSpec& spec, bool sweep) {
  // The grid's limits pool every completed turn of every run, as vamp-bench's report does.
  std::vector<double> ttfts, tpots;
  std::vector<std::vector<bench::RequestRecord>> records;
  for (const RunRecord& run : spec.runs) {
    records.push_back(RequestRecords(run.result));
    for (const bench::RequestRecord& q : records.back()) {
      ttfts.push_back(q.Ttft());
      if (q.output_tokens >= 2) tpots.push_back(q.Tpot());
    }
  }
  if (ttfts.empty()) return "";
  const std::vector<double> ttft_limits = bench::AutoLimits(ttfts);
  const std::vector<double> tpot_limits = bench::AutoLimits(tpots);
  std::vector<bench::QGrid> grids;
  for (size_t i = 0; i < spec.runs.size(); ++i) {
    bench::WindowRule rule;
    rule.end_before_drain = spec.window_ends_before_drain;
    const bench::Window window =
        bench::MeasurementWindow(records[i], spec.runs[i].result.turns_per_session, rule);
    grids.push_back(bench::QualifiedThroughput(records[i], window, ttft_limits, tpot_limits));
  }
  auto grid_of = [&](const std::string& policy, int32_t c) -> const bench::QGrid* {
    for (size_t i = 0; i < spec.runs.size(); ++i) {
      if (spec.runs[i].result.policy == policy && spec.runs[i].concurrency == c) return &grids[i];
    }
    return nullptr;
  };
  auto list = [](const std::vector<double>& v, double scale) {
    return absl::StrJoin(v, ", ", [scale](std::string* o, double x) {
      absl::StrAppend(o, absl::StrFormat("%.4g", x * scale));
    });
  };
  std::string md = absl::StrCat(
      "## SLO-qualified throughput Q(T, P)\n\nQ(T, P) = turns completing inside the measurement "
      "window above with TTFT ≤ T and TPOT ≤ P, per second of window (§VI-E), by the statistics "
      "vamp-bench applies to measured runs (bench/stats). T: ",
      list(ttft_limits, 1), " s; P: ", list(tpot_limits, 1e3),
      " ms (percentiles 25/50/75/90/99 of all runs' values).\n\nCells won (highest Q; within "
      "2 % of it counts as a tie) out of ",
      ttft_limits.size() * tpot_limits.size(), ":\n\n| ", sweep ? "c" : "workload", " |");
  for (const std::string& p : spec.policies) absl::StrAppend(&md, " ", p, " |");
  absl::StrAppend(&md, "\n|---:|");
  for (size_t k = 0; k < spec.policies.size(); ++k) absl::StrAppend(&md, "---:|");
  absl::StrAppend(&md, "\n");
  const std::vector<int32_t> points = sweep ? spec.concurrencies : std::vector<int32_t>{0};
  std::string against;  // Q of each policy against the first, by concurrency
  for (int32_t c : points) {
    std::vector<const bench::QGrid*> at;
    for (const std::string& p : spec.policies) at.push_back(grid_of(p, c));
    absl::StrAppend(&md, "| ", sweep ? absl::StrCat(c) : std::string("–"), " |");
    for (int w : bench::CellsWon(at)) absl::StrAppend(&md, " ", w, " |");
    absl::StrAppend(&md, "\n");
    for (size_t k = 1; k < at.size() && at[0] != nullptr; ++k) {
      if (at[k] == nullptr) continue;
      absl::StrAppend(&against, "| ", sweep ? absl::StrCat(c) : std::string("–"), " | ",
                      spec.policies[k], " | ",
                      bench::DescribeQComparison(bench::CompareQ(*at[k], *at[0])), " |\n");
    }
  }
  if (!against.empty()) {
    absl::StrAppend(&md, "\nQ against ", spec.policies[0],
                    ", cell by cell (geometric mean of Q ÷ its Q where both qualified "
                    "someone):\n\n| ", sweep ? "c" : "workload", " | policy | Q ratio |\n|---:|---|---|\n",
                    against);
  }
  const int32_t focus = points.back();
  absl::StrAppend(&md, "\nQ(T, P) in turns/s", sweep ? absl::StrCat(" at c = ", focus) : "",
                  " (rows T, columns P; each cell lists ", absl::StrJoin(spec.policies, " / "),
                  "):\n\n| T \\ P |");
  for (double p : tpot_limits) absl::StrAppend(&md, absl::StrFormat(" %.4g ms |", p * 1e3));
  absl::StrAppend(&md, "\n|---:|");
  for (size_t j = 0; j < tpot_limits.size(); ++j) absl::StrAppend(&md, "---|");
  absl::StrAppend(&md, "\n");
  for (size_t i = 0; i < ttft_limits.size(); ++i) {
    absl::StrAppend(&md, absl::StrFormat("| %.4g s |", ttft_limits[i]));
    for (size_t j = 0; j < tpot_limits.size(); ++j) {
      std::vector<std::string> cell;
      for (const std::string& p : spec.policies) {
        const bench::QGrid* g = grid_of(p, focus);
        cell.push_back(g ? absl::StrFormat("%.3g", g->q_per_s[i][j]) : "–");
      }
      absl::StrAppend(&md, " ", absl::StrJoin(cell, " / "), " |");
    }
    absl::StrAppend(&md, "\n");
  }
  return absl::StrCat(md, "\n");
}

}  // namespace

RenderedReport RenderReport(const ReportSpec& spec) {
  RenderedReport out;
  std::string& md = out.markdown;
  auto svg = [&](const std::string& name, std::string contents, const std::string& alt) {
    const std::string file = absl::StrCat(spec.svg_prefix, "-", name, ".svg");
    out.svgs.push_back({file, std::move(contents)});
    absl::StrAppend(&md, "![", alt, "](", file, ")\n\n");
  };
  absl::StrAppend(&md, "# ", spec.title, "\n\n");
  absl::StrAppend(&md, "Command:\n\n```\n", spec.command, "\n```\n\n");
  for (const std::string& line : spec.setting) absl::StrAppend(&md, "- ", line, "\n");
  absl::StrAppendFormat(&md, "- Simulator wall time: %.1f s for %d runs on %d threads\n\n",
                        spec.total_wall_s, spec.runs.size(), spec.threads);

  const bool sweep = !spec.concurrencies.empty();
  if (sweep) {
    // TTFT p99 against concurrency, next to the paper.
    absl::StrAppend(&md, "## Steady-state TTFT p99 (s) against concurrency\n\n| policy |");
    for (int32_t c : spec.concurrencies) absl::StrAppend(&md, " c = ", c, " |");
    absl::StrAppend(&md, "\n| --- |");
    for (size_t i = 0; i < spec.concurrencies.size(); ++i) absl::StrAppend(&md, " ---: |");
    absl::StrAppend(&md, "\n");
    for (const std::string& policy : spec.policies) {
      absl::StrAppend(&md, "| ", policy, " |");
      for (int32_t c : spec.concurrencies) {
        const SimResult* r = Find(spec.runs, policy, c);
        const std::string paper = PaperCell(spec.paper, policy, c);
        absl::StrAppend(&md, " ", r ? absl::StrFormat("%.2f", TtftP(*r, 99)) : "–",
                        paper.empty() ? "" : absl::StrCat(" (paper: ", paper, ")"), " |");
      }
      absl::StrAppend(&md, "\n");
    }
    absl::StrAppend(&md, "\n");
    LineChart ttft =
        Line("Steady-state TTFT p99", "concurrent sessions c", "TTFT p99 (s, log)", true);
    LineChart hit = Line("Prefix-cache hit rate", "concurrent sessions c", "hit rate (%)");
    LineChart tpot = Line("Mean TPOT", "concurrent sessions c", "TPOT (ms)");
    for (const std::string& policy : spec.policies) {
      ChartSeries a = Series(policy), b = Series(policy), t = Series(policy);
      for (int32_t c : spec.concurrencies) {
        if (const SimResult* r = Find(spec.runs, policy, c)) {
          a.points.push_back({static_cast<double>(c), TtftP(*r, 99)});
          b.points.push_back({static_cast<double>(c), 100 * r->counters.prefix_cache.HitRate()});
          t.points.push_back({static_cast<double>(c), r->MeanTpotMs()});
        }
      }
      ttft.series.push_back(a);
      hit.series.push_back(b);
      tpot.series.push_back(t);
    }
    // The paper's points (only those it states as numbers), as open squares in the policy's
    // colour.
    for (size_t i = 0; i < spec.policies.size(); ++i) {
      const std::string& policy = spec.policies[i];
      ChartSeries p = Series(absl::StrCat(policy, " (paper)"));
      p.dashed = true;
      p.hollow_markers = true;
      p.color = static_cast<int>(i);
      for (const PaperPoint& pp : spec.paper) {
        if (pp.policy == policy && pp.ttft_p99_s > 0) {
          p.points.push_back({static_cast<double>(pp.concurrency), pp.ttft_p99_s});
        }
      }
      if (!p.points.empty()) ttft.series.push_back(p);
    }
    svg("ttft-p99", RenderLineChart(ttft), "TTFT p99 against concurrency");
    svg("hit-rate", RenderLineChart(hit), "Prefix-cache hit rate against concurrency");
    svg("tpot", RenderLineChart(tpot), "Mean TPOT against concurrency");
  }

  absl::StrAppend(&md, "## All runs\n\n", ResultsTable(spec.runs, sweep), "\n");
  absl::StrAppend(&md, WindowTable(spec, sweep), QualifiedThroughputSection(spec, sweep));
  if (spec.phase_split_s > 0) {
    absl::StrAppendFormat(&md, "## Late phase: turns arriving at or after %.0f s\n\n",
                          spec.phase_split_s);
    absl::StrAppend(&md, PhaseTable(spec.runs, sweep, spec.phase_split_s), "\n");
  }

  // Time series and decisions at the largest concurrency (or the single workload).
  const int32_t focus = sweep ? spec.concurrencies.back() : 0;
  std::vector<const SimResult*> focused;
  for (const std::string& policy : spec.policies) {
    if (const SimResult* r = Find(spec.runs, policy, focus)) focused.push_back(r);
  }
  if (!focused.empty()) {
    const std::string where = sweep ? absl::StrCat(" (c = ", focus, ")") : "";
    absl::StrAppend(&md, "## Over time", where, "\n\n");
    LineChart pool =
        Line(absl::StrCat("KV pool size per GPU", where), "virtual time (s)", "KV pool (GiB)");
    LineChart ratio = Line(absl::StrCat("Expert offload ratio", where), "virtual time (s)",
                           "offloaded experts per eligible layer (%)");
    LineChart waiting =
        Line(absl::StrCat("Waiting requests", where), "virtual time (s)", "waiting");
    for (const SimResult* r : focused) {
      ChartSeries p = Series(r->policy, false), o = Series(r->policy, false),
                  w = Series(r->policy, false);
      for (const TimeSample& t : r->series) {
        p.points.push_back({t.t_s, PoolGiB(*r, t.num_blocks)});
        o.points.push_back({t.t_s, 100 * t.offload_ratio});
        w.points.push_back({t.t_s, static_cast<double>(t.waiting)});
      }
      pool.series.push_back(p);
      ratio.series.push_back(o);
      waiting.series.push_back(w);
    }
    svg("kv-pool", RenderLineChart(pool), "KV pool size over time");
    svg("offload-ratio", RenderLineChart(ratio), "Offload ratio over time");
    svg("waiting", RenderLineChart(waiting), "Waiting requests over time");

    std::map<std::string, size_t> kinds;
    for (const SimResult* r : focused) {
      for (const auto& [choice, n] : r->decisions) kinds.emplace(choice, 0);
    }
    if (!kinds.empty()) {
      BarChart bars;
      bars.title = absl::StrCat("Arbiter decisions by kind", where);
      bars.y_label = "decisions (log)";
      bars.log_y = true;
      for (const SimResult* r : focused) bars.categories.push_back(r->policy);
      for (const auto& [choice, unused] : kinds) {
        BarGroup g;
        g.name = choice;
        for (const SimResult* r : focused) {
          auto it = r->decisions.find(choice);
          g.values.push_back(it == r->decisions.end() ? 0 : static_cast<double>(it->second));
        }
        bars.groups.push_back(g);
      }
      absl::StrAppend(&md, "## Arbiter decisions", where, "\n\n");
      svg("decisions", RenderBarChart(bars), "Arbiter decisions by kind");
    }
  }

  // §VI-D: the scores behind the choices, and the learned coefficients.
  std::string scores;
  for (const RunRecord& run : spec.runs) {
    const SimResult& r = run.result;
    if (!r.live.has_value()) continue;
    absl::StrAppend(
        &scores, "| ", sweep ? absl::StrCat(run.concurrency, " | ") : "", r.policy,
        absl::StrFormat(
            " | %d | %s | %s | %d | %s | %s | %.1f %% | %.0f | %.1f | %.1f |\n",
            r.evict_choice_cc_ms.size(),
            r.evict_choice_cc_ms.empty() ? "–"
                                         : absl::StrFormat("%.2f", Median(r.evict_choice_cc_ms)),
            r.evict_choice_ce_ms.empty() ? "–"
                                         : absl::StrFormat("%.2f", Median(r.evict_choice_ce_ms)),
            r.offload_choice_cc_ms.size(),
            r.offload_choice_cc_ms.empty()
                ? "–"
                : absl::StrFormat("%.2f", Median(r.offload_choice_cc_ms)),
            r.offload_choice_ce_ms.empty()
                ? "–"
                : absl::StrFormat("%.2f", Median(r.offload_choice_ce_ms)),
            100 * r.live->hit_rate, r.live->t_queue_micros, r.live->t_prefill_micros,
            r.live->c_eff_micros));
  }
  if (!scores.empty()) {
    absl::StrAppend(
        &md, "## Cost-model scores (§VI-D) and learned coefficients at the end\n\n",
        "Medians of the logged scores (ms) over the decisions that chose eviction and over those "
        "that chose to offload (where both were evaluated); then r_hit (window), t_queue (µs), "
        "t_prefill (µs/token) and c_eff (µs) as the arbiter priced them last.\n\n| ",
        sweep ? "c | " : "",
        "policy | evict choices | median C_c | median C_e | offload choices | median C_c | "
        "median C_e | r_hit | t_queue | t_prefill | c_eff |\n|",
        sweep ? " ---: |" : "",
        " --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n", scores,
        "\n");
  }
  return out;
}

}  // namespace vamp::sim
