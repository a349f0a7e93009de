// PinnedPool: fixed buffers, leases as move-only RAII, exhaustion reported.
#include "aio/pinned_pool.h"

#include <unistd.h>

#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/units.h"

namespace zinf::aio {
namespace {

std::unique_ptr<PinnedPool> Make(int64_t count, int64_t bytes, int64_t align = 4096) {
  PinnedPoolOptions o;
  o.buffer_count = count;
  o.buffer_bytes = bytes;
  o.alignment_bytes = align;
  o.name = "test pool";
  auto p = PinnedPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

TEST(PinnedPool, BuffersAreAlignedDistinctAndSized) {
  auto pool = Make(5, 10000, 512);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->buffer_bytes(), AlignUp(10000, 512));
  std::vector<PinnedBuffer> leases;
  std::set<int> indices;
  for (int i = 0; i < 5; ++i) {
    leases.push_back(pool->Acquire());
    const PinnedBuffer& b = leases.back();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 512, 0u);
    EXPECT_EQ(b.size(), pool->buffer_bytes());
    indices.insert(b.index());
    auto region = pool->region();
    EXPECT_GE(b.data(), region.data());
    EXPECT_LE(b.data() + b.size(), region.data() + region.size());
  }
  EXPECT_EQ(indices.size(), 5u);
  for (int i = 0; i + 1 < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      const bool disjoint = leases[i].data() + leases[i].size() <= leases[j].data() ||
                            leases[j].data() + leases[j].size() <= leases[i].data();
      EXPECT_TRUE(disjoint);
    }
  }
}

// MappedBytes says what Create maps: buffers aligned, the whole rounded to
// pages, or to 2 MiB huge pages.
TEST(PinnedPool, MappedBytesIsTheRegion) {
  for (bool huge : {false, true}) {
    for (int64_t bytes : {int64_t{1}, int64_t{10000}, int64_t{3} << 20}) {
      PinnedPoolOptions o;
      o.buffer_count = 3;
      o.buffer_bytes = bytes;
      o.alignment_bytes = 512;
      o.huge_pages = huge;
      o.pin = false;
      auto pool = PinnedPool::Create(o);
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      EXPECT_EQ(static_cast<int64_t>((*pool)->region().size()), PinnedPool::MappedBytes(o)) << bytes << " " << huge;
      EXPECT_GE(PinnedPool::MappedBytes(o), 3 * AlignUp(bytes, 512));
      EXPECT_EQ(PinnedPool::MappedBytes(o) % (huge ? int64_t{2} << 20 : int64_t{::sysconf(_SC_PAGESIZE)}), 0);
    }
  }
}

TEST(PinnedPool, ExhaustionIsReportedNotAllocated) {
  auto pool = Make(2, 4096);
  auto a = pool->TryAcquire();
  auto b = pool->TryAcquire();
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = pool->TryAcquire();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("test pool exhausted"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("all 2 buffers"), std::string::npos);
  EXPECT_EQ(pool->free_count(), 0);
  a->Reset();
  EXPECT_EQ(pool->free_count(), 1);
  EXPECT_TRUE(pool->TryAcquire().ok());  // the temporary returns it at once
  EXPECT_EQ(pool->free_count(), 1);
}

TEST(PinnedPool, OversizeRequestIsAnError) {
  auto pool = Make(1, 8192);
  auto r = pool->TryAcquire(8193);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("8193"), std::string::npos);
  EXPECT_TRUE(pool->TryAcquire(8192).ok());
}

TEST(PinnedPool, BadOptionsAreRejected) {
  PinnedPoolOptions o;
  o.alignment_bytes = 1000;
  EXPECT_EQ(PinnedPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.alignment_bytes = 256;
  EXPECT_EQ(PinnedPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = PinnedPoolOptions{};
  o.buffer_count = 0;
  EXPECT_EQ(PinnedPool::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPool, LeasesMoveAndReturnOnce) {
  auto pool = Make(1, 4096);
  PinnedBuffer a = pool->Acquire();
  char* p = a.data();
  PinnedBuffer b = std::move(a);
  EXPECT_FALSE(static_cast<bool>(a));  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(pool->free_count(), 0);
  PinnedBuffer c;
  c = std::move(b);
  EXPECT_EQ(pool->free_count(), 0);
  c = PinnedBuffer();
  EXPECT_EQ(pool->free_count(), 1);
}

TEST(PinnedPool, AcquireWaitsForARelease) {
  auto pool = Make(1, 4096);
  PinnedBuffer held = pool->Acquire();
  char* got = nullptr;
  std::thread waiter([&] {
    PinnedBuffer b = pool->Acquire();  // blocks until `held` is released
    got = b.data();
  });
  held.Reset();
  waiter.join();
  EXPECT_NE(got, nullptr);
  EXPECT_EQ(pool->free_count(), 1);
}

TEST(PinnedPool, MemoryIsPinnedWhenAllowed) {
  auto pool = Make(2, 1 * kMiB);
  if (!pool->pinned()) GTEST_SKIP() << "RLIMIT_MEMLOCK too small to pin 2 MiB";
  PinnedPoolOptions o;
  o.buffer_count = 1;
  o.buffer_bytes = 1 * kMiB;
  o.require_pinned = true;
  EXPECT_TRUE(PinnedPool::Create(o).ok());
}

}  // namespace
}  // namespace zinf::aio
