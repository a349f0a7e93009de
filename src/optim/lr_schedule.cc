#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/log.h"

namespace zinf::optim {
namespace {

Status CheckNonNegative(double x, const char* key) {
  if (!std::isfinite(x) || x < 0.0) {
    return Status::InvalidArgument(std::string("scheduler.params.") + key + ": must be finite and >= 0, got " +
                                   std::to_string(x));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<LrSchedule> LrSchedule::Create(const SchedulerConfig& config, double base_lr) {
  if (!std::isfinite(base_lr) || base_lr < 0.0) {
    return Status::InvalidArgument("optimizer.params.lr: must be finite and >= 0, got " + std::to_string(base_lr));
  }
  if (config.type == SchedulerType::kNone) return LrSchedule(config, base_lr);
  if (config.warmup_num_steps < 0) {
    return Status::InvalidArgument("scheduler.params.warmup_num_steps: must be >= 0, got " +
                                   std::to_string(config.warmup_num_steps));
  }
  ZINF_RETURN_IF_ERROR(CheckNonNegative(config.warmup_min_lr, "warmup_min_lr"));
  ZINF_RETURN_IF_ERROR(CheckNonNegative(config.warmup_max_lr, "warmup_max_lr"));
  ZINF_RETURN_IF_ERROR(CheckNonNegative(config.warmup_min_ratio, "warmup_min_ratio"));
  ZINF_RETURN_IF_ERROR(CheckNonNegative(config.cos_min_ratio, "cos_min_ratio"));
  if (config.type == SchedulerType::kWarmupDecayLR || config.type == SchedulerType::kWarmupCosineLR) {
    if (config.total_num_steps < 1) {
      return Status::InvalidArgument("scheduler.params.total_num_steps: required (>= 1) for " +
                                     std::string(SchedulerTypeName(config.type)) + ", got " +
                                     std::to_string(config.total_num_steps));
    }
    if (config.total_num_steps < std::max<int64_t>(2, config.warmup_num_steps)) {
      Log("optim").warn("scheduler: total_num_steps {} is less than warmup_num_steps {}", config.total_num_steps,
                        config.warmup_num_steps);
    }
  }
  return LrSchedule(config, base_lr);
}

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr)
    : config_(config),
      base_lr_(base_lr),
      warmup_steps_(std::max<int64_t>(2, config.warmup_num_steps)),
      inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_steps_))) {}

double LrSchedule::WarmupGamma(int64_t iteration) const {
  const double i = static_cast<double>(iteration);
  if (config_.warmup_type == WarmupType::kLinear) return i / static_cast<double>(warmup_steps_);
  return inverse_log_warmup_ * std::log(i + 1.0);
}

double LrSchedule::LrAt(int64_t iteration) const {
  const SchedulerConfig& c = config_;
  const double delta = c.warmup_max_lr - c.warmup_min_lr;
  switch (c.type) {
    case SchedulerType::kNone: return base_lr_;
    case SchedulerType::kWarmupLR:
      if (iteration < 0) return c.warmup_min_lr;
      if (iteration < warmup_steps_) return c.warmup_min_lr + delta * WarmupGamma(iteration);
      return c.warmup_max_lr;
    case SchedulerType::kWarmupDecayLR: {
      if (iteration < 0) return c.warmup_min_lr;
      if (iteration < warmup_steps_) return c.warmup_min_lr + delta * WarmupGamma(iteration);
      const double gamma = std::max(0.0, static_cast<double>(c.total_num_steps - iteration) /
                                             std::max(1.0, static_cast<double>(c.total_num_steps - warmup_steps_)));
      return c.warmup_min_lr + delta * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      if (iteration < 0) return 0.0;
      if (iteration < warmup_steps_) {
        return base_lr_ * (c.warmup_min_ratio + WarmupGamma(iteration) * (1.0 - c.warmup_min_ratio));
      }
      const double real_last = static_cast<double>(iteration - warmup_steps_ + 1);
      int64_t real_total = c.total_num_steps - warmup_steps_;
      if (real_total == 0) real_total = 1;
      const double cosine = (1.0 + std::cos(std::numbers::pi * real_last / static_cast<double>(real_total))) / 2.0;
      return base_lr_ * std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
    }
  }
  return base_lr_;
}

}  // namespace zinf::optim
