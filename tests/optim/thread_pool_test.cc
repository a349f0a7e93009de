// ThreadPool: every chunk exactly once, chunk boundaries fixed by n and grain,
// inline runs for one chunk, and many back-to-back jobs (lost wake-ups).
#include "optim/thread_pool.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::optim {
namespace {

std::unique_ptr<ThreadPool> MakePool(int threads, bool bind = false) {
  auto pool = ThreadPool::Create({.num_threads = threads, .bind_threads = bind});
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

TEST(ThreadPoolTest, CoversEveryElementOnce) {
  for (int threads : {1, 2, 4}) {
    auto pool = MakePool(threads);
    EXPECT_EQ(pool->num_threads(), threads);
    for (int64_t n : {1, 63, 64, 65, 1000, 4097}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int64_t> chunks{0};
      pool->ParallelFor(n, 64, [&](int64_t c, int64_t begin, int64_t end) {
        EXPECT_EQ(begin, c * 64);
        EXPECT_EQ(end, std::min(n, begin + 64));
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        chunks.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
      EXPECT_EQ(chunks.load(), (n + 63) / 64);
    }
  }
}

TEST(ThreadPoolTest, EmptyRangeCallsNothing) {
  auto pool = MakePool(2);
  bool called = false;
  pool->ParallelFor(0, 16, [&](int64_t, int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPoolTest, SingleChunkRunsOnTheCaller) {
  auto pool = MakePool(2);
  std::thread::id ran_on;
  pool->ParallelFor(10, 16, [&](int64_t, int64_t, int64_t) { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(ThreadPoolTest, ManyJobsInARow) {
  auto pool = MakePool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 2000; ++job) {
    pool->ParallelFor(7, 1, [&](int64_t, int64_t begin, int64_t end) { total.fetch_add(end - begin); });
  }
  EXPECT_EQ(total.load(), 2000 * 7);
}

TEST(ThreadPoolTest, WorkersShareTheWork) {
  auto pool = MakePool(2);
  std::vector<std::thread::id> ids(64);
  pool->ParallelFor(64, 1, [&](int64_t c, int64_t, int64_t) {
    ids[c] = std::this_thread::get_id();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the other worker take some
  });
  for (const auto& id : ids) EXPECT_NE(id, std::this_thread::get_id()) << "the caller waits; workers run";
}

TEST(ThreadPoolTest, DefaultIsOneThreadPerCore) {
  auto pool = MakePool(0, /*bind=*/true);
  EXPECT_EQ(pool->num_threads(), ThreadPool::NumCores());
  std::atomic<int64_t> total{0};
  pool->ParallelFor(1000, 10, [&](int64_t, int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 1000);
}

TEST(ThreadPoolTest, RejectsBadThreadCount) {
  EXPECT_FALSE(ThreadPool::Create({.num_threads = -1}).ok());
  EXPECT_FALSE(ThreadPool::Create({.num_threads = 5000}).ok());
}

}  // namespace
}  // namespace zinf::optim
