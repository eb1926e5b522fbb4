// The shared SVG chart writer: escaping, log axes, reference lines, scatter series, bars, ticks.
#include "bench/chart/svg_chart.h"

#include <algorithm>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::chart {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SvgChartTest, LineAndBarCharts) {
  LineChart c;
  c.title = "a < b";
  c.log_y = true;
  ChartSeries s;
  s.name = "x";
  s.points = {{1, 0.5}, {2, 50}, {3, 0}};  // the 0 is left out on a log axis
  c.series.push_back(s);
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, HasSubstr("a &lt; b"));
  EXPECT_THAT(svg, HasSubstr("<polyline"));
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 5, true);
  BarChart b;
  b.categories = {"p", "q"};
  BarGroup g;
  g.name = "evict";
  g.values = {3, 0};
  b.groups.push_back(g);
  EXPECT_THAT(RenderBarChart(b), HasSubstr("<rect x="));
  const std::vector<double> ticks = NiceTicks(0, 97, 6);
  EXPECT_EQ(ticks.front(), 0);
  EXPECT_GE(ticks.back(), 97);
  EXPECT_LE(ticks.size(), 8u);
}

TEST(SvgChartTest, ReferenceLinesAndScatterSeries) {
  LineChart c;
  c.title = "TTFT";
  ChartSeries s;
  s.name = "requests";
  s.line = false;
  s.points = {{0, 1}, {1, 2}};
  c.series.push_back(s);
  c.references.push_back({"paper: 9.1 s", 9.1});
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, Not(HasSubstr("<polyline")));
  EXPECT_THAT(svg, HasSubstr("<circle"));
  EXPECT_THAT(svg, HasSubstr("paper: 9.1 s"));
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray=\"2,4\""));
}

}  // namespace
}  // namespace vamp::chart
