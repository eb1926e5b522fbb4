// A small hand-written SVG chart writer for vamp-sim's reports: line charts (linear or log y) and
// grouped bar charts, self-contained files that any browser or markdown viewer renders.
#ifndef VAMP_SIM_SVG_CHART_H_
#define VAMP_SIM_SVG_CHART_H_

#include <string>
#include <utility>
#include <vector>

namespace vamp::sim {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), in x order
  bool dashed = false;
  bool markers = true;
  // Markers drawn as open squares (e.g. reference points next to measured ones).
  bool hollow_markers = false;
  // Palette index (-1 = by position among the series).
  int color = -1;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;  // non-positive values are left out
  int width = 720;
  int height = 400;
  std::vector<ChartSeries> series;
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

}  // namespace vamp::sim

#endif  // VAMP_SIM_SVG_CHART_H_
