// HtmlReport: a result as one self-contained HTML page (the benchmarks'
// reports, `zinf train --report`).
//
// The page carries everything it shows: inline CSS, charts drawn as inline
// SVG, no scripts and nothing fetched from the network (no fonts, no
// stylesheets), so it can be mailed, attached to an issue or opened from a
// CI artifact years later and look the same. A page is a title, then the
// sections in the order they were added (paragraphs, tables of key figures,
// charts), then the benchmark's JSON verbatim in a <pre>.
//
// Every piece of text a caller hands in (titles, labels, cells, the JSON) is
// escaped for HTML, attribute values included; callers pass plain text.
// Numbers that are not finite are drawn as gaps ("n/a" cells, no bar).
//
// Thread-safety: thread-compatible; one thread builds a report.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::cli {

// `text` with & < > " ' replaced by entities: safe between tags and inside
// single- or double-quoted attribute values.
std::string HtmlEscape(std::string_view text);

// A number as a chart or table shows it: 4 significant digits, no
// exponent for ordinary magnitudes ("0.1234", "12.35", "1.235e+07"); "n/a"
// when not finite.
std::string FormatFigure(double value);

struct ChartSeries {
  std::string name;
  std::vector<double> values;  // one per category; NaN: no value
};

// Grouped bars (or lines: one polyline per series) over named categories.
struct BarChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<std::string> categories;
  std::vector<ChartSeries> series;
  bool lines = false;
};

// A grid of values coloured from the smallest (light) to the largest
// (dark), each cell labelled with its value. values[row][column]; NaN:
// not measured (drawn grey, "n/a").
struct Heatmap {
  std::string title;
  std::string x_label;  // what the columns are
  std::string y_label;  // what the rows are
  std::string value_label;
  std::vector<std::string> columns;
  std::vector<std::string> rows;
  std::vector<std::vector<double>> values;
};

// Lines over a numeric x axis (steps): each series its own points, drawn
// in order; with `points`, a dot at each (for sparse series: evaluations).
// The y axis spans the data (from zero only with y_from_zero). Non-finite
// values are gaps.
struct LineSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  bool points = false;
};
struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<LineSeries> series;
  bool y_from_zero = false;
};

// One vertical bar per x (a step), split into stacked segments, one series
// per segment (values[i] for x[i]; negative or NaN counts as 0).
struct StackedBars {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<double> x;
  std::vector<ChartSeries> segments;
};

// One horizontal bar per row (a step), split into consecutive segments
// (compute, waits, ...) whose lengths are in `unit`; optional vertical
// markers (a bound, a median) across all rows.
struct Timeline {
  struct Row {
    std::string label;
    std::vector<double> segments;  // one per segment name; negative or NaN counts as 0
  };
  struct Marker {
    std::string name;
    double value = 0;
  };
  std::string title;
  std::string unit;  // "s"
  std::vector<std::string> segment_names;
  std::vector<Row> rows;
  std::vector<Marker> markers;
};

class HtmlReport {
 public:
  explicit HtmlReport(std::string title);

  void AddParagraph(std::string_view text);
  // A table: a header row and rows of cells (plain text).
  void AddTable(std::string_view caption, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);
  void AddBarChart(const BarChart& chart);
  void AddHeatmap(const Heatmap& map);
  void AddTimeline(const Timeline& timeline);
  void AddLineChart(const LineChart& chart);
  void AddStackedBars(const StackedBars& chart);
  // A heading and preformatted text (a config file).
  void AddPreformatted(std::string_view heading, std::string_view text);
  // The benchmark's JSON (any text), shown verbatim at the end of the page.
  void SetJson(std::string_view json_text);

  // The whole page.
  std::string Render() const;
  // Render() written crash-safely (temp file, fsync, rename) to `path`.
  Status WriteFile(const std::string& path) const;

 private:
  std::string title_;
  std::vector<std::string> sections_;  // rendered HTML fragments
  std::string json_;
};

}  // namespace zinf::cli
