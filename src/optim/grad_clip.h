// Global-norm gradient clipping, DeepSpeed style, over sub-groups.
//
// The norm has to be known before any sub-group is updated, so it is a pass of
// its own: for each sub-group (and each rank) add SumSquares() of its
// gradient into a GradNormAccumulator; all-reduce sum_squares() across ranks
// when there are several; then GradScaleFactor() gives the one multiplier
// that Update() applies to every sub-group's gradient while it reads it.
// The same pass tells the fp16 loss scaler whether any gradient is Inf or NaN
// (a non-finite sum), so overflow detection costs no extra read.
//
// Thread-safety: GradNormAccumulator is a value (thread-compatible);
// GradScaleFactor is pure.
#pragma once

namespace zinf::optim {

class GradNormAccumulator {
 public:
  // Adds one sub-group's (or one rank's) sum of squares.
  void Add(double sum_squares) { sum_squares_ += sum_squares; }
  void Reset() { sum_squares_ = 0.0; }

  double sum_squares() const { return sum_squares_; }
  // True when some gradient element was Inf or NaN: the fp16 overflow signal.
  bool has_inf_or_nan() const;
  // The L2 norm (Inf or NaN after an overflow).
  double norm() const;

 private:
  double sum_squares_ = 0.0;
};

// The factor that multiplies the loss-scaled gradients before the update:
// 1 / combined_scale with DeepSpeed's unscale_and_clip_grads rule
//   clip = (total_norm / loss_scale + 1e-6) / max_norm
//   combined_scale = loss_scale * max(clip, 1)   (clip only when max_norm > 0)
// total_norm: the L2 norm of the loss-scaled gradients over all ranks and
// sub-groups; loss_scale > 0 (1 without fp16); max_norm: gradient_clipping,
// 0 for no clipping. A non-finite total_norm (the step would be skipped)
// gives 0.
double GradScaleFactor(double total_norm, double loss_scale, double max_norm);

}  // namespace zinf::optim
