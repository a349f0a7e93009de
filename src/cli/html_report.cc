#include "cli/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/fs.h"

namespace zinf::cli {
namespace {

constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr int kWidth = 760;

const char* Color(size_t i) { return kPalette[i % kPaletteSize]; }

// SVG coordinates: one decimal is plenty.
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// A step of 1, 2 or 5 times a power of ten giving about `target` ticks over `span`.
double NiceStep(double span, int target) {
  if (!(span > 0)) return 1.0;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10.0 * mag;
}

std::string Text(double x, double y, std::string_view text, std::string_view attrs = "") {
  std::string s = "<text x=\"" + Num(x) + "\" y=\"" + Num(y) + "\"";
  if (!attrs.empty()) s += " " + std::string(attrs);
  return s + ">" + HtmlEscape(text) + "</text>";
}

std::string Rect(double x, double y, double w, double h, std::string_view fill, std::string_view tooltip) {
  std::string s = "<rect x=\"" + Num(x) + "\" y=\"" + Num(y) + "\" width=\"" + Num(std::max(w, 0.0)) + "\" height=\"" +
                  Num(std::max(h, 0.0)) + "\" fill=\"" + std::string(fill) + "\">";
  if (!tooltip.empty()) s += "<title>" + HtmlEscape(tooltip) + "</title>";
  return s + "</rect>";
}

std::string SvgOpen(int width, int height, std::string_view label) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
         "\" role=\"img\" aria-label=\"" + HtmlEscape(label) + "\">";
}

// A row of colour swatches with names, starting at (x, y); past `max_x` it
// goes on in a new row 16 below (`rows`, when given, gets the row count).
std::string Legend(double x, double y, const std::vector<std::string>& names,
                   double max_x = std::numeric_limits<double>::infinity(), int* rows = nullptr) {
  std::string s;
  const double x_start = x;
  int n = 1;
  for (size_t i = 0; i < names.size(); ++i) {
    const double w = 30 + 7.5 * static_cast<double>(names[i].size());
    if (x > x_start && x + w > max_x) {
      x = x_start;
      y += 16;
      ++n;
    }
    s += Rect(x, y - 9, 10, 10, Color(i), "");
    s += Text(x + 14, y, names[i], "class=\"small\"");
    x += w;
  }
  if (rows != nullptr) *rows = n;
  return s;
}

// Axis ticks are round numbers: the shortest form ("0.5", "2", "10", "1e+06").
std::string Tick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", std::fabs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

std::string Figure(std::string svg) { return "<figure>" + svg + "</figure>\n"; }

}  // namespace

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string FormatFigure(double value) {
  if (!std::isfinite(value)) return "n/a";
  char buf[48];
  const double a = std::fabs(value);
  if (a != 0 && (a < 1e-3 || a >= 1e7)) {
    std::snprintf(buf, sizeof(buf), "%.4g", value);
  } else {
    // Four significant digits without an exponent.
    const int decimals = a == 0 ? 0 : std::max(0, 3 - static_cast<int>(std::floor(std::log10(a))));
    std::snprintf(buf, sizeof(buf), "%.*f", std::min(decimals, 9), value);
  }
  return buf;
}

HtmlReport::HtmlReport(std::string title) : title_(std::move(title)) {}

void HtmlReport::AddParagraph(std::string_view text) { sections_.push_back("<p>" + HtmlEscape(text) + "</p>\n"); }

void HtmlReport::AddTable(std::string_view caption, const std::vector<std::string>& header,
                          const std::vector<std::vector<std::string>>& rows) {
  std::string s = "<table>";
  if (!caption.empty()) s += "<caption>" + HtmlEscape(caption) + "</caption>";
  if (!header.empty()) {
    s += "<thead><tr>";
    for (const std::string& h : header) s += "<th>" + HtmlEscape(h) + "</th>";
    s += "</tr></thead>";
  }
  s += "<tbody>";
  for (const auto& row : rows) {
    s += "<tr>";
    for (const std::string& c : row) s += "<td>" + HtmlEscape(c) + "</td>";
    s += "</tr>";
  }
  sections_.push_back(s + "</tbody></table>\n");
}

