#include "cli/monitors.h"

#include "cli/csv_monitor.h"
#include "cli/metrics_jsonl.h"
#include "cli/tensorboard_monitor.h"
#include "core/fs.h"

namespace zinf::cli {

StatusOr<RunMonitors> RunMonitors::Create(const MonitorOptions& options) {
  RunMonitors m;
  if (!options.metrics_path.empty()) {
    auto jsonl = std::make_unique<MetricsJsonl>();
    if (Status s = jsonl->Open(options.metrics_path); !s.ok()) return s.WithContext("--metrics");
    m.destinations_.push_back("metrics (JSON lines): " + options.metrics_path);
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
    if (Status s = csv->Open(dir); !s.ok()) return s.WithContext("csv_monitor (output_path/job_name)");
    m.destinations_.push_back("csv_monitor: " + dir + "/*.csv");
    m.owned_.push_back(std::move(csv));
  }
  if (options.config->tensorboard.enabled) {
    const std::string dir = dir_of(options.config->tensorboard);
    auto tb = std::make_unique<TensorBoardMonitor>();
    if (Status s = tb->Open(dir); !s.ok()) return s.WithContext("tensorboard (output_path/job_name)");
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
