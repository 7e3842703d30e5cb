#include "apps/svg_chart.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

namespace tandem::apps {

namespace {

constexpr double kWidth = 760, kHeight = 470;
constexpr double kLeft = 80, kRight = 200, kTop = 62, kBottom = 58;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string tick_text(double v) {
  const double a = std::fabs(v);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:g}", v);
}

struct Axis {
  bool log;
  double lo, hi;        // data range (log10 of it on a log axis)
  double px_lo, px_hi;  // pixel range
  double map(double v) const {
    const double t = ((log ? std::log10(v) : v) - lo) / (hi - lo);
    return px_lo + t * (px_hi - px_lo);
  }
  bool drawable(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

// Tick values inside [lo, hi] (data units).
std::vector<double> ticks(const Axis& a) {
  std::vector<double> out;
  if (a.log) {
    const int d0 = (int)std::floor(a.lo), d1 = (int)std::ceil(a.hi);
    const bool dense = d1 - d0 <= 3;
    for (int d = d0; d <= d1; d++)
      for (double m : dense ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * std::pow(10.0, d);
        const double l = std::log10(v);
        if (l >= a.lo - 1e-9 && l <= a.hi + 1e-9) out.push_back(v);
      }
    return out;
  }
  const double span = a.hi - a.lo, raw = span / 6;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(a.lo / step) * step; v <= a.hi + step * 1e-9; v += step) out.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return out;
}

Axis make_axis(bool log, double dmin, double dmax, double fixed_min, double fixed_max, double px_lo, double px_hi) {
  Axis a{log, 0, 1, px_lo, px_hi};
  double lo = std::isnan(fixed_min) ? dmin : fixed_min, hi = std::isnan(fixed_max) ? dmax : fixed_max;
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = log ? 1 : 0, hi = log ? 10 : 1;
  if (log) {
    lo = std::log10(std::max(lo, 1e-300));
    hi = std::log10(std::max(hi, 1e-300));
    if (std::isnan(fixed_min)) lo = std::floor(lo * 4) / 4;  // a little room, on quarter decades
    if (std::isnan(fixed_max)) hi = std::ceil(hi * 4) / 4;
  } else {
    if (std::isnan(fixed_min)) lo = std::min(lo, 0.0);
    if (std::isnan(fixed_max)) hi = hi + (hi - lo) * 0.05;
  }
  if (hi <= lo) hi = lo + 1;
  a.lo = lo;
  a.hi = hi;
  return a;
}

}  // namespace

// Breaks text into lines of at most `width` characters at spaces.
static std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t sp = text.find(' ', pos);
    if (sp == std::string::npos) sp = text.size();
    const std::string word = text.substr(pos, sp - pos);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = sp + 1;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string render_svg(const Chart& c) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0) || (c.log_y && y <= 0)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  const std::vector<std::string> sub = c.subtitle.empty() ? std::vector<std::string>{} : wrap(c.subtitle, 100);
  const double top = kTop + 15.0 * std::max<double>(0, (double)sub.size() - 1);
  const Axis ax = make_axis(c.log_x, xmin, xmax, c.x_min, c.x_max, kLeft, kWidth - kRight);
  const Axis ay = make_axis(c.log_y, ymin, ymax, c.y_min, c.y_max, kHeight - kBottom, top);

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, kHeight);
  o += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"17\" font-weight=\"bold\">{}</text>\n", kLeft, escape(c.title));
  for (size_t k = 0; k < sub.size(); k++)
    o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#555\">{}</text>\n", kLeft, 44 + 15 * k, escape(sub[k]));
  // Grid and ticks.
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = top;
  for (double v : ticks(ax)) {
    const double px = ax.map(v);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>\n", px, y0, y1);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", px, y0 + 16, tick_text(v));
  }
  for (double v : ticks(ay)) {
    const double py = ay.map(v);
    o += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#e4e4e4\"/>\n", py, x0, x1);
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", x0 - 6, py + 4, tick_text(v));
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", x0, y1, x1 - x0, y0 - y1);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">{}</text>\n", (x0 + x1) / 2, kHeight - 16,
                   escape(c.x_label + (c.log_x ? " (log)" : "")));
  o += fmt::format("<text transform=\"translate(20,{:.1f}) rotate(-90)\" font-size=\"13\" text-anchor=\"middle\">{}</text>\n",
                   (y0 + y1) / 2, escape(c.y_label + (c.log_y ? " (log)" : "")));
  // Series, clipped to the plot area.
  o += fmt::format("<clipPath id=\"plot\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>\n<g clip-path=\"url(#plot)\">\n",
                   x0, y1, x1 - x0, y0 - y1);
  for (const Series& s : c.series) {
    std::string pts;
    for (auto [x, y] : s.points)
      if (ax.drawable(x) && ay.drawable(y)) pts += fmt::format("{:.1f},{:.1f} ", ax.map(x), ay.map(y));
    if (s.line && !pts.empty())
      o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", pts, s.color,
                       s.dashed ? " stroke-dasharray=\"6,4\"" : "");
    if (s.markers)
      for (auto [x, y] : s.points)
        if (ax.drawable(x) && ay.drawable(y))
          o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", ax.map(x), ay.map(y), s.color);
  }
  for (const Label& l : c.labels)
    if (ax.drawable(l.x) && ay.drawable(l.y))
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"{}\">{}</text>\n", ax.map(l.x) + 7, ay.map(l.y) - 7,
                       l.color, escape(l.text));
  o += "</g>\n";
  // Legend.
  double ly = y1 + 8;
  for (const Series& s : c.series) {
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"{4}/>\n", x1 + 14, ly, x1 + 38,
                     s.color, s.dashed ? " stroke-dasharray=\"6,4\"" : "");
    o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", x1 + 44, ly + 4, escape(s.name));
    ly += 20;
  }
  o += "</svg>\n";
  return o;
}

Status write_svg(const Chart& chart, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error("cannot write {}", path);
  f << render_svg(chart);
  if (!f) return make_error("writing {} failed", path);
  return Status::Ok();
}

}  // namespace tandem::apps
