// A small SVG line/scatter chart writer for tandem's reports (bench --sweep): linear or log
// axes, several series, a legend, text labels. Standalone SVG 1.1, viewable in any browser.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::apps {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
  std::string color = "#1f77b4";
  bool line = true;      // join the points
  bool markers = true;   // draw a dot at each point
  bool dashed = false;
};

struct Label {
  double x, y;  // data coordinates
  std::string text;
  std::string color = "#333";
};

struct Chart {
  std::string title, subtitle, x_label, y_label;
  bool log_x = false, log_y = false;
  std::vector<Series> series = {};  // (initialized, so shorter aggregate initializers are complete)
  std::vector<Label> labels = {};
  // Axis ranges; NaN = from the data.
  double x_min = NAN, x_max = NAN, y_min = NAN, y_max = NAN;
};

// The chart as an SVG document. Points that cannot be drawn (non-finite, or <= 0 on a log
// axis) are skipped.
std::string render_svg(const Chart& chart);
Status write_svg(const Chart& chart, const std::string& path);

}  // namespace tandem::apps
