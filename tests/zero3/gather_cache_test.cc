// GatherCache alone, on the host device with one local rank and a pinned
// parameter home: holds and releases, the max_live bound, persistent
// blocks, reuse-distance keeping and prefetching from a recorded order.
#include "zero3/gather_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"
#include "zero3/buffer_plan.h"
#include "zero3/param_home.h"
#include "zero3/partitioner.h"
#include "zero3/prefetch_coordinator.h"

namespace zinf::zero3 {
namespace {

// Four blocks of 1024, 2048, 1024 and 64 elements (a small last one).
const std::vector<BlockSpec> kSpecs = {
    {"b0", {{"w", {1024}}}}, {"b1", {{"w", {2048}}}}, {"b2", {{"w", {32, 32}}}}, {"b3", {{"g", {64}}}}};

class GatherCacheTest : public ::testing::Test {
 protected:
  // max_live in elements; blocks below `persistence` elements stay gathered.
  void Make(int64_t max_live, int64_t persistence = 0, int64_t bucket = 0, int64_t reuse = 0) {
    auto p = Partitioner::Create(kSpecs, 1, 0);
    ASSERT_TRUE(p.ok());
    part_ = std::make_unique<Partitioner>(std::move(p).value());
    device_ = CreateHostDevice(0);
    auto s = device_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(s).value();
    config_.zero.offload_param.device = OffloadDevice::kCpu;
    config_.bf16.enabled = true;  // 16-bit working parameters
    config_.zero.stage = 3;
    config_.zero.stage3_param_persistence_threshold = persistence;
    config_.zero.stage3_max_live_parameters = max_live;
    auto plan = MakeBufferPlan(config_, kSpecs, 1, DeviceKind::kHost, ElementType::kF32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_ = std::move(plan).value();
    ParamHomeOptions ho;
    ho.plan = &plan_;
    ho.specs = &kSpecs;
    ho.partitioner = part_.get();
    ho.device = device_.get();
    ho.stream = stream_.get();
    ho.counters = &counters_;
    auto home = CreateParamHome(ho);
    ASSERT_TRUE(home.ok());
    home_ = std::move(home).value();
    std::vector<uint16_t> values(static_cast<size_t>(part_->total_shard_numel()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(i);
    ASSERT_TRUE(home_->WriteAll(reinterpret_cast<const char*>(values.data())).ok());
    std::vector<int64_t> elems;
    for (BlockId b = 0; b < part_->num_blocks(); ++b) elems.push_back(part_->layout(b).padded_numel);
    coordinator_ = std::make_unique<PrefetchCoordinator>(PrefetchOptions{bucket, reuse}, elems);
    GatherCache::Options o;
    o.device = device_.get();
    o.stream = stream_.get();
    o.device_comm = &local_;
    o.partitioner = part_.get();
    o.specs = &kSpecs;
    o.home = home_.get();
    o.coordinator = coordinator_.get();
    o.counters = &counters_;
    o.param_type = plan_.param_type;
    o.max_live_elems = plan_.live_limit_elems;
    o.persistent = plan_.persistent;
    o.refresh = [this](BlockId b, bool wait) -> StatusOr<bool> {
      refreshed_.push_back(b);
      return b < stale_from_ || wait;  // homes from stale_from_ on are owed an update
    };
    cache_ = std::make_unique<GatherCache>(std::move(o));
  }

  // Acquire as the engine does: record, hold, prefetch, wait.
  std::vector<void*> Acquire(BlockId b) {
    coordinator_->OnAcquire(b);
    EXPECT_TRUE(cache_->Hold(b).ok());
    cache_->Prefetch(/*wait_for_home=*/false);
    auto ptrs = cache_->WaitReady(b);
    EXPECT_TRUE(ptrs.ok()) << ptrs.status().ToString();
    return ptrs.ok() ? *ptrs : std::vector<void*>{};
  }

  size_t DeviceBytesInUse() const { return device_->bytes_in_use(); }

  Config config_;
  BufferPlan plan_;
  comm::LocalCommunicator local_;
  std::unique_ptr<Partitioner> part_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  EngineCounters counters_;
  std::unique_ptr<ParamHome> home_;
  std::unique_ptr<PrefetchCoordinator> coordinator_;
  std::unique_ptr<GatherCache> cache_;
  std::vector<BlockId> refreshed_;
  BlockId stale_from_ = 1 << 20;
};

TEST_F(GatherCacheTest, AHeldBlockHoldsItsHomesValuesUntilReleased) {
  Make(/*max_live=*/1 << 20);
  std::vector<void*> p = Acquire(2);
  ASSERT_EQ(p.size(), 1u);
  const BlockLayout& l = part_->layout(2);
  const auto* v = static_cast<const uint16_t*>(p[0]);
  for (int64_t i = 0; i < l.numel; ++i) ASSERT_EQ(v[i], static_cast<uint16_t>(l.rank_offset + i));
  EXPECT_EQ(refreshed_, std::vector<BlockId>{2});  // the home was brought up to date first
  EXPECT_EQ(cache_->FirstHeld(), std::optional<BlockId>(2));
  EXPECT_TRUE(cache_->Release(2).ok());
  EXPECT_EQ(cache_->FirstHeld(), std::nullopt);
  EXPECT_EQ(DeviceBytesInUse(), 0u);  // reuse distance 0: evicted
  EXPECT_EQ(cache_->Release(2).code(), StatusCode::kFailedPrecondition);
}

TEST_F(GatherCacheTest, NestedHoldsNeedAsManyReleases) {
  Make(1 << 20);
  Acquire(1);
  Acquire(1);
  EXPECT_EQ(counters_.resident_hits, 1);
  EXPECT_TRUE(cache_->Release(1).ok());
  EXPECT_EQ(cache_->FirstHeld(), std::optional<BlockId>(1));
  EXPECT_TRUE(cache_->Release(1).ok());
  EXPECT_EQ(cache_->FirstHeld(), std::nullopt);
}

TEST_F(GatherCacheTest, HeldBlocksMayOverrunMaxLiveAndAreCounted) {
  Make(/*max_live=*/2048);
  Acquire(0);
  Acquire(1);  // 1024 + 2048 > 2048, but block 0 is held
  EXPECT_EQ(counters_.live_limit_overruns, 1);
  EXPECT_EQ(counters_.live_elems, 1024 + 2048);
  EXPECT_TRUE(cache_->Release(0).ok());
  EXPECT_TRUE(cache_->Release(1).ok());
  EXPECT_EQ(counters_.live_elems, 0);
  EXPECT_EQ(counters_.peak_live_elems, 1024 + 2048);
}

TEST_F(GatherCacheTest, PersistentBlocksStayUntilDropAll) {
  Make(1 << 20, /*persistence=*/256);  // block 3 (64 elements, padded to 128) stays gathered
  ASSERT_TRUE(cache_->persistent(3));
  ASSERT_FALSE(cache_->persistent(2));
  Acquire(3);
  EXPECT_TRUE(cache_->Release(3).ok());
  EXPECT_GT(DeviceBytesInUse(), 0u);
  EXPECT_EQ(counters_.live_elems, 0);  // persistent blocks are not live elements
  Acquire(3);
  EXPECT_EQ(counters_.resident_hits, 1);
  EXPECT_TRUE(cache_->Release(3).ok());
  cache_->DropAll();
  EXPECT_EQ(DeviceBytesInUse(), 0u);
}

TEST_F(GatherCacheTest, ReplayingPrefetchesTheNextBlocksWithinTheBucketAndMaxLive) {
  Make(/*max_live=*/4096, 0, /*bucket=*/2048, /*reuse=*/0);
  // Step 1 records the order.
  for (BlockId b : {0, 1, 2}) {
    Acquire(b);
    EXPECT_TRUE(cache_->Release(b).ok());
  }
  coordinator_->OnStepEnd();
  cache_->DropAll();
  // Step 2 replays it: acquiring block 0 prefetches block 1 (2048 fit the bucket).
  Acquire(0);
  EXPECT_GE(counters_.prefetches, 1);
  EXPECT_TRUE(cache_->Release(0).ok());
  Acquire(1);
  EXPECT_GE(counters_.prefetch_hits, 1);
  EXPECT_TRUE(cache_->Release(1).ok());
  EXPECT_LE(counters_.peak_live_elems, 4096);
}

TEST_F(GatherCacheTest, AHomeNotYetCurrentStopsThePrefetch) {
  Make(1 << 20, 0, /*bucket=*/1 << 20, 0);
  for (BlockId b : {0, 1, 2}) {
    Acquire(b);
    EXPECT_TRUE(cache_->Release(b).ok());
  }
  coordinator_->OnStepEnd();
  cache_->DropAll();
  stale_from_ = 1;  // the update has reached block 0's shard only
  Acquire(0);
  EXPECT_EQ(counters_.prefetches, 0);
  EXPECT_TRUE(cache_->Release(0).ok());
  // Waiting for the home (several ranks) gathers them anyway.
  cache_->DropAll();
  coordinator_->OnAcquire(1);
  ASSERT_TRUE(cache_->Hold(1).ok());
  cache_->Prefetch(/*wait_for_home=*/true);
  EXPECT_EQ(counters_.prefetches, 1);  // block 2
  EXPECT_TRUE(cache_->WaitReady(1).ok());
  EXPECT_TRUE(cache_->Release(1).ok());
}

}  // namespace
}  // namespace zinf::zero3
