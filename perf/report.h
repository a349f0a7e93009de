// The benchmarks' HTML pages: the page writer is cli's (cli/html_report.h,
// shared with `zinf train --report`); its names are used here as perf's.
#pragma once

#include <string>

#include "cli/html_report.h"
#include "zinf/status.h"

namespace zinf::perf {

using cli::BarChart;
using cli::ChartSeries;
using cli::FormatFigure;
using cli::Heatmap;
using cli::HtmlEscape;
using cli::HtmlReport;
using cli::Timeline;

// What every benchmark does with its result: the JSON on stdout (as
// before), and also to `json_path` and, with the JSON embedded, as the HTML
// page `report` to `html_path` when those are non-empty.
Status EmitResult(const std::string& json_text, const std::string& json_path, const std::string& html_path,
                  HtmlReport& report);

}  // namespace zinf::perf
