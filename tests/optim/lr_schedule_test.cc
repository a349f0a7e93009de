// DeepSpeed's LR schedules at their edges: before the first step, the first
// and last warmup steps, the end of the schedule and past it; log and linear
// warmup; the clamps DeepSpeed applies (warmup >= 2, decay >= 0).
#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

namespace zinf::optim {
namespace {

SchedulerConfig Config(SchedulerType type, WarmupType warmup, int64_t warmup_steps, int64_t total = 0) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_type = warmup;
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = warmup_steps;
  c.total_num_steps = total;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  return c;
}

LrSchedule Make(const SchedulerConfig& c, double base_lr = 2e-3) {
  auto s = LrSchedule::Create(c, base_lr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

TEST(LrScheduleTest, NoneIsTheOptimizerLr) {
  LrSchedule s = Make(SchedulerConfig{}, 3e-4);
  EXPECT_EQ(s.LrAt(-1), 3e-4);
  EXPECT_EQ(s.LrAt(1'000'000), 3e-4);
}

TEST(LrScheduleTest, WarmupLrLog) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLog, 100));
  EXPECT_EQ(s.LrAt(-1), 1e-5) << "DeepSpeed starts the optimizer at min_lr";
  EXPECT_DOUBLE_EQ(s.LrAt(0), 1e-5) << "log(1) = 0";
  EXPECT_DOUBLE_EQ(s.LrAt(9), 1e-5 + (1e-3 - 1e-5) * 0.5) << "log(10) / log(100)";
  EXPECT_DOUBLE_EQ(s.LrAt(99), 1e-3) << "log(100) / log(100): max at the last warmup step";
  EXPECT_EQ(s.LrAt(100), 1e-3);
  EXPECT_EQ(s.LrAt(1'000'000), 1e-3);
}

TEST(LrScheduleTest, WarmupLrLinear) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLinear, 100));
  EXPECT_DOUBLE_EQ(s.LrAt(0), 1e-5);
  EXPECT_DOUBLE_EQ(s.LrAt(50), 1e-5 + (1e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(99), 1e-5 + (1e-3 - 1e-5) * 0.99) << "linear warmup never quite reaches max";
  EXPECT_EQ(s.LrAt(100), 1e-3);
}

TEST(LrScheduleTest, WarmupShorterThanTwoIsTwo) {
  for (int64_t w : {0, 1, 2}) {
    LrSchedule s = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLinear, w));
    EXPECT_DOUBLE_EQ(s.LrAt(0), 1e-5);
    EXPECT_DOUBLE_EQ(s.LrAt(1), 1e-5 + (1e-3 - 1e-5) * 0.5);
    EXPECT_EQ(s.LrAt(2), 1e-3);
  }
}

TEST(LrScheduleTest, WarmupDecayLr) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 10, 110));
  EXPECT_EQ(s.LrAt(-1), 1e-5);
  EXPECT_DOUBLE_EQ(s.LrAt(5), 1e-5 + (1e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(10), 1e-3) << "(total - w) / (total - w)";
  EXPECT_DOUBLE_EQ(s.LrAt(60), 1e-5 + (1e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(109), 1e-5 + (1e-3 - 1e-5) * 0.01);
  EXPECT_DOUBLE_EQ(s.LrAt(110), 1e-5) << "min_lr at total_num_steps";
  EXPECT_DOUBLE_EQ(s.LrAt(500), 1e-5) << "clamped past the end";
}

TEST(LrScheduleTest, WarmupDecayLrWithTotalAtWarmup) {
  // total == warmup: DeepSpeed's max(1, total - warmup) avoids 0 / 0.
  LrSchedule s = Make(Config(SchedulerType::kWarmupDecayLR, WarmupType::kLog, 10, 10));
  EXPECT_DOUBLE_EQ(s.LrAt(10), 1e-5);
  EXPECT_TRUE(std::isfinite(s.LrAt(11)));
}

TEST(LrScheduleTest, WarmupCosineLr) {
  const double base = 2e-3;
  LrSchedule s = Make(Config(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 10, 110), base);
  EXPECT_EQ(s.LrAt(-1), 0.0) << "DeepSpeed's get_lr before the first step";
  EXPECT_DOUBLE_EQ(s.LrAt(0), base * 0.1) << "warmup_min_ratio";
  EXPECT_DOUBLE_EQ(s.LrAt(9), base) << "ratio 1 at the last warmup step";
  // First cosine step: real_last_step = 1 of 100.
  EXPECT_DOUBLE_EQ(s.LrAt(10), base * (0.01 + 0.99 * (1 + std::cos(std::numbers::pi / 100)) / 2));
  EXPECT_DOUBLE_EQ(s.LrAt(59), base * (0.01 + 0.99 * 0.5)) << "half way";
  EXPECT_DOUBLE_EQ(s.LrAt(109), base * 0.01) << "cos_min_ratio at the end";
  // Past the end DeepSpeed's cosine rises again; kept as is.
  EXPECT_GT(s.LrAt(150), s.LrAt(109));
}

TEST(LrScheduleTest, WarmupCosineLrLinearWarmup) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupCosineLR, WarmupType::kLinear, 10, 20), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(5), 0.1 + 0.9 * 0.5);
}

TEST(LrScheduleTest, WarmupCosineLrWithTotalAtWarmupDoesNotDivideByZero) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 10, 10), 1.0);
  EXPECT_TRUE(std::isfinite(s.LrAt(10)));
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.01) << "cos(pi) at the first step after warmup";
}

TEST(LrScheduleTest, StatefulStepping) {
  LrSchedule s = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLinear, 4));
  EXPECT_EQ(s.last_batch_iteration(), -1);
  EXPECT_EQ(s.lr(), 1e-5);
  s.Step();
  EXPECT_EQ(s.lr(), s.LrAt(0));
  s.set_last_batch_iteration(3);
  s.Step();
  EXPECT_EQ(s.lr(), 1e-3);
}

TEST(LrScheduleTest, RejectsBadConfig) {
  EXPECT_FALSE(LrSchedule::Create(Config(SchedulerType::kWarmupDecayLR, WarmupType::kLog, 10, 0), 1e-3).ok());
  EXPECT_FALSE(LrSchedule::Create(Config(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 10, -5), 1e-3).ok());
  EXPECT_FALSE(LrSchedule::Create(Config(SchedulerType::kWarmupLR, WarmupType::kLog, -1), 1e-3).ok());
  SchedulerConfig c = Config(SchedulerType::kWarmupLR, WarmupType::kLog, 10);
  c.warmup_max_lr = NAN;
  EXPECT_FALSE(LrSchedule::Create(c, 1e-3).ok());
  EXPECT_FALSE(LrSchedule::Create(SchedulerConfig{}, -1.0).ok());
  // total below warmup is only a warning, as in DeepSpeed.
  EXPECT_TRUE(LrSchedule::Create(Config(SchedulerType::kWarmupDecayLR, WarmupType::kLog, 10, 5), 1e-3).ok());
}

}  // namespace
}  // namespace zinf::optim
