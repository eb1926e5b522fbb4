// A small hand-written SVG chart writer shared by the reports of vamp-sim and vamp-bench: line
// charts (linear or log y, optional horizontal reference lines) and grouped bar charts, as
// self-contained files that any browser or markdown viewer renders. Colours come from a
// colour-blind-friendly palette; the legend sits to the right of the plot, outside it.
#ifndef VAMP_BENCH_CHART_SVG_CHART_H_
#define VAMP_BENCH_CHART_SVG_CHART_H_

#include <string>
#include <utility>
#include <vector>

namespace vamp::chart {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), in x order
  bool dashed = false;
  bool markers = true;
  // Markers drawn as open squares (e.g. reference points next to measured ones).
  bool hollow_markers = false;
  // Palette index (-1 = by position among the series).
  int color = -1;
  // false: markers only, no connecting line (scatter; e.g. one point per request).
  bool line = true;
};

// A horizontal reference line across the plot (e.g. a value the paper reports), drawn dashed in
// grey with its label at the right end, inside the plot.
struct ReferenceLine {
  std::string label;
  double y = 0;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;  // non-positive values are left out
  int width = 720;
  int height = 400;
  std::vector<ChartSeries> series;
  std::vector<ReferenceLine> references;
};

struct BarGroup {
  std::string name;            // one series (a colour)
  std::vector<double> values;  // one per category
};

struct BarChart {
  std::string title;
  std::string y_label;
  bool log_y = false;
  int width = 720;
  int height = 400;
  std::vector<std::string> categories;  // x groups
  std::vector<BarGroup> groups;
};

std::string RenderLineChart(const LineChart& chart);
std::string RenderBarChart(const BarChart& chart);

// "Nice" axis ticks covering [lo, hi] (about `count` of them).
std::vector<double> NiceTicks(double lo, double hi, int count);

}  // namespace vamp::chart

#endif  // VAMP_BENCH_CHART_SVG_CHART_H_
