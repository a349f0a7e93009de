#include "zero3/prefetch_coordinator.h"

#include <gtest/gtest.h>

namespace zinf::zero3 {
namespace {

PrefetchCoordinator Make(int64_t bucket, int64_t reuse) {
  return PrefetchCoordinator({bucket, reuse}, {100, 200, 300, 400});
}

void Walk(PrefetchCoordinator& c, const std::vector<int>& order) {
  for (int b : order) c.OnAcquire(b);
  c.OnStepEnd();
}

const auto kNone = [](int) { return false; };

TEST(PrefetchCoordinatorTest, RecordsTheFirstStepThenPlansFromIt) {
  PrefetchCoordinator c = Make(500, 1000);
  c.OnAcquire(0);
  EXPECT_TRUE(c.Upcoming(500, kNone).empty());  // nothing known while recording
  EXPECT_EQ(c.NextUseDistance(0), PrefetchCoordinator::kNever);
  for (int b : {1, 2, 3, 3, 2, 1, 0}) c.OnAcquire(b);
  c.OnStepEnd();
  ASSERT_TRUE(c.replaying());
  EXPECT_EQ(c.trace().size(), 8u);
  // Before the first acquire: 0 then 1 (300 elements), 2 would pass 500.
  EXPECT_EQ(c.Upcoming(500, kNone), (std::vector<int>{0, 1}));
  c.OnAcquire(0);
  EXPECT_EQ(c.Upcoming(500, kNone), (std::vector<int>{1, 2}));  // exactly 500
  EXPECT_EQ(c.Upcoming(10, kNone), (std::vector<int>{1}));      // at least one
  EXPECT_EQ(c.Upcoming(500, [](int b) { return b == 1; }), (std::vector<int>{2}));
  // Block 0 comes back after 1, 2, 3, 3, 2, 1: 1800 elements.
  EXPECT_EQ(c.NextUseDistance(0), 1800);
  EXPECT_FALSE(c.KeepOnRelease(0));
  for (int b : {1, 2, 3}) c.OnAcquire(b);
  EXPECT_EQ(c.NextUseDistance(3), 0);
  EXPECT_TRUE(c.KeepOnRelease(3));
  EXPECT_EQ(c.order_changes(), 0);
}

TEST(PrefetchCoordinatorTest, ADifferentBlockCutsTheTraceAndRecordsAgain) {
  PrefetchCoordinator c = Make(1000, 0);
  Walk(c, {0, 1, 2, 3});
  c.OnAcquire(0);
  c.OnAcquire(3);  // expected 1
  EXPECT_EQ(c.order_changes(), 1);
  EXPECT_FALSE(c.replaying());
  EXPECT_TRUE(c.Upcoming(1000, kNone).empty());
  c.OnAcquire(1);
  c.OnStepEnd();
  EXPECT_EQ(c.trace(), (std::vector<int>{0, 3, 1}));
  EXPECT_TRUE(c.replaying());
  Walk(c, {0, 3, 1});
  EXPECT_EQ(c.order_changes(), 1);
}

TEST(PrefetchCoordinatorTest, AShortStepIsNoticed) {
  PrefetchCoordinator c = Make(1000, 0);
  Walk(c, {0, 1, 2, 3});
  Walk(c, {0, 1});
  EXPECT_EQ(c.order_changes(), 1);
  EXPECT_EQ(c.trace(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(c.replaying());
}

}  // namespace
}  // namespace zinf::zero3
