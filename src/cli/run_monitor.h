// What a training run reports, step by step, to the files a user watches:
// --metrics (JSON lines), DeepSpeed's csv_monitor and tensorboard sections,
// --report (an HTML page). RunTraining (train_loop.h) hands every optimizer
// step and every evaluation to each RunMonitor in order; monitors write on
// rank 0 only (the losses are already means over ranks).
//
// The step's time parts come from the trainer's StepReport: total is the
// step's wall time, compute the time in the model's kernels, and the rest are
// the waits the engine counts on the driving thread (EngineCounters): nvme for
// parameter reads, pcie for a block's copies and gather in Acquire, comm in
// all-gather and reduce-scatter calls, optimizer in the optimizer step and
// waiting for its update. They are measured separately and may overlap; what
// is left of total is the model's host-side work and bookkeeping.
//
// Thread-safety: one thread (the training loop's) calls a monitor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/trainer.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::cli {

// One optimizer step as the monitors see it. Times in seconds.
struct StepMetrics {
  int64_t step = 0;     // optimizer steps taken, this one included
  int64_t samples = 0;  // sequences trained on so far (all ranks): DeepSpeed's x axis
  double loss = 0.0;    // the step's training loss, computed before its update
  double lr = 0.0;      // the learning rate the step's update used
  double grad_norm = 0.0;
  double loss_scale = 1.0;
  bool applied = true;  // false: an fp16 overflow skipped the update
  int64_t tokens = 0;   // tokens in the step, all ranks
  double tokens_per_second = 0.0;
  double total_seconds = 0.0, compute_seconds = 0.0, nvme_seconds = 0.0, pcie_seconds = 0.0, comm_seconds = 0.0,
         optimizer_seconds = 0.0;
  EngineCounters engine;       // what the step moved (bytes per tier)
  model::KernelTimes kernels;  // with wall_clock_breakdown: device time by Ops method (else empty)
};

// `report` as the monitors see it; `samples` is the running count after it.
StepMetrics MakeStepMetrics(const model::StepReport& report, int64_t samples);

// The scalars of one step, tag and value, in the order the csv_monitor and
// tensorboard monitors write them. Tags follow DeepSpeed's monitor where it
// has them (Train/Samples/train_loss, Train/Samples/lr,
// Train/Samples/loss_scale); zinf adds, under the same prefix, grad_norm,
// tokens_per_second, samples, step (the optimizer step) and the step's time
// parts in milliseconds: elapsed_time_ms_total, _compute, _nvme_wait,
// _pcie_wait, _comm, _optimizer (named apart from DeepSpeed's forward /
// backward / step timers, which measure other things).
std::vector<std::pair<std::string, double>> StepScalars(const StepMetrics& m);
// The evaluation's tag.
inline constexpr char kEvalLossTag[] = "Eval/Samples/eval_loss";

class RunMonitor {
 public:
  virtual ~RunMonitor() = default;
  // After each optimizer step, in step order. An error (a full disk, a file
  // that cannot be written) names the file; RunTraining warns of it once and
  // calls that monitor no more (a metrics file is not worth a training run).
  virtual Status OnStep(const StepMetrics& m) = 0;
  // After each evaluation: the held-out loss after `step` steps, `samples`
  // sequences.
  virtual Status OnEval(int64_t step, int64_t samples, double eval_loss) = 0;
  // Once, after the last step and evaluation.
  virtual Status OnEnd() { return Status::Ok(); }
};

// A file a monitor appends to: each Append reaches the kernel at once
// (written and flushed), so the file can be watched while the run goes on.
// Errors name the file and the offset of the write. A write that fails may
// leave part of its bytes in the file (a last line cut short).
class AppendFile {
 public:
  AppendFile() = default;
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Creates `path`, truncating an existing file; with `exclusive`, an
  // existing file is an error (EEXIST) instead.
  Status Open(const std::string& path, bool exclusive = false);
  // Opens `path` (created if missing) to go on after the lines a resumed run
  // keeps: the file is cut before its first line for which `keep` is false or
  // that lacks its newline (a write cut short), and appends follow the lines
  // before it. Lines are in the order the earlier runs wrote them, so what
  // comes after the first line dropped belongs to steps the resumed run
  // writes again. `keep` gets a line without its newline.
  Status Continue(const std::string& path, const std::function<bool(std::string_view line)>& keep);
  Status Append(std::string_view bytes);
  const std::string& path() const { return path_; }
  bool is_open() const { return file_ != nullptr; }
  // Bytes in the file (after Open or Continue and the appends since).
  int64_t size() const { return offset_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  int64_t offset_ = 0;
};

}  // namespace zinf::cli
