// The training loop `zinf train` and `zinf demo` share: steps, progress
// lines, evaluation, checkpoints, export, and a summary of where the time
// went.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/run_monitor.h"
#include "model/hf_checkpoint.h"
#include "model/trainer.h"
#include "zinf/status.h"

namespace zinf::cli {

struct TrainRun {
  int64_t steps = 100;           // optimizer steps to reach (counting resumed ones)
  int64_t steps_per_print = 10;  // a progress line every this many steps (and the last)
  std::string save_dir;          // empty: no checkpoints
  int64_t save_every = 0;        // 0: only after the last step (when save_dir is set)
  int keep_checkpoints = 0;      // > 0: remove all but the newest this many after each save
  int64_t eval_every = 0;        // 0: evaluate before the first and after the last step only
  int eval_batches = 8;
  // The final weights: a path ending in .safetensors is one file under
  // zinf's names; any other path a Hugging Face model folder (hf_export.h)
  // under export_source's names, or a GPT2LMHeadModel without a source.
  // Empty: none.
  std::string export_path;
  std::string export_dtype = "BF16";
  std::shared_ptr<const model::HfCheckpoint> export_source;
  FILE* progress = stderr;  // null: silent (ranks other than 0)
  // A line per step with its loss to 17 significant digits ("step N  exact
  // loss L"), which round-trips the double: for bit-for-bit comparisons of runs.
  bool exact_losses = false;
  // Told of every step and evaluation, in order (not owned; empty on ranks
  // other than 0).
  std::vector<RunMonitor*> monitors;
};

struct TrainSummary {
  int64_t first_step = 0;                      // steps already done when the run started (resume)
  int64_t steps = 0;                           // steps after the run
  double first_loss = 0.0;                     // training loss of the first step of this run
  double last_loss = 0.0;                      // mean training loss of the last steps_per_print steps
  double eval_before = 0.0, eval_after = 0.0;  // held-out loss (0 when there are too few tokens)
  bool evaluated = false;
  double seconds = 0.0;            // wall time of the steps
  double tokens_per_second = 0.0;  // median over steps, the first step excluded when there are several
  // Shares of step time (sum of steps): in kernels, and the engine's waits.
  double compute_seconds = 0.0, nvme_wait_seconds = 0.0, fetch_wait_seconds = 0.0, comm_seconds = 0.0,
         optimizer_seconds = 0.0;
  EngineCounters moved;        // the engine's counters over the run
  model::KernelTimes kernels;  // with wall_clock_breakdown: the device time of the run's kernels
  std::string last_checkpoint;
};

// Sequences (all ranks) trained on after the trainer's steps so far: the
// monitors' x axis.
int64_t SamplesAfter(const model::Trainer& trainer);

// A monitor whose call fails (a full disk, an I/O error) is named in one
// warning on run.progress (stderr when that is null) and called no more; the
// run goes on.
StatusOr<TrainSummary> RunTraining(model::Trainer& trainer, const TrainRun& run);

// One line: "12.3 s: compute 61% nvme 12% pcie 3% comm 0% optimizer 20% (device idle 39%)".
std::string FormatTimeShares(const TrainSummary& s);

// With wall_clock_breakdown, one line: the kernels' device time as a share of
// `seconds` of wall time, and the `top` Ops methods by their share of it:
// "0.172 s on the device, 42% busy: MatmulBackward16 31% (88 calls), ...".
std::string FormatKernelTimes(const model::KernelTimes& k, double seconds, int top);

}  // namespace zinf::cli
