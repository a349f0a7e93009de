#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/log.h"

namespace zinf::optim {

StatusOr<LossScaler> LossScaler::Create(const Fp16Config& config) {
  LossScaler s;
  if (!config.enabled) return s;  // bf16 / fp32: scale 1, nothing to adjust
  if (!std::isfinite(config.loss_scale) || config.loss_scale < 0.0) {
    return Status::InvalidArgument("fp16.loss_scale: must be >= 0 (0: dynamic), got " +
                                   std::to_string(config.loss_scale));
  }
  if (config.loss_scale > 0.0) {
    s.state_.scale = config.loss_scale;
    return s;
  }
  if (config.initial_scale_power < 0 || config.initial_scale_power > 127) {
    return Status::InvalidArgument("fp16.initial_scale_power: must be in [0, 127], got " +
                                   std::to_string(config.initial_scale_power));
  }
  if (config.loss_scale_window < 1) {
    return Status::InvalidArgument("fp16.loss_scale_window: must be >= 1, got " +
                                   std::to_string(config.loss_scale_window));
  }
  if (config.hysteresis < 1) {
    return Status::InvalidArgument("fp16.hysteresis: must be >= 1, got " + std::to_string(config.hysteresis));
  }
  if (!(config.min_loss_scale > 0.0) || !std::isfinite(config.min_loss_scale)) {
    return Status::InvalidArgument("fp16.min_loss_scale: must be > 0, got " + std::to_string(config.min_loss_scale));
  }
  s.dynamic_ = true;
  s.scale_window_ = config.loss_scale_window;
  s.min_scale_ = config.min_loss_scale;
  s.delayed_shift_ = config.hysteresis;
  s.consecutive_hysteresis_ = config.consecutive_hysteresis;
  s.state_.scale = std::ldexp(1.0, config.initial_scale_power);
  s.state_.hysteresis_left = config.hysteresis;
  return s;
}

Status LossScaler::Update(bool overflow) {
  if (!dynamic_) return Status::Ok();
  State& st = state_;
  if (overflow) {
    if (delayed_shift_ == 1 || st.hysteresis_left == 1) {
      if (st.scale == min_scale_) {
        return Status::Aborted("fp16 loss scale: gradient overflow with the scale already at min_loss_scale " +
                               std::to_string(min_scale_) + "; cannot decrease it further");
      }
      const double next = std::max(st.scale / scale_factor_, min_scale_);
      Log("optim").info("fp16 overflow: skipping step; loss scale {} -> {}", st.scale, next);
      st.scale = next;
    } else {
      Log("optim").info("fp16 overflow: skipping step; loss scale {} kept, hysteresis {} -> {}", st.scale,
                        st.hysteresis_left, st.hysteresis_left - 1);
      --st.hysteresis_left;
    }
    st.last_overflow_iteration = st.iteration;
  } else {
    if (consecutive_hysteresis_) st.hysteresis_left = delayed_shift_;
    if ((st.iteration - st.last_overflow_iteration) % scale_window_ == 0) {
      if (!consecutive_hysteresis_) st.hysteresis_left = delayed_shift_;
      st.scale *= scale_factor_;
    }
  }
  ++st.iteration;
  return Status::Ok();
}

}  // namespace zinf::optim
