// RunReport: `zinf train --report FILE.html`, a picture of the run as one
// self-contained page (inline SVG, no scripts; cli/html_report.h): the
// training and evaluation loss per step, the learning rate, the stacked time
// split of each step, the bytes each tier moved per step, and the run's
// facts and config. The page is rewritten (a new file, fsync, rename) after
// each evaluation and at the end, so a browser reloading it watches a long
// run without ever reading half a page.
//
// A run of many steps is drawn in at most kMaxBars bars and kMaxPoints line
// points: consecutive steps are averaged into one (the page says so).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/run_monitor.h"

namespace zinf::cli {

struct RunReportOptions {
  std::string path;
  std::string title;                                       // "zinf train: model tiny, configs/x.json"
  std::vector<std::pair<std::string, std::string>> facts;  // shown as a table (model, device, batch, ...)
  std::string config_json;                                 // the resolved config, shown verbatim
};

class RunReport : public RunMonitor {
 public:
  static constexpr size_t kMaxPoints = 1000;
  static constexpr size_t kMaxBars = 200;

  explicit RunReport(RunReportOptions options);
  Status OnStep(const StepMetrics& m) override;
  Status OnEval(int64_t step, int64_t samples, double eval_loss) override;
  Status OnEnd() override;
  // Writes the page as it stands (a run in progress).
  Status WriteNow() const;

  // The page as it stands (`finished`: the run is over).
  std::string Render(bool finished) const;

 private:
  RunReportOptions options_;
  // Per step, compact: a long run keeps a few dozen bytes a step.
  std::vector<double> step_, loss_, lr_;
  std::vector<double> compute_, nvme_, pcie_, comm_, optimizer_, other_;  // seconds
  std::vector<double> nvme_read_, nvme_write_, optimizer_nvme_, gradient_nvme_, h2d_, d2h_, gathered_,
      reduced_;  // bytes
  std::vector<double> tokens_per_second_;
  std::vector<double> eval_step_, eval_loss_;
};

}  // namespace zinf::cli
