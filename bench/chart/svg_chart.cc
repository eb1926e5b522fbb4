#include "bench/chart/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vamp::chart {
namespace {

// Colour-blind-friendly palette (Okabe–Ito), then greys.
constexpr const char* kColors[] = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00",
                                   "#0072B2", "#CC79A7", "#F0E442", "#777777", "#BBBBBB"};
const char* Color(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return absl::StrFormat("%.3g", v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  if (a >= 10) return absl::StrFormat("%.4g", v);
  return absl::StrFormat("%.3g", v);
}

// Plot area and y mapping shared by both chart kinds.
struct Frame {
  double left = 70, right = 200, top = 40, bottom = 55;  // margins (legend on the right)
  int width, height;
  double y_lo, y_hi;
  bool log_y;
  double x0() const { return left; }
  double x1() const { return width - right; }
  double y0() const { return height - bottom; }
  double y1() const { return top; }
  double Y(double v) const {
    const double a = log_y ? std::log10(v) : v;
    const double lo = log_y ? std::log10(y_lo) : y_lo;
    const double hi = log_y ? std::log10(y_hi) : y_hi;
    return y0() - (a - lo) / (hi - lo) * (y0() - y1());
  }
};

std::string Header(int width, int height, const std::string& title) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" "
      "font-weight=\"bold\">%s</text>\n",
      width, height, width, height, width / 2, Escape(title));
}

// Y range and ticks for the values in `ys` (log: decades and 2/5 steps).
std::vector<double> YAxis(std::vector<double> ys, bool log_y, double* lo, double* hi) {
  if (log_y)
    ys.erase(std::remove_if(ys.begin(), ys.end(), [](double v) { return v <= 0; }), ys.end());
  if (ys.empty()) ys = {log_y ? 1.0 : 0.0, log_y ? 10.0 : 1.0};
  double mn = *std::min_element(ys.begin(), ys.end());
  double mx = *std::max_element(ys.begin(), ys.end());
  if (log_y) {
    *lo = std::pow(10, std::floor(std::log10(mn)));
    *hi = std::pow(10, std::ceil(std::log10(mx)));
    if (*hi <= *lo) *hi = *lo * 10;
    std::vector<double> ticks;
    for (double d = *lo; d <= *hi * 1.0001; d *= 10) {
      for (double m : {1.0, 2.0, 5.0}) {
        if (d * m <= *hi * 1.0001 && (*hi / *lo <= 1e3 || m == 1.0)) ticks.push_back(d * m);
      }
    }
    return ticks;
  }
  mn = std::min(0.0, mn);
  if (mx <= mn) mx = mn + 1;
  std::vector<double> ticks = NiceTicks(mn, mx, 6);
  *lo = ticks.front();
  *hi = ticks.back();
  return ticks;
}

std::string Axes(const Frame& f, const std::vector<double>& y_ticks, const std::string& x_label,
                 const std::string& y_label) {
  std::string s;
  for (double t : y_ticks) {
    const double y = f.Y(t);
    absl::StrAppendFormat(
        &s,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n"
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
        f.x0(), y, f.x1(), y, f.x0() - 6, y + 4, Num(t));
  }
  absl::StrAppendFormat(
      &s,
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
      f.x0(), f.y0(), f.x1(), f.y0(), f.x0(), f.y0(), f.x0(), f.y1());
  absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        (f.x0() + f.x1()) / 2, static_cast<double>(f.height) - 12, Escape(x_label));
  absl::StrAppendFormat(&s,
                        "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 16 %.1f)\">%s</text>\n",
                        (f.y0() + f.y1()) / 2, (f.y0() + f.y1()) / 2, Escape(y_label));
  return s;
}

struct LegendEntry {
  std::string name;
  const char* color;
  bool dashed;
};

std::string Legend(const Frame& f, const std::vector<LegendEntry>& entries) {
  std::string s;
  for (size_t i = 0; i < entries.size(); ++i) {
    const double y = f.y1() + 10 + 18.0 * static_cast<double>(i);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"3\"%s/>\n<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          f.x1() + 12, y, f.x1() + 36, y, entries[i].color,
                          entries[i].dashed ? " stroke-dasharray=\"5,3\"" : "", f.x1() + 42, y + 4,
                          Escape(entries[i].name));
  }
  return s;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int count) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, count - 1);
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag * 1.0000001) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step) * step;
  for (double t = first; t < hi + step * 0.999; t += step) ticks.push_back(t);
  if (ticks.size() < 2) ticks.push_back(first + step);
  return ticks;
}

