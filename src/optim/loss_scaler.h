// LossScaler: fp16 loss scaling with DeepSpeed's semantics (DynamicLossScaler
// and the static LossScaler of deepspeed/runtime/fp16/loss_scaler.py).
//
// Per step the engine multiplies the loss by scale(), checks the gradients
// for Inf/NaN (GradNormAccumulator::has_inf_or_nan), skips the optimizer step
// (and the LR schedule's step) when there was one, and calls Update(overflow).
//
// Dynamic scaling (fp16 enabled, loss_scale 0), starting at
// 2^initial_scale_power:
//   overflow:  if hysteresis is 1 or the remaining hysteresis is 1, the scale
//              halves (not below min_loss_scale; an overflow at
//              min_loss_scale is an error, as DeepSpeed raises); otherwise the
//              remaining hysteresis drops by one.
//   no overflow: with consecutive_hysteresis the remaining hysteresis is
//              refilled; after loss_scale_window steps without overflow
//              (counted from the last one) the scale doubles, and the
//              hysteresis is refilled.
// Static scaling (fp16 with loss_scale > 0): the scale never changes;
// overflowing steps are still skipped. Without fp16 the scale is 1.
//
// Thread-safety: a value (thread-compatible).
#pragma once

#include <cstdint>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::optim {

class LossScaler {
 public:
  // What a checkpoint keeps (DeepSpeed's cur_scale, cur_iter,
  // last_overflow_iter, cur_hysteresis).
  struct State {
    double scale = 1.0;
    int64_t iteration = 0;
    int64_t last_overflow_iteration = -1;
    int hysteresis_left = 1;
  };

  // Errors: initial_scale_power outside [0, 127], loss_scale_window < 1,
  // hysteresis < 1, min_loss_scale not > 0, loss_scale < 0 or not finite.
  static StatusOr<LossScaler> Create(const Fp16Config& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  const State& state() const { return state_; }
  // For resuming from a checkpoint.
  void Restore(const State& state) { state_ = state; }

  // Records one step's outcome. Errors (kAborted; state unchanged): an
  // overflow when the scale is already at min_loss_scale and would have to
  // go lower; the run cannot make progress.
  Status Update(bool overflow);

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  double scale_factor_ = 2.0;
  int64_t scale_window_ = 1000;
  double min_scale_ = 1.0;
  int delayed_shift_ = 1;  // DeepSpeed's name for the configured hysteresis
  bool consecutive_hysteresis_ = false;
  State state_;
};

}  // namespace zinf::optim
