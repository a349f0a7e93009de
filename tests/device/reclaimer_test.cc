// Device::Allocate asks the reclaimer for cached memory when the budget is
// spent, and retries while it gives some back.
#include <gtest/gtest.h>

#include <vector>

#include "device/device.h"

namespace zinf {
namespace {

TEST(ReclaimerTest, AFullBudgetIsFreedFromTheCacheAndTheAllocationRetried) {
  auto device = CreateHostDevice(4096);
  std::vector<void*> cache;
  for (int i = 0; i < 4; ++i) {
    auto p = device->Allocate(1024);
    ASSERT_TRUE(p.ok());
    cache.push_back(*p);
  }
  int calls = 0;
  device->SetReclaimer([&] {
    ++calls;
    if (cache.empty()) return false;
    device->Free(cache.back());
    cache.pop_back();
    return true;
  });
  auto big = device->Allocate(2048);  // two cached allocations give way
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.size(), 2u);
  auto too_big = device->Allocate(8192);  // nothing frees enough: the cache empties, then out of memory
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(cache.empty());
  device->Free(*big);
}

TEST(ReclaimerTest, WithoutAReclaimerABudgetOverrunIsOutOfMemory) {
  auto device = CreateHostDevice(1024);
  auto a = device->Allocate(1024);
  ASSERT_TRUE(a.ok());
  device->SetReclaimer([] { return false; });
  device->SetReclaimer({});  // unset
  EXPECT_EQ(device->Allocate(256).status().code(), StatusCode::kOutOfMemory);
  device->Free(*a);
}

}  // namespace
}  // namespace zinf
