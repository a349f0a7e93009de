#include "cli/monitors.h"

#include "cli/metrics_jsonl.h"

namespace zinf::cli {

StatusOr<RunMonitors> RunMonitors::Create(const MonitorOptions& options) {
  RunMonitors m;
  if (!options.metrics_path.empty()) {
    auto jsonl = std::make_unique<MetricsJsonl>();
    if (Status s = jsonl->Open(options.metrics_path); !s.ok()) return s.WithContext("--metrics");
    m.destinations_.push_back("metrics (JSON lines): " + options.metrics_path);
    m.owned_.push_back(std::move(jsonl));
  }
  return m;
}

std::vector<RunMonitor*> RunMonitors::list() const {
  std::vector<RunMonitor*> out;
  for (const auto& m : owned_) out.push_back(m.get());
  return out;
}

}  // namespace zinf::cli
