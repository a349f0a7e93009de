// CsvMonitor: DeepSpeed's `csv_monitor` section, laid out as DeepSpeed lays
// it out: one CSV file per tag in output_path/job_name, named after the tag
// with '/' replaced by '_' (Train_Samples_train_loss.csv), a header row
// "step,<the tag's last part>" and then a row "samples,value" per optimizer
// step (per evaluation for Eval_Samples_eval_loss.csv). The tags are
// StepScalars' (run_monitor.h); values are written so they read back to the
// same double ("nan"/"inf" when not finite).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/run_monitor.h"

namespace zinf::cli {

class CsvMonitor : public RunMonitor {
 public:
  // Creates `dir` (and its parents). Files are created (truncated) with their
  // header at the first value.
  Status Open(const std::string& dir);
  // Open for a run resumed when `samples` sequences had been trained on:
  // an existing file keeps its header and its rows up to `samples` (an
  // evaluation's rows before it: the resumed run evaluates again there), and
  // the run's rows follow them; rows after the first one dropped go too.
  Status Continue(const std::string& dir, int64_t samples);
  Status OnStep(const StepMetrics& m) override;
  Status OnEval(int64_t step, int64_t samples, double eval_loss) override;

  // The file name of `tag` ("Train/Samples/lr" -> "Train_Samples_lr.csv").
  static std::string FileName(const std::string& tag);

 private:
  Status Write(const std::string& tag, int64_t samples, double value);

  std::string dir_;
  int64_t resumed_samples_ = -1;                                            // < 0: a fresh run (files truncated)
  std::vector<std::pair<std::string, std::unique_ptr<AppendFile>>> files_;  // by tag, in first-use order
};

}  // namespace zinf::cli
