// The monitors one `zinf train` run asked for: --metrics FILE.jsonl,
// --report FILE.html, and the
// DeepSpeed config's csv_monitor and tensorboard sections (written under
// output_path/job_name). Created on rank 0 only; other ranks get none.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/run_monitor.h"
#include "cli/run_report.h"
#include "zinf/config.h"

namespace zinf::cli {

struct MonitorOptions {
  std::string metrics_path;  // --metrics; empty: none
  RunReportOptions report;   // --report; path empty: none
  const Config* config = nullptr;
  // A resumed run (--resume) goes on in the files an earlier run wrote: the
  // step and the samples (SamplesAfter) of the checkpoint. A fresh run
  // (resumed_step < 0) truncates them.
  int64_t resumed_step = -1;
  int64_t resumed_samples = 0;
};

class RunMonitors {
 public:
  // Opens every file the options and the config ask for (to go on after the
  // checkpoint's step, for a resumed run). Errors name the file (or the flag
  // / config key it came from).
  static StatusOr<RunMonitors> Create(const MonitorOptions& options);

  // For TrainRun::monitors; valid while this object lives.
  std::vector<RunMonitor*> list() const;
  // What was opened, one line each ("metrics: run.jsonl"), for the log.
  const std::vector<std::string>& destinations() const { return destinations_; }

 private:
  std::vector<std::unique_ptr<RunMonitor>> owned_;
  std::vector<std::string> destinations_;
};

}  // namespace zinf::cli
