// The fp16 loss scaler's state machine against DeepSpeed's DynamicLossScaler:
// growth after a clean window, hysteresis, consecutive hysteresis, the
// minimum scale, static and disabled scaling.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace zinf::optim {
namespace {

Fp16Config Dynamic(int power, int window, int hysteresis, bool consecutive = false, double min_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 0.0;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

LossScaler Make(const Fp16Config& c) {
  auto s = LossScaler::Create(c);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

TEST(LossScalerTest, StartsAtTwoToThePower) {
  EXPECT_EQ(Make(Dynamic(16, 1000, 2)).scale(), 65536.0);
  EXPECT_EQ(Make(Dynamic(0, 1000, 2)).scale(), 1.0);
  EXPECT_TRUE(Make(Dynamic(16, 1000, 2)).dynamic());
}

TEST(LossScalerTest, GrowsAfterEachCleanWindow) {
  LossScaler s = Make(Dynamic(4, 3, 1));
  // DeepSpeed: grow when (iter - last_overflow_iter) % window == 0, with
  // last_overflow_iter = -1 at the start: after 3 clean steps.
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 16.0);
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 32.0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 64.0);
  EXPECT_EQ(s.state().iteration, 6);
}

TEST(LossScalerTest, OverflowHalvesAndRestartsTheWindow) {
  LossScaler s = Make(Dynamic(10, 3, 1));
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(true).ok());  // iteration 1
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().last_overflow_iteration, 1);
  ASSERT_TRUE(s.Update(false).ok());  // 2: (2-1) % 3
  ASSERT_TRUE(s.Update(false).ok());  // 3
  EXPECT_EQ(s.scale(), 512.0);
  ASSERT_TRUE(s.Update(false).ok());  // 4: (4-1) % 3 == 0
  EXPECT_EQ(s.scale(), 1024.0);
}

TEST(LossScalerTest, HysteresisDelaysTheDecrease) {
  LossScaler s = Make(Dynamic(10, 1000, 2));
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 1024.0) << "the first overflow only uses up hysteresis";
  EXPECT_EQ(s.state().hysteresis_left, 1);
  ASSERT_TRUE(s.Update(false).ok());  // not consecutive: hysteresis is not refilled
  EXPECT_EQ(s.state().hysteresis_left, 1);
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 512.0);
  ASSERT_TRUE(s.Update(true).ok());  // hysteresis stays spent until a growth
  EXPECT_EQ(s.scale(), 256.0);
}

TEST(LossScalerTest, HysteresisRefillsAtGrowth) {
  LossScaler s = Make(Dynamic(10, 2, 2));
  ASSERT_TRUE(s.Update(true).ok());   // iter 0: hysteresis 2 -> 1
  ASSERT_TRUE(s.Update(false).ok());  // iter 1: (1-0) % 2
  ASSERT_TRUE(s.Update(false).ok());  // iter 2: grow, refill
  EXPECT_EQ(s.scale(), 2048.0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 2048.0);
}

TEST(LossScalerTest, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  LossScaler s = Make(Dynamic(10, 1000, 2, /*consecutive=*/true));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.Update(true).ok());
    EXPECT_EQ(s.scale(), 1024.0);
    ASSERT_TRUE(s.Update(false).ok());
    EXPECT_EQ(s.state().hysteresis_left, 2);
  }
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());  // two in a row
  EXPECT_EQ(s.scale(), 512.0);
}

TEST(LossScalerTest, StopsAtMinScaleThenFails) {
  LossScaler s = Make(Dynamic(2, 1000, 1, false, /*min_scale=*/3.0));
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 3.0) << "clamped to min_loss_scale, not 2";
  const LossScaler::State before = s.state();
  Status st = s.Update(true);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_NE(st.message().find("min_loss_scale"), std::string::npos);
  EXPECT_EQ(s.state().scale, before.scale);
  EXPECT_EQ(s.state().iteration, before.iteration);
  // A clean step is still fine and may grow the scale again later.
  EXPECT_TRUE(s.Update(false).ok());
}

TEST(LossScalerTest, AtMinScaleHysteresisStillAbsorbs) {
  LossScaler s = Make(Dynamic(0, 1000, 2));
  EXPECT_TRUE(s.Update(true).ok()) << "hysteresis 2 -> 1, no decrease needed";
  EXPECT_EQ(s.Update(true).code(), StatusCode::kAborted);
}

TEST(LossScalerTest, StaticAndDisabled) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128.0;
  LossScaler s = Make(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_TRUE(s.Update(true).ok());
  EXPECT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 128.0);
  c.enabled = false;
  LossScaler off = Make(c);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_TRUE(off.Update(true).ok());
  EXPECT_EQ(off.scale(), 1.0);
}

TEST(LossScalerTest, RestoreResumesTheStateMachine) {
  LossScaler a = Make(Dynamic(8, 4, 2));
  for (bool o : {false, true, false, true, false, false}) ASSERT_TRUE(a.Update(o).ok());
  LossScaler b = Make(Dynamic(8, 4, 2));
  b.Restore(a.state());
  for (bool o : {false, false, true, false, false, false, false, true, true}) {
    ASSERT_TRUE(a.Update(o).ok());
    ASSERT_TRUE(b.Update(o).ok());
    EXPECT_EQ(a.scale(), b.scale());
  }
}

TEST(LossScalerTest, RejectsBadConfig) {
  EXPECT_FALSE(LossScaler::Create(Dynamic(16, 0, 2)).ok());
  EXPECT_FALSE(LossScaler::Create(Dynamic(16, 1000, 0)).ok());
  EXPECT_FALSE(LossScaler::Create(Dynamic(-1, 1000, 2)).ok());
  EXPECT_FALSE(LossScaler::Create(Dynamic(200, 1000, 2)).ok());
  EXPECT_FALSE(LossScaler::Create(Dynamic(16, 1000, 2, false, 0.0)).ok());
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = -1;
  EXPECT_FALSE(LossScaler::Create(c).ok());
}

}  // namespace
}  // namespace zinf::optim
