#include "swap/param_swapper.h"

#include <gtest/gtest.h>

#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::HeldWritesEngine;
using testing::MakeEngine;
using testing::RandomBytes;
using testing::TempDir;

ParamSwapperOptions Options(const TempDir& dir, int64_t buffers, int64_t max_in_cpu) {
  ParamSwapperOptions o;
  o.buffer_count = buffers;
  o.buffer_elems = 100'000;
  o.max_in_cpu_elems = max_in_cpu;
  o.store.paths = {dir.Sub("nvme0"), dir.Sub("nvme1")};
  o.store.stripe_bytes = 64 << 10;
  return o;
}

const std::vector<ParamShardSpec> kShards = {
    {"block0", 100'000}, {"block1", 77'777}, {"block2", 5}, {"block3", 99'999}};

class ParamSwapperTest : public ::testing::Test {
 protected:
  void Fill(ParamSwapper& p) {
    for (size_t i = 0; i < kShards.size(); ++i) {
      data_.push_back(RandomBytes(static_cast<size_t>(kShards[i].elems) * 2, 50 + i));
      ASSERT_TRUE(p.Store(static_cast<ParamSwapper::ShardId>(i), data_.back().data()).ok());
    }
    ASSERT_TRUE(p.Flush().ok());
  }
  void ExpectShard(ParamSwapper& p, int i) {
    auto ptr = p.Acquire(i);
    ASSERT_TRUE(ptr.ok()) << ptr.status().ToString();
    EXPECT_EQ(std::memcmp(*ptr, data_[static_cast<size_t>(i)].data(), data_[static_cast<size_t>(i)].size()), 0)
        << kShards[static_cast<size_t>(i)].name;
    ASSERT_TRUE(p.Release(i, false).ok());
  }

  TempDir dir_;
  std::unique_ptr<aio::IoEngine> engine_ = MakeEngine();
  std::vector<std::vector<std::byte>> data_;
};

// The pool Create makes: buffer_count buffers of buffer_elems elements,
// padded to the store's alignment; acquired shards live in them.
TEST_F(ParamSwapperTest, PoolOptionsHoldABufferOfElements) {
  ParamSwapperOptions o = Options(dir_, 3, 0);
  o.buffer_elems = 100'001;
  const aio::PinnedPoolOptions po = ParamSwapper::PoolOptions(o);
  EXPECT_EQ(po.buffer_count, 3);
  EXPECT_EQ(po.buffer_bytes, 200'704);  // 200'002 bytes in 4 KiB units
  EXPECT_EQ(po.alignment_bytes, o.store.alignment_bytes);
  EXPECT_EQ(po.pin, o.pin_memory);
  auto p = ParamSwapper::Create(o, engine_.get(), kShards);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Fill(**p);
  ExpectShard(**p, 0);
}

TEST_F(ParamSwapperTest, MoreShardsThanBuffersRoundTripThroughEviction) {
  auto p = ParamSwapper::Create(Options(dir_, 2, 1'000'000), engine_.get(), kShards);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Fill(**p);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) {
      if (i + 1 < 4) {
        ASSERT_TRUE((*p)->Prefetch(i + 1).ok());  // the next one ahead of use
      }
      ExpectShard(**p, i);
    }
  }
  EXPECT_GT((*p)->stats().evictions, 0);
  EXPECT_GT((*p)->stats().reads, 0);
}

TEST_F(ParamSwapperTest, DirtyReleaseIsWrittenBackAndReadAgain) {
  auto p = ParamSwapper::Create(Options(dir_, 2, 0), engine_.get(), kShards);  // no cache: every acquire reads
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Fill(**p);
  auto ptr = (*p)->Acquire(1);
  ASSERT_TRUE(ptr.ok());
  data_[1] = RandomBytes(data_[1].size(), 999);
  std::memcpy(*ptr, data_[1].data(), data_[1].size());
  ASSERT_TRUE((*p)->Release(1, true).ok());
  ASSERT_TRUE((*p)->Flush().ok());  // the write-back has landed: nothing stays cached
  EXPECT_EQ((*p)->cached_elems(), 0);
  const int64_t reads = (*p)->stats().reads;
  ExpectShard(**p, 1);
  EXPECT_EQ((*p)->stats().reads, reads + 1);
}

// With no cache (max_in_cpu 0), a Store does not wait for its write: the
// shard stays in its buffer, readable without I/O, until the write has
// landed and a trim (here Flush) evicts it.
TEST_F(ParamSwapperTest, AStoredShardStaysReadableUntilItsWriteLands) {
  HeldWritesEngine held(engine_.get());
  auto p = ParamSwapper::Create(Options(dir_, 4, 0), &held, kShards);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Fill(**p);
  EXPECT_EQ((*p)->cached_elems(), 0);
  held.hold = true;
  data_[1] = RandomBytes(data_[1].size(), 321);
  ASSERT_TRUE((*p)->Store(1, data_[1].data()).ok());
  EXPECT_EQ((*p)->cached_elems(), kShards[1].elems);
  const int64_t reads = (*p)->stats().reads;
  ExpectShard(**p, 1);
  EXPECT_EQ((*p)->stats().reads, reads);  // served from the buffer
  held.hold = false;
  ASSERT_TRUE((*p)->Flush().ok());
  EXPECT_EQ((*p)->cached_elems(), 0);
  ExpectShard(**p, 1);
  EXPECT_EQ((*p)->stats().reads, reads + 1);  // what was written comes back from the store
}

TEST_F(ParamSwapperTest, CachedShardsAreHits) {
  auto p = ParamSwapper::Create(Options(dir_, 4, 1'000'000), engine_.get(), kShards);
  ASSERT_TRUE(p.ok());
  Fill(**p);
  const int64_t reads = (*p)->stats().reads;
  for (int i = 0; i < 4; ++i) ExpectShard(**p, i);
  EXPECT_EQ((*p)->stats().reads, reads);
  EXPECT_EQ((*p)->stats().hits, 4);
}

TEST_F(ParamSwapperTest, AllBuffersAcquiredIsResourceExhausted) {
  auto p = ParamSwapper::Create(Options(dir_, 2, 1'000'000), engine_.get(), kShards);
  ASSERT_TRUE(p.ok());
  Fill(**p);
  ASSERT_TRUE((*p)->Acquire(0).ok());
  ASSERT_TRUE((*p)->Acquire(1).ok());
  auto third = (*p)->Acquire(2);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("buffer_count"), std::string::npos);
  ASSERT_TRUE((*p)->Release(0, false).ok());
  ExpectShard(**p, 2);
  ASSERT_TRUE((*p)->Release(1, false).ok());
}

// Prefetches fill every buffer, then the model asks for another shard (the
// recorded order went stale): the demanded shard takes a prefetch's buffer;
// the prefetched shard is read again when it is wanted.
TEST_F(ParamSwapperTest, DemandedShardTakesTheBufferOfAStalePrefetch) {
  auto p = ParamSwapper::Create(Options(dir_, 2, 0), engine_.get(), kShards);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Fill(**p);
  ASSERT_TRUE((*p)->Prefetch(0).ok());
  ASSERT_TRUE((*p)->Prefetch(1).ok());
  EXPECT_EQ((*p)->Prefetch(3).code(), StatusCode::kResourceExhausted);  // prefetches do not steal
  ExpectShard(**p, 3);
  ExpectShard(**p, 1);
  ExpectShard(**p, 0);
}

TEST_F(ParamSwapperTest, ShardLargerThanBufferIsRefusedAtStart) {
  auto p = ParamSwapper::Create(Options(dir_, 2, 0), engine_.get(), {{"embedding", 100'001}});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("offload_param.buffer_size"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("'embedding'"), std::string::npos) << p.status().message();
}

}  // namespace
}  // namespace zinf::swap