void HtmlReport::AddBarChart(const BarChart& chart) {
  const int height = 340;
  const double x0 = 70, x1 = kWidth - 20, y_top = 56, y_bottom = height - 64;
  double lo = 0, hi = 0;
  for (const ChartSeries& s : chart.series) {
    for (double v : s.values) {
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (hi <= lo) hi = lo + 1;
  const double step = NiceStep(hi - lo, 5);
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  auto y_of = [&](double v) { return y_bottom - (v - lo) / (hi - lo) * (y_bottom - y_top); };

  std::string s = SvgOpen(kWidth, height, chart.title);
  s += Text(10, 20, chart.title, "class=\"title\"");
  std::vector<std::string> names;
  for (const ChartSeries& c : chart.series) names.push_back(c.name);
  s += Legend(x0, 40, names);
  for (double t = lo; t <= hi + step / 2; t += step) {
    const double y = y_of(t);
    s += "<line x1=\"" + Num(x0) + "\" x2=\"" + Num(x1) + "\" y1=\"" + Num(y) + "\" y2=\"" + Num(y) +
         "\" class=\"grid\"/>";
    s += Text(x0 - 6, y + 4, Tick(t), "class=\"small\" text-anchor=\"end\"");
  }
  const size_t ncat = std::max<size_t>(chart.categories.size(), 1);
  const double band = (x1 - x0) / static_cast<double>(ncat);
  const bool rotate = chart.categories.size() > 10;
  for (size_t c = 0; c < chart.categories.size(); ++c) {
    const double cx = x0 + band * (static_cast<double>(c) + 0.5);
    const std::string attrs = rotate ? "class=\"small\" text-anchor=\"end\" transform=\"rotate(-40 " + Num(cx) + " " +
                                           Num(y_bottom + 14) + ")\""
                                     : "class=\"small\" text-anchor=\"middle\"";
    s += Text(cx, y_bottom + 14, chart.categories[c], attrs);
  }
  const size_t nser = std::max<size_t>(chart.series.size(), 1);
  for (size_t k = 0; k < chart.series.size(); ++k) {
    const ChartSeries& ser = chart.series[k];
    if (chart.lines) {
      std::string points;
      auto flush = [&] {
        if (!points.empty()) {
          s += "<polyline fill=\"none\" stroke=\"" + std::string(Color(k)) + "\" stroke-width=\"2\" points=\"" +
               points + "\"/>";
        }
        points.clear();
      };
      for (size_t c = 0; c < ser.values.size() && c < chart.categories.size(); ++c) {
        const double v = ser.values[c];
        if (!std::isfinite(v)) {
          flush();
          continue;
        }
        const double cx = x0 + band * (static_cast<double>(c) + 0.5);
        points += Num(cx) + "," + Num(y_of(v)) + " ";
      }
      flush();
      for (size_t c = 0; c < ser.values.size() && c < chart.categories.size(); ++c) {
        const double v = ser.values[c];
        if (!std::isfinite(v)) continue;
        const double cx = x0 + band * (static_cast<double>(c) + 0.5);
        s += "<circle cx=\"" + Num(cx) + "\" cy=\"" + Num(y_of(v)) + "\" r=\"3\" fill=\"" + Color(k) + "\"><title>" +
             HtmlEscape(ser.name + " " + chart.categories[c] + ": " + FormatFigure(v)) + "</title></circle>";
      }
    } else {
      const double bw = band * 0.8 / static_cast<double>(nser);
      for (size_t c = 0; c < ser.values.size() && c < chart.categories.size(); ++c) {
        const double v = ser.values[c];
        if (!std::isfinite(v)) continue;
        const double x = x0 + band * static_cast<double>(c) + band * 0.1 + bw * static_cast<double>(k);
        const double ya = y_of(std::max(v, 0.0)), yb = y_of(std::min(v, 0.0));
        s += Rect(x, ya, bw - 1, yb - ya, Color(k), ser.name + " " + chart.categories[c] + ": " + FormatFigure(v));
      }
    }
  }
  s += "<line x1=\"" + Num(x0) + "\" x2=\"" + Num(x0) + "\" y1=\"" + Num(y_top) + "\" y2=\"" + Num(y_bottom) +
       "\" class=\"axis\"/>";
  s += "<line x1=\"" + Num(x0) + "\" x2=\"" + Num(x1) + "\" y1=\"" + Num(y_of(std::max(lo, 0.0))) + "\" y2=\"" +
       Num(y_of(std::max(lo, 0.0))) + "\" class=\"axis\"/>";
  s += Text((x0 + x1) / 2, height - 8, chart.x_label, "text-anchor=\"middle\"");
  s += Text(16, (y_top + y_bottom) / 2, chart.y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 16 " + Num((y_top + y_bottom) / 2) + ")\"");
  sections_.push_back(Figure(s + "</svg>"));
}

void HtmlReport::AddHeatmap(const Heatmap& map) {
  const double left = 120, top = 64;
  const size_t ncol = std::max<size_t>(map.columns.size(), 1);
  const double cw = std::min(96.0, (kWidth - left - 20) / static_cast<double>(ncol)), ch = 30;
  const int height = static_cast<int>(top + ch * static_cast<double>(map.rows.size()) + 56);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& row : map.values) {
    for (double v : row) {
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  std::string s = SvgOpen(kWidth, height, map.title);
  s += Text(10, 20, map.title, "class=\"title\"");
  s += Text(left + cw * static_cast<double>(ncol) / 2, 40, map.x_label, "text-anchor=\"middle\"");
  for (size_t c = 0; c < map.columns.size(); ++c) {
    s += Text(left + cw * (static_cast<double>(c) + 0.5), top - 6, map.columns[c],
              "class=\"small\" text-anchor=\"middle\"");
  }
  for (size_t r = 0; r < map.rows.size(); ++r) {
    const double y = top + ch * static_cast<double>(r);
    s += Text(left - 6, y + ch / 2 + 4, map.rows[r], "class=\"small\" text-anchor=\"end\"");
    for (size_t c = 0; c < map.columns.size(); ++c) {
      const double v = r < map.values.size() && c < map.values[r].size() ? map.values[r][c]
                                                                         : std::numeric_limits<double>::quiet_NaN();
      const double x = left + cw * static_cast<double>(c);
      const std::string where = map.y_label + " " + map.rows[r] + ", " + map.x_label + " " + map.columns[c] + ": ";
      if (!std::isfinite(v)) {
        s += Rect(x, y, cw - 2, ch - 2, "#e8e8e8", where + "not measured");
        s += Text(x + cw / 2, y + ch / 2 + 3, "n/a", "class=\"small\" text-anchor=\"middle\" fill=\"#888\"");
        continue;
      }
      // Light (#f7fbff) to dark (#08306b).
      const double t = hi > lo ? (v - lo) / (hi - lo) : 1.0;
      char fill[8];
      std::snprintf(fill, sizeof(fill), "#%02x%02x%02x", static_cast<int>(247 + t * (8 - 247)),
                    static_cast<int>(251 + t * (48 - 251)), static_cast<int>(255 + t * (107 - 255)));
      s += Rect(x, y, cw - 2, ch - 2, fill, where + FormatFigure(v) + " " + map.value_label);
      s += Text(x + cw / 2 - 1, y + ch / 2 + 3, FormatFigure(v),
                std::string("class=\"small\" text-anchor=\"middle\" fill=\"") + (t > 0.55 ? "#fff" : "#000") + "\"");
    }
  }
  s += Text(16, top + ch * static_cast<double>(map.rows.size()) / 2, map.y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 16 " +
                Num(top + ch * static_cast<double>(map.rows.size()) / 2) + ")\"");
  s += Text(left, height - 16,
            map.value_label + ": light = " + FormatFigure(std::isfinite(lo) ? lo : NAN) +
                ", dark = " + FormatFigure(std::isfinite(hi) ? hi : NAN) + "; grey = not measured",
            "class=\"small\"");
  sections_.push_back(Figure(s + "</svg>"));
}

void HtmlReport::AddTimeline(const Timeline& tl) {
  const double left = 110, right = kWidth - 30, top = 66, rh = 22, gap = 6;
  const int height = static_cast<int>(top + (rh + gap) * static_cast<double>(tl.rows.size()) + 48);
  auto clean = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  double hi = 0;
  for (const auto& row : tl.rows) {
    double total = 0;
    for (double v : row.segments) total += clean(v);
    hi = std::max(hi, total);
  }
  for (const auto& m : tl.markers) hi = std::max(hi, clean(m.value));
  if (hi <= 0) hi = 1;
  const double step = NiceStep(hi, 6);
  hi = std::ceil(hi / step) * step;
  auto x_of = [&](double v) { return left + v / hi * (right - left); };
  const double bottom = top + (rh + gap) * static_cast<double>(tl.rows.size());

  std::string s = SvgOpen(kWidth, height, tl.title);
  s += Text(10, 20, tl.title, "class=\"title\"");
  s += Legend(left, 40, tl.segment_names);
  for (double t = 0; t <= hi + step / 2; t += step) {
    const double x = x_of(t);
    s += "<line x1=\"" + Num(x) + "\" x2=\"" + Num(x) + "\" y1=\"" + Num(top - 4) + "\" y2=\"" + Num(bottom) +
         "\" class=\"grid\"/>";
    s += Text(x, bottom + 14, Tick(t), "class=\"small\" text-anchor=\"middle\"");
  }
  for (size_t r = 0; r < tl.rows.size(); ++r) {
    const auto& row = tl.rows[r];
    const double y = top + (rh + gap) * static_cast<double>(r);
    s += Text(left - 6, y + rh / 2 + 4, row.label, "class=\"small\" text-anchor=\"end\"");
    double at = 0;
    for (size_t k = 0; k < row.segments.size(); ++k) {
      const double v = clean(row.segments[k]);
      if (v <= 0) continue;
      const std::string name = k < tl.segment_names.size() ? tl.segment_names[k] : "segment " + std::to_string(k);
      s += Rect(x_of(at), y, x_of(at + v) - x_of(at), rh, Color(k),
                row.label + ": " + name + " " + FormatFigure(v) + " " + tl.unit);
      at += v;
    }
  }
  for (const auto& m : tl.markers) {
    const double x = x_of(clean(m.value));
    s += "<line x1=\"" + Num(x) + "\" x2=\"" + Num(x) + "\" y1=\"" + Num(top - 8) + "\" y2=\"" + Num(bottom) +
         "\" class=\"marker\"><title>" + HtmlEscape(m.name + ": " + FormatFigure(m.value) + " " + tl.unit) +
         "</title></line>";
    s += Text(x + 3, top - 6, m.name, "class=\"small\"");
  }
  s += Text((left + right) / 2, height - 8, tl.unit, "text-anchor=\"middle\"");
  sections_.push_back(Figure(s + "</svg>"));
}

namespace {

// The frame of a chart over a numeric x axis: title, legend, y grid with
// round ticks, x ticks, axes and labels. Returns the SVG so far; `x_of` and
// `y_of` map data to the plot.
struct Frame {
  double x0 = 70, x1 = kWidth - 20, y_top = 56, y_bottom = 276;
  double xlo = 0, xhi = 1, ylo = 0, yhi = 1;
  double x_of(double x) const { return x0 + (x - xlo) / (xhi - xlo) * (x1 - x0); }
  double y_of(double y) const { return y_bottom - (y - ylo) / (yhi - ylo) * (y_bottom - y_top); }
};

std::string OpenFrame(Frame& f, int height, std::string_view title, std::string_view x_label, std::string_view y_label,
                      const std::vector<std::string>& names) {
  f.y_bottom = height - 64;
  if (!(f.xhi > f.xlo)) f.xhi = f.xlo + 1;
  if (!(f.yhi > f.ylo)) {
    const double pad = std::max(std::fabs(f.ylo) * 0.05, 1e-9);
    f.ylo -= pad;
    f.yhi += pad;
  }
  const double ystep = NiceStep(f.yhi - f.ylo, 5);
  f.ylo = std::floor(f.ylo / ystep) * ystep;
  f.yhi = std::ceil(f.yhi / ystep) * ystep;
  int legend_rows = 1;
  const std::string legend = Legend(f.x0, 40, names, f.x1, &legend_rows);
  f.y_top += 16 * (legend_rows - 1);
  std::string s = SvgOpen(kWidth, height, title);
  s += Text(10, 20, title, "class=\"title\"");
  s += legend;
  for (double t = f.ylo; t <= f.yhi + ystep / 2; t += ystep) {
    const double y = f.y_of(t);
    s += "<line x1=\"" + Num(f.x0) + "\" x2=\"" + Num(f.x1) + "\" y1=\"" + Num(y) + "\" y2=\"" + Num(y) +
         "\" class=\"grid\"/>";
    s += Text(f.x0 - 6, y + 4, Tick(t), "class=\"small\" text-anchor=\"end\"");
  }
  const double xstep = NiceStep(f.xhi - f.xlo, 8);
  for (double t = std::ceil(f.xlo / xstep) * xstep; t <= f.xhi + xstep / 1e6; t += xstep) {
    s += Text(f.x_of(t), f.y_bottom + 14, Tick(t), "class=\"small\" text-anchor=\"middle\"");
  }
  s += "<line x1=\"" + Num(f.x0) + "\" x2=\"" + Num(f.x0) + "\" y1=\"" + Num(f.y_top) + "\" y2=\"" + Num(f.y_bottom) +
       "\" class=\"axis\"/>";
  s += "<line x1=\"" + Num(f.x0) + "\" x2=\"" + Num(f.x1) + "\" y1=\"" + Num(f.y_bottom) + "\" y2=\"" +
       Num(f.y_bottom) + "\" class=\"axis\"/>";
  s += Text((f.x0 + f.x1) / 2, height - 24, x_label, "text-anchor=\"middle\"");
  s += Text(16, (f.y_top + f.y_bottom) / 2, y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 16 " + Num((f.y_top + f.y_bottom) / 2) + ")\"");
  return s;
}

}  // namespace

void HtmlReport::AddLineChart(const LineChart& chart) {
  const int height = 340;
  Frame f;
  f.xlo = f.ylo = std::numeric_limits<double>::infinity();
  f.xhi = f.yhi = -f.xlo;
  std::vector<std::string> names;
  for (const LineSeries& ser : chart.series) {
    names.push_back(ser.name);
    for (size_t i = 0; i < ser.x.size() && i < ser.y.size(); ++i) {
      if (!std::isfinite(ser.x[i]) || !std::isfinite(ser.y[i])) continue;
      f.xlo = std::min(f.xlo, ser.x[i]);
      f.xhi = std::max(f.xhi, ser.x[i]);
      f.ylo = std::min(f.ylo, ser.y[i]);
      f.yhi = std::max(f.yhi, ser.y[i]);
    }
  }
  if (!std::isfinite(f.xlo)) f.xlo = 0, f.xhi = 1, f.ylo = 0, f.yhi = 1;  // no data: an empty frame
  if (chart.y_from_zero) f.ylo = std::min(f.ylo, 0.0);
  std::string s = OpenFrame(f, height, chart.title, chart.x_label, chart.y_label, names);
  for (size_t k = 0; k < chart.series.size(); ++k) {
    const LineSeries& ser = chart.series[k];
    std::string points;
    auto flush = [&] {
      if (!points.empty()) {
        s += "<polyline fill=\"none\" stroke=\"" + std::string(Color(k)) + "\" stroke-width=\"1.5\" points=\"" +
             points + "\"/>";
      }
      points.clear();
    };
    for (size_t i = 0; i < ser.x.size() && i < ser.y.size(); ++i) {
      if (!std::isfinite(ser.x[i]) || !std::isfinite(ser.y[i])) {
        flush();
        continue;
      }
      points += Num(f.x_of(ser.x[i])) + "," + Num(f.y_of(ser.y[i])) + " ";
      if (ser.points) {
        s += "<circle cx=\"" + Num(f.x_of(ser.x[i])) + "\" cy=\"" + Num(f.y_of(ser.y[i])) + "\" r=\"3\" fill=\"" +
             Color(k) + "\"><title>" + HtmlEscape(ser.name + " at " + Tick(ser.x[i]) + ": " + FormatFigure(ser.y[i])) +
             "</title></circle>";
      }
    }
    flush();
  }
  sections_.push_back(Figure(s + "</svg>"));
}

void HtmlReport::AddStackedBars(const StackedBars& chart) {
  const int height = 340;
  auto clean = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  Frame f;
  std::vector<double> totals(chart.x.size(), 0.0);
  for (const ChartSeries& seg : chart.segments) {
    for (size_t i = 0; i < totals.size() && i < seg.values.size(); ++i) totals[i] += clean(seg.values[i]);
  }
  f.ylo = 0;
  f.yhi = totals.empty() ? 1 : *std::max_element(totals.begin(), totals.end());
  // Bars are centred on their x: the axis reaches half a bar beyond each end.
  const double gap =
      chart.x.size() > 1 ? (chart.x.back() - chart.x.front()) / static_cast<double>(chart.x.size() - 1) : 1.0;
  f.xlo = chart.x.empty() ? 0 : chart.x.front() - gap / 2;
  f.xhi = chart.x.empty() ? 1 : chart.x.back() + gap / 2;
  std::vector<std::string> names;
  for (const ChartSeries& seg : chart.segments) names.push_back(seg.name);
  std::string s = OpenFrame(f, height, chart.title, chart.x_label, chart.y_label, names);
  const double bw = std::max(0.5, (f.x_of(f.xlo + gap) - f.x_of(f.xlo)) * 0.85);
  for (size_t i = 0; i < chart.x.size(); ++i) {
    double at = 0;
    for (size_t k = 0; k < chart.segments.size(); ++k) {
      const double v = i < chart.segments[k].values.size() ? clean(chart.segments[k].values[i]) : 0.0;
      if (v <= 0) continue;
      s += Rect(f.x_of(chart.x[i]) - bw / 2, f.y_of(at + v), bw, f.y_of(at) - f.y_of(at + v), Color(k),
                chart.x_label + " " + Tick(chart.x[i]) + ": " + chart.segments[k].name + " " + FormatFigure(v));
      at += v;
    }
  }
  sections_.push_back(Figure(s + "</svg>"));
}

void HtmlReport::AddPreformatted(std::string_view heading, std::string_view text) {
  sections_.push_back("<h2>" + HtmlEscape(heading) + "</h2>\n<pre>" + HtmlEscape(text) + "</pre>\n");
}

void HtmlReport::SetJson(std::string_view json_text) { json_ = json_text; }

std::string HtmlReport::Render() const {
  std::string page =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + HtmlEscape(title_) +
      "</title>\n<style>\n"
      "body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#222;"
      "max-width:820px}\n"
      "h1{font-size:22px}h2{font-size:17px;margin-top:28px}\n"
      "table{border-collapse:collapse;margin:12px 0}caption{text-align:left;font-weight:600;padding:4px 0}\n"
      "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;font-variant-numeric:tabular-nums}\n"
      "th{background:#f3f3f3}\n"
      "figure{margin:16px 0}svg{font-family:inherit;font-size:12px;background:#fff}\n"
      "svg .title{font-size:14px;font-weight:600}svg .small{font-size:11px}\n"
      "svg .grid{stroke:#e3e3e3;stroke-width:1}svg .axis{stroke:#555;stroke-width:1}\n"
      "svg .marker{stroke:#000;stroke-width:1.5;stroke-dasharray:5 3}\n"
      "pre{background:#f7f7f7;border:1px solid #ddd;padding:10px;overflow:auto;font-size:12px}\n"
      "</style>\n</head>\n<body>\n<h1>" +
      HtmlEscape(title_) + "</h1>\n";
  for (const std::string& s : sections_) page += s;
  if (!json_.empty()) page += "<h2>JSON</h2>\n<pre>" + HtmlEscape(json_) + "</pre>\n";
  return page + "</body>\n</html>\n";
}

Status HtmlReport::WriteFile(const std::string& path) const { return WriteFileAtomic(path, Render()); }

}  // namespace zinf::cli
