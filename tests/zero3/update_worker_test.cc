// UpdateWorker alone: a driver waiting for prefixes of a body's progress on
// a real thread (also run under TSan, label zero3).
#include "zero3/update_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace zinf::zero3 {
namespace {

// A gate the test opens step by step, so the body's progress is known.
class Gate {
 public:
  void Open(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    opened_ = n;
    cv_.notify_all();
  }
  void WaitOpen(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return opened_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int opened_ = 0;
};

TEST(UpdateWorkerTest, BeforeAnyStartEveryPrefixIsDone) {
  UpdateWorker w;
  EXPECT_FALSE(w.active());
  StatusOr<bool> r = w.WaitFor(1 << 30, /*wait=*/false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_TRUE(w.Join().ok());
}

TEST(UpdateWorkerTest, WaitsForJustThePrefixItNeeds) {
  UpdateWorker w;
  Gate gate;
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 for (int k = 1; k <= 3; ++k) {
                   gate.WaitOpen(k);
                   p.Publish(k * 100);
                 }
                 return Status::Ok();
               }).ok());
  EXPECT_TRUE(w.active());
  StatusOr<bool> early = w.WaitFor(100, /*wait=*/false);
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(*early);  // the body is held at the gate
  gate.Open(1);
  int64_t waited_ns = 0;
  StatusOr<bool> first = w.WaitFor(100, /*wait=*/true, &waited_ns);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  EXPECT_GE(waited_ns, 0);
  StatusOr<bool> second = w.WaitFor(101, /*wait=*/false);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);  // [0, 100) only
  gate.Open(3);
  StatusOr<bool> all = w.WaitFor(300, /*wait=*/true);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(*all);
  EXPECT_TRUE(w.Join().ok());
  EXPECT_FALSE(w.active());
}

TEST(UpdateWorkerTest, AFailedBodyFailsThePrefixesItDidNotReachEvenAfterJoin) {
  UpdateWorker w;
  ASSERT_TRUE(w.Start([](UpdateWorker::Progress& p) {
                 p.Publish(10);
                 return Status::IoError("sub-group 1: read failed");
               }).ok());
  StatusOr<bool> reached = w.WaitFor(10, /*wait=*/true);
  ASSERT_TRUE(reached.ok());
  EXPECT_TRUE(*reached);
  StatusOr<bool> missed = w.WaitFor(11, /*wait=*/true);
  ASSERT_FALSE(missed.ok());
  EXPECT_EQ(missed.status().code(), StatusCode::kIoError);
  Status joined = w.Join();
  EXPECT_EQ(joined.code(), StatusCode::kIoError);
  // The result stays with the progress: a later wait still fails, and
  // without waiting (the body has ended).
  StatusOr<bool> later = w.WaitFor(11, /*wait=*/false);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), StatusCode::kIoError);
  EXPECT_TRUE(w.Join().ok());  // joined already
}

TEST(UpdateWorkerTest, ABodyThatEndsShortWithoutAnErrorIsAnInternalError) {
  UpdateWorker w;
  ASSERT_TRUE(w.Start([](UpdateWorker::Progress& p) {
                 p.Publish(5);
                 return Status::Ok();
               }).ok());
  StatusOr<bool> r = w.WaitFor(6, /*wait=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(w.Join().ok());
}

TEST(UpdateWorkerTest, StartWhileABodyRunsIsRefusedAndARestartBeginsAfresh) {
  UpdateWorker w;
  Gate gate;
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 gate.WaitOpen(1);
                 p.Publish(50);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(w.Start([](UpdateWorker::Progress&) { return Status::Ok(); }).code(), StatusCode::kFailedPrecondition);
  gate.Open(1);
  EXPECT_TRUE(w.Join().ok());
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 gate.WaitOpen(2);
                 p.Publish(20);
                 return Status::Ok();
               }).ok());
  StatusOr<bool> r = w.WaitFor(20, /*wait=*/false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);  // progress starts at zero again
  gate.Open(2);
  EXPECT_TRUE(w.Join().ok());
}

TEST(UpdateWorkerTest, ADriverWaitingForEveryPrefixSeesThemInOrder) {
  constexpr int64_t kSteps = 2000;
  UpdateWorker w;
  std::atomic<int64_t> published{0};
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 for (int64_t k = 1; k <= kSteps; ++k) {
                   published.store(k, std::memory_order_relaxed);
                   p.Publish(k);
                 }
                 return Status::Ok();
               }).ok());
  for (int64_t k = 1; k <= kSteps; k += 7) {
    StatusOr<bool> r = w.WaitFor(k, /*wait=*/true);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(*r);
    ASSERT_GE(published.load(std::memory_order_relaxed), k);
  }
  EXPECT_TRUE(w.Join().ok());
}

TEST(UpdateWorkerTest, TheDestructorJoinsARunningBody) {
  std::atomic<bool> ran{false};
  {
    UpdateWorker w;
    ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                   p.Publish(1);
                   ran = true;
                   return Status::Ok();
                 }).ok());
  }
  EXPECT_TRUE(ran.load());
}

// A body writing a ring of 2 elements waits for the driver's Consume
// before it overwrites what the driver has not taken yet.
TEST(UpdateWorkerTest, TheBodyWaitsForTheDriverToConsumeTheRing) {
  UpdateWorker w;
  std::atomic<int> written{0};
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 for (int i = 0; i < 4; ++i) {
                   p.WaitConsumed(i + 1 - 2);  // element i overwrites element i - 2
                   written = i + 1;
                   p.Publish(i + 1);
                 }
                 return Status::Ok();
               }).ok());
  StatusOr<bool> r = w.WaitFor(2, /*wait=*/true);
  ASSERT_TRUE(r.ok() && *r);
  r = w.WaitFor(3, /*wait=*/false);  // the ring is full until the driver takes element 0
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(written.load(), 2);
  w.Consume(1);
  r = w.WaitFor(3, /*wait=*/true);
  ASSERT_TRUE(r.ok() && *r);
  w.Consume(2);
  r = w.WaitFor(4, /*wait=*/true);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_TRUE(w.Join().ok());
  EXPECT_EQ(written.load(), 4);
}

// A driver that stops draining (an error on its side) can still Join: the
// body's waits end.
TEST(UpdateWorkerTest, JoinReleasesABodyWaitingForConsumption) {
  UpdateWorker w;
  std::atomic<int> written{0};
  ASSERT_TRUE(w.Start([&](UpdateWorker::Progress& p) {
                 for (int i = 0; i < 5; ++i) {
                   p.WaitConsumed(i + 1 - 2);
                   written = i + 1;
                   p.Publish(i + 1);
                 }
                 return Status::Ok();
               }).ok());
  StatusOr<bool> r = w.WaitFor(2, /*wait=*/true);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_TRUE(w.Join().ok());
  EXPECT_EQ(written.load(), 5);
}

}  // namespace
}  // namespace zinf::zero3