std::string RenderLineChart(const LineChart& c) {
  Frame f;
  f.width = c.width;
  f.height = c.height;
  f.log_y = c.log_y;
  std::vector<double> ys;
  double x_min = std::numeric_limits<double>::infinity();
  double x_max = -x_min;
  for (const ChartSeries& s : c.series) {
    for (const auto& [x, y] : s.points) {
      ys.push_back(y);
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
    }
  }
  for (const ReferenceLine& r : c.references) ys.push_back(r.y);
  if (!std::isfinite(x_min)) {
    x_min = 0;
    x_max = 1;
  }
  const std::vector<double> y_ticks = YAxis(ys, c.log_y, &f.y_lo, &f.y_hi);
  std::vector<double> x_ticks = NiceTicks(x_min, x_max, 7);
  const double xl = x_ticks.front();
  const double xh = std::max(x_ticks.back(), xl + 1e-9);
  auto X = [&](double x) { return f.x0() + (x - xl) / (xh - xl) * (f.x1() - f.x0()); };

  std::string s = Header(c.width, c.height, c.title);
  s += Axes(f, y_ticks, c.x_label, c.y_label);
  for (double t : x_ticks) {
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          X(t), f.y0() + 16, Num(t));
  }
  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const ChartSeries& series = c.series[i];
    const char* color = Color(series.color >= 0 ? static_cast<size_t>(series.color) : i);
    legend.push_back({series.name, color, series.dashed});
    std::string path;
    for (const auto& [x, y] : series.points) {
      if (c.log_y && y <= 0) continue;
      absl::StrAppendFormat(&path, "%s%.1f,%.1f", path.empty() ? "" : " ", X(x), f.Y(y));
    }
    if (path.empty()) continue;
    if (series.line) {
      absl::StrAppendFormat(&s,
                            "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s "
                            "points=\"%s\"/>\n",
                            color, series.dashed ? " stroke-dasharray=\"5,3\"" : "", path);
    }
    if (!series.markers) continue;
    for (const auto& [x, y] : series.points) {
      if (c.log_y && y <= 0) continue;
      if (series.hollow_markers) {
        absl::StrAppendFormat(&s,
                              "<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" "
                              "fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                              X(x) - 4.5, f.Y(y) - 4.5, color);
      } else {
        absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", X(x),
                              f.Y(y), color);
      }
    }
  }
  for (const ReferenceLine& r : c.references) {
    if (c.log_y && r.y <= 0) continue;
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"#777777\" stroke-width=\"1.5\" stroke-dasharray=\"2,4\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555555\">%s"
                          "</text>\n",
                          f.x0(), f.Y(r.y), f.x1(), f.Y(r.y), f.x1() - 4, f.Y(r.y) - 4,
                          Escape(r.label));
  }
  s += Legend(f, legend);
  s += "</svg>\n";
  return s;
}

std::string RenderBarChart(const BarChart& c) {
  Frame f;
  f.width = c.width;
  f.height = c.height;
  f.log_y = c.log_y;
  std::vector<double> ys;
  for (const BarGroup& g : c.groups) ys.insert(ys.end(), g.values.begin(), g.values.end());
  const std::vector<double> y_ticks = YAxis(ys, c.log_y, &f.y_lo, &f.y_hi);
  std::string s = Header(c.width, c.height, c.title);
  s += Axes(f, y_ticks, "", c.y_label);
  const size_t n = std::max<size_t>(1, c.categories.size());
  const double slot = (f.x1() - f.x0()) / static_cast<double>(n);
  const double bar = slot * 0.8 / static_cast<double>(std::max<size_t>(1, c.groups.size()));
  for (size_t k = 0; k < c.categories.size(); ++k) {
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          f.x0() + slot * (static_cast<double>(k) + 0.5), f.y0() + 16,
                          Escape(c.categories[k]));
    for (size_t g = 0; g < c.groups.size(); ++g) {
      if (k >= c.groups[g].values.size()) continue;
      const double v = c.groups[g].values[k];
      if (c.log_y && v <= 0) continue;
      const double base = c.log_y ? f.y_lo : std::max(0.0, f.y_lo);
      const double x =
          f.x0() + slot * static_cast<double>(k) + slot * 0.1 + bar * static_cast<double>(g);
      const double y_top = f.Y(std::max(v, base));
      absl::StrAppendFormat(&s,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"%s\"><title>%s: %s</title></rect>\n",
                            x, y_top, std::max(1.0, bar - 1), std::max(0.0, f.Y(base) - y_top),
                            Color(g), Escape(c.groups[g].name), Num(v));
    }
  }
  std::vector<LegendEntry> legend;
  for (size_t g = 0; g < c.groups.size(); ++g)
    legend.push_back({c.groups[g].name, Color(g), false});
  s += Legend(f, legend);
  s += "</svg>\n";
  return s;
}

}  // namespace vamp::chart
