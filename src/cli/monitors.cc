#include "cli/monitors.h"

#include <string>

#include "cli/csv_monitor.h"
#include "cli/metrics_jsonl.h"
#include "cli/tensorboard_monitor.h"
#include "core/fs.h"

namespace zinf::cli {

StatusOr<RunMonitors> RunMonitors::Create(const MonitorOptions& options) {
  RunMonitors m;
  const bool resumed = options.resumed_step >= 0;
  if (!options.metrics_path.empty()) {
    auto jsonl = std::make_unique<MetricsJsonl>();
    const Status s =
        resumed ? jsonl->Continue(options.metrics_path, options.resumed_step) : jsonl->Open(options.metrics_path);
    if (!s.ok()) return s.WithContext("--metrics");
    m.destinations_.push_back("metrics (JSON lines): " + options.metrics_path +
                              (resumed ? " (continued after step " + std::to_string(options.resumed_step) + ")" : ""));
    m.owned_.push_back(std::move(jsonl));
  }
  if (!options.report.path.empty()) {
    auto report = std::make_unique<RunReport>(options.report);
    // Written once now: a path that cannot be written fails before training.
    if (Status s = report->WriteNow(); !s.ok()) return s.WithContext("--report");
    m.destinations_.push_back("report (HTML, rewritten at each evaluation and at the end): " + options.report.path);
    m.owned_.push_back(std::move(report));
  }
  if (options.config == nullptr) return m;
  auto dir_of = [](const MonitorConfig& c) {
    return c.output_path.empty() ? c.job_name : JoinPath(c.output_path, c.job_name);
  };
  if (options.config->csv_monitor.enabled) {
    const std::string dir = dir_of(options.config->csv_monitor);
    auto csv = std::make_unique<CsvMonitor>();
    const Status s = resumed ? csv->Continue(dir, options.resumed_samples) : csv->Open(dir);
    if (!s.ok()) return s.WithContext("csv_monitor (output_path/job_name)");
    m.destinations_.push_back(
        "csv_monitor: " + dir + "/*.csv" +
        (resumed ? " (continued after " + std::to_string(options.resumed_samples) + " samples)" : ""));
    m.owned_.push_back(std::move(csv));
  }
  if (options.config->tensorboard.enabled) {
    const std::string dir = dir_of(options.config->tensorboard);
    auto tb = std::make_unique<TensorBoardMonitor>();
    const Status s = resumed ? tb->Continue(dir, options.resumed_samples) : tb->Open(dir);
    if (!s.ok()) return s.WithContext("tensorboard (output_path/job_name)");
    m.destinations_.push_back("tensorboard: " + tb->path());
    m.owned_.push_back(std::move(tb));
  }
  return m;
}

std::vector<RunMonitor*> RunMonitors::list() const {
  std::vector<RunMonitor*> out;
  for (const auto& m : owned_) out.push_back(m.get());
  return out;
}

}  // namespace zinf::cli
