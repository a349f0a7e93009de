#include "optim/grad_clip.h"

#include <cmath>

#include "core/check.h"

namespace zinf::optim {

bool GradNormAccumulator::has_inf_or_nan() const { return !std::isfinite(sum_squares_); }

double GradNormAccumulator::norm() const { return std::sqrt(sum_squares_); }

double GradScaleFactor(double total_norm, double loss_scale, double max_norm) {
  ZINF_CHECK(loss_scale > 0.0);
  if (!std::isfinite(total_norm)) return 0.0;
  double combined = loss_scale;
  if (max_norm > 0.0) {
    const double clip = (total_norm / loss_scale + 1e-6) / max_norm;
    if (clip > 1.0) combined = clip * loss_scale;
  }
  return 1.0 / combined;
}

}  // namespace zinf::optim
