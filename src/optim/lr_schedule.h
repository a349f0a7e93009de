// LrSchedule: DeepSpeed's learning-rate schedules WarmupLR, WarmupDecayLR and
// WarmupCosineLR (deepspeed/runtime/lr_schedules.py), or a constant lr.
//
// DeepSpeed keeps `last_batch_iteration`, -1 when the scheduler is built, and
// steps it after every optimizer step that was applied (not after a step
// skipped for fp16 overflow). The k-th applied step (k = 0, 1, ...) therefore
// runs with LrAt(k - 1). With w = max(2, warmup_num_steps) and i the
// iteration:
//   warmup fraction  gamma(i) = log(i + 1) / log(w)  (log)   or  i / w  (linear)
//   WarmupLR:        i < 0: min_lr; i < w: min + (max - min) * gamma(i); else max
//   WarmupDecayLR:   as WarmupLR during warmup, then
//                    min + (max - min) * max(0, (total - i) / max(1, total - w))
//   WarmupCosineLR:  i < 0: 0; i < w: base * (wmin + (1 - wmin) * gamma(i)); then
//                    base * max(0, cmin + (1 - cmin) * (1 + cos(pi * (i - w + 1) / (total - w))) / 2)
//                    with wmin = warmup_min_ratio, cmin = cos_min_ratio, base
//                    the optimizer's lr. Where DeepSpeed divides by zero
//                    (total == w) the denominator is taken as 1.
//   none:            base lr at every step.
//
// Thread-safety: a value (thread-compatible); LrAt is const and pure.
#pragma once

#include <cstdint>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::optim {

class LrSchedule {
 public:
  // `base_lr` is the optimizer's lr (WarmupCosineLR scales it; kNone returns
  // it). Errors: negative or non-finite lrs and ratios, warmup_num_steps < 0,
  // total_num_steps < 1 for WarmupDecayLR and WarmupCosineLR. A
  // total_num_steps below the warmup is allowed, with a warning, as in
  // DeepSpeed.
  static StatusOr<LrSchedule> Create(const SchedulerConfig& config, double base_lr);

  // The learning rate when DeepSpeed's last_batch_iteration is `iteration`
  // (>= -1).
  double LrAt(int64_t iteration) const;

  // The stateful view: lr() for the next optimizer step; Step() after each
  // applied step. last_batch_iteration() is what a checkpoint keeps.
  double lr() const { return LrAt(last_batch_iteration_); }
  void Step() { ++last_batch_iteration_; }
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  void set_last_batch_iteration(int64_t iteration) { last_batch_iteration_ = iteration; }

  const SchedulerConfig& config() const { return config_; }

 private:
  LrSchedule(const SchedulerConfig& config, double base_lr);
  double WarmupGamma(int64_t iteration) const;

  SchedulerConfig config_;
  double base_lr_;
  int64_t warmup_steps_;  // max(2, warmup_num_steps)
  double inverse_log_warmup_;
  int64_t last_batch_iteration_ = -1;
};

}  // namespace zinf::optim
