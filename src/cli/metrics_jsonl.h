// MetricsJsonl: `zinf train --metrics FILE.jsonl`, one JSON object per line.
//
// A line per optimizer step, in step order:
//   {"step": 3, "loss": 5.4123..., "lr": 0.0003, "grad_norm": 1.25, "loss_scale": 1,
//    "tokens": 2048, "samples": 24,
//    "time": {"total": 0.21, "compute": 0.15, "nvme": 0.01, "pcie": 0.0, "comm": 0.0, "optimizer": 0.02}}
// and, with wall_clock_breakdown, the device time of the model's kernels by
// Ops method (model/timed_ops.h) and their sum:
//    "kernels": {"busy": 0.12, "ops": {"MatmulForward16": {"seconds": 0.04, "calls": 48}, ...}}
// and a line per evaluation: {"step": 3, "eval_loss": 5.1..., "samples": 24}
// (never "loss").
// Numbers are written so that they read back to the same double (loss is the
// step's loss at full precision); a value that is not finite (the grad norm
// of an fp16 overflow) is null. Times in seconds (run_monitor.h says what
// each part is). Lines reach the file as they are written.
#pragma once

#include <string>

#include "cli/run_monitor.h"

namespace zinf::cli {

class MetricsJsonl : public RunMonitor {
 public:
  // Creates (truncates) `path`.
  Status Open(const std::string& path);
  // Opens `path` for a run resumed after `step` steps: the lines of steps up
  // to `step` stay and the run's lines follow them, so the file has each step
  // once, in order. Dropped: step lines after `step`, evaluation lines at or
  // after it (the resumed run evaluates again at `step`), and everything
  // after the first of those or after a line that does not parse (a write
  // cut short). A missing file is created.
  Status Continue(const std::string& path, int64_t step);
  Status OnStep(const StepMetrics& m) override;
  Status OnEval(int64_t step, int64_t samples, double eval_loss) override;

  // The line (without its newline) OnStep writes.
  static std::string StepLine(const StepMetrics& m);

 private:
  AppendFile file_;
};

}  // namespace zinf::cli
