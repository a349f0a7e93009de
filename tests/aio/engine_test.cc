// IoEngine on real files: io_uring (in each submission mode) and pread/pwrite.
#include "aio/io_engine.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "aio/aio_test_util.h"
#include "aio/completion.h"
#include "aio/pinned_pool.h"
#include "aio/uring_engine.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

using testing::FillRandom;
using testing::TempDir;

struct Mode {
  EngineKind kind;
  int threads;
  int queue_depth;
  bool single_submit;
  bool overlap_events;
  std::string name;
};

IoEngineOptions OptionsFor(const Mode& m) {
  IoEngineOptions o;
  o.kind = m.kind;
  o.thread_count = m.threads;
  o.queue_depth = m.queue_depth;
  o.single_submit = m.single_submit;
  o.overlap_events = m.overlap_events;
  o.block_size_bytes = 64 * kKiB;  // many pieces per request
  return o;
}

std::unique_ptr<PinnedPool> MakePool(int64_t count, int64_t bytes) {
  PinnedPoolOptions po;
  po.buffer_count = count;
  po.buffer_bytes = bytes;
  auto pool = PinnedPool::Create(po);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(pool).value();
}

class EngineTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    auto e = CreateIoEngine(OptionsFor(GetParam()));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    if (GetParam().kind == EngineKind::kUring) {
      ASSERT_EQ(engine_->name(), "io_uring");
    }
    auto f = engine_->OpenFile(dir_.File("data"), OpenOptions{true, true, false});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = *f;
  }
  TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
  FileId file_ = -1;
};

TEST_P(EngineTest, MultiSegmentRoundTrip) {
  auto pool = MakePool(2, 4 * kMiB);
  auto region = pool->region();
  ASSERT_TRUE(engine_->RegisterMemory(region.data(), region.size()).ok());
  PinnedBuffer out = pool->Acquire();
  PinnedBuffer in = pool->Acquire();
  FillRandom(out.data(), out.size(), 1);
  // Three segments of odd block counts, out of file order, one past a hole.
  const IoSegment segs[] = {
      {file_, 40 * 4096, 300 * 4096, out.data()},
      {file_, 0, 17 * 4096, out.data() + 300 * 4096},
      {file_, 1000 * 4096, 5 * 4096, out.data() + 317 * 4096},
  };
  auto w = engine_->Submit(IoOp::kWrite, segs);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(engine_->Wait(*w).ok());
  IoSegment rsegs[3];
  for (int i = 0; i < 3; ++i) {
    rsegs[i] = segs[i];
    rsegs[i].buffer = in.data() + (static_cast<char*>(segs[i].buffer) - out.data());
  }
  auto r = engine_->Submit(IoOp::kRead, rsegs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(engine_->Wait(*r).ok());
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 322 * 4096), 0);
  auto size = engine_->FileSize(file_);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 1005 * 4096);
}

TEST_P(EngineTest, ManyOutstandingWaitedInAnyOrder) {
  constexpr int kRequests = 48;
  constexpr int64_t kBytes = 96 * kKiB;  // 1.5 pieces each
  auto pool = MakePool(2 * kRequests, kBytes);
  std::vector<PinnedBuffer> out, in;
  for (int i = 0; i < kRequests; ++i) {
    out.push_back(pool->Acquire());
    in.push_back(pool->Acquire());
    FillRandom(out.back().data(), kBytes, 100 + i);
  }
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kRequests; ++i) {
    auto t = engine_->Submit(IoOp::kWrite, IoSegment{file_, i * kBytes, kBytes, out[i].data()});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  for (int i = kRequests - 1; i >= 0; --i) ASSERT_TRUE(engine_->Wait(tickets[i]).ok());
  tickets.clear();
  for (int i = 0; i < kRequests; ++i) {
    auto t = engine_->Submit(IoOp::kRead, IoSegment{file_, i * kBytes, kBytes, in[i].data()});
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  // Middle-out order; IsDone is true after Wait's sibling completed or not -- only Wait decides.
  for (int k = 0; k < kRequests; ++k) {
    const int i = (k * 7) % kRequests;  // 7 is coprime with 48: a permutation
    ASSERT_TRUE(engine_->Wait(tickets[i]).ok());
    EXPECT_EQ(std::memcmp(in[i].data(), out[i].data(), kBytes), 0) << "request " << i;
  }
}

TEST_P(EngineTest, WaitAllSpendsEveryTicket) {
  auto pool = MakePool(8, 64 * kKiB);
  std::vector<PinnedBuffer> bufs;
  for (int i = 0; i < 8; ++i) {
    bufs.push_back(pool->Acquire());
    ASSERT_TRUE(engine_->Submit(IoOp::kWrite, IoSegment{file_, i * 64 * kKiB, 64 * kKiB, bufs[i].data()}).ok());
  }
  EXPECT_TRUE(engine_->WaitAll().ok());
  auto size = engine_->FileSize(file_);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 8 * 64 * kKiB);
}

TEST_P(EngineTest, UnalignedRequestIsRejectedWithOffsetAndLength) {
  auto pool = MakePool(1, 64 * kKiB);
  PinnedBuffer b = pool->Acquire();
  auto t = engine_->Submit(IoOp::kWrite, IoSegment{file_, 100, 4096, b.data()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("offset 100 length 4096"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find(dir_.File("data")), std::string::npos);
  t = engine_->Submit(IoOp::kRead, IoSegment{file_, 0, 1000, b.data()});
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  t = engine_->Submit(IoOp::kRead, IoSegment{file_, 0, 4096, b.data() + 8});
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  t = engine_->Submit(IoOp::kRead, IoSegment{file_ + 7, 0, 4096, b.data()});
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->sticky_error().ok()) << "a refused request is not an I/O error";
}

TEST_P(EngineTest, ReadPastEndOfFileIsAnErrorNamingTheRange) {
  auto pool = MakePool(1, 64 * kKiB);
  PinnedBuffer b = pool->Acquire();
  ASSERT_TRUE(engine_->Write(file_, 0, b.data(), 8192).ok());
  Status st = engine_->Read(file_, 0, b.data(), 64 * kKiB);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("end of file"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(dir_.File("data")), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("offset 8192"), std::string::npos) << st.ToString();
  // The failure is sticky.
  auto t = engine_->Submit(IoOp::kRead, IoSegment{file_, 0, 4096, b.data()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kAborted);
  EXPECT_NE(t.status().message().find("end of file"), std::string::npos);
}

TEST_P(EngineTest, EmptyRequestCompletesAtOnce) {
  auto t = engine_->Submit(IoOp::kRead, std::span<const IoSegment>{});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(engine_->IsDone(*t));
  EXPECT_TRUE(engine_->Wait(*t).ok());
}

TEST_P(EngineTest, TruncateAllocateSync) {
  ASSERT_TRUE(engine_->Allocate(file_, 1 * kMiB).ok());
  EXPECT_EQ(*engine_->FileSize(file_), 1 * kMiB);
  ASSERT_TRUE(engine_->Truncate(file_, 4096).ok());
  EXPECT_EQ(*engine_->FileSize(file_), 4096);
  EXPECT_TRUE(engine_->Sync(file_).ok());
  EXPECT_EQ(engine_->Sync(file_ + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->CloseFile(file_).ok());
  EXPECT_EQ(engine_->CloseFile(file_).code(), StatusCode::kInvalidArgument);
}

const Mode kModes[] = {
    {EngineKind::kPosix, 1, 1, false, true, "posix"},
    {EngineKind::kUring, 1, 8, false, true, "uring_batched_overlapped"},
    {EngineKind::kUring, 1, 8, true, true, "uring_single_submit"},
    {EngineKind::kUring, 1, 8, false, false, "uring_no_overlap"},
    {EngineKind::kUring, 3, 4, true, false, "uring_3_threads_single_no_overlap"},
    {EngineKind::kUring, 2, 1, false, true, "uring_2_threads_qd1"},
};
INSTANTIATE_TEST_SUITE_P(Modes, EngineTest, ::testing::ValuesIn(kModes),
                         [](const ::testing::TestParamInfo<Mode>& p) { return p.param.name; });

TEST(EngineCrossCheck, UringAndPosixGiveIdenticalBytes) {
  TempDir dir;
  IoEngineOptions uo;
  uo.kind = EngineKind::kUring;
  uo.thread_count = 2;
  uo.queue_depth = 16;
  uo.block_size_bytes = 128 * kKiB;
  IoEngineOptions po = uo;
  po.kind = EngineKind::kPosix;
  auto uring = CreateIoEngine(uo);
  auto posix = CreateIoEngine(po);
  ASSERT_TRUE(uring.ok() && posix.ok());
  auto pool = MakePool(3, 3 * kMiB + 12 * kKiB);
  PinnedBuffer data = pool->Acquire(), a = pool->Acquire(), b = pool->Acquire();
  const int64_t n = data.size();
  FillRandom(data.data(), n, 42);
  // Each engine writes its own file; each reads both files back.
  auto fu = (*uring)->OpenFile(dir.File("u"), OpenOptions{true, true, false});
  auto fp = (*posix)->OpenFile(dir.File("p"), OpenOptions{true, true, false});
  ASSERT_TRUE(fu.ok() && fp.ok());
  ASSERT_TRUE((*uring)->Write(*fu, 8192, data.data(), n).ok());
  ASSERT_TRUE((*posix)->Write(*fp, 8192, data.data(), n).ok());
  auto fu2 = (*posix)->OpenFile(dir.File("u"), OpenOptions{});
  auto fp2 = (*uring)->OpenFile(dir.File("p"), OpenOptions{});
  ASSERT_TRUE(fu2.ok() && fp2.ok());
  ASSERT_TRUE((*posix)->Read(*fu2, 0, a.data(), n).ok());
  ASSERT_TRUE((*uring)->Read(*fp2, 0, b.data(), n).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(n)), 0);
  EXPECT_EQ(std::memcmp(a.data() + 8192, data.data(), static_cast<size_t>(n - 8192)), 0);
  // And the files on disk are byte-identical.
  std::ifstream x(dir.File("u"), std::ios::binary), y(dir.File("p"), std::ios::binary);
  std::string sx((std::istreambuf_iterator<char>(x)), {}), sy((std::istreambuf_iterator<char>(y)), {});
  EXPECT_EQ(sx.size(), static_cast<size_t>(n + 8192));
  EXPECT_TRUE(sx == sy);
}

// The scheduler slices (ns) of this process's threads named zinf-aio-*.
std::vector<uint64_t> RingThreadSlices() {
  std::vector<uint64_t> slices;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return slices;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("zinf-aio-", 0) != 0) continue;
    slices.push_back(ThreadSchedulerSliceNs(std::atoi(e->d_name)));
  }
  closedir(d);
  return slices;
}

// Each ring's thread asks for the kernel's shortest slice, so that a
// completion's wake-up does not wait for a computing thread's slice to end.
TEST(EngineThreads, RingThreadsAskForTheShortestSlice) {
  const uint64_t self = ThreadSchedulerSliceNs(0);
  if (self == 0) GTEST_SKIP() << "this kernel reports no fair-scheduler slice (custom slices: Linux 6.12)";
  IoEngineOptions o;
  o.kind = EngineKind::kUring;
  o.thread_count = 2;
  auto e = CreateIoEngine(o);
  if (!e.ok()) GTEST_SKIP() << "no io_uring here: " << e.status().ToString();
  // The threads set it as they start: wait for both, at most 10 s.
  std::vector<uint64_t> slices;
  for (int i = 0; i < 1000; ++i) {
    slices = RingThreadSlices();
    if (slices.size() == 2 && slices[0] == kRingThreadSliceNs && slices[1] == kRingThreadSliceNs) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0], kRingThreadSliceNs);
  EXPECT_EQ(slices[1], kRingThreadSliceNs);
  EXPECT_NE(self, kRingThreadSliceNs) << "the test's own thread keeps the default";
}

// Records the direction of every completed piece; holds the first
// completion until Open(), so that requests submitted meanwhile all wait in
// the ring's queues.
class OrderRecorder final : public CompletionHook {
 public:
  Decision OnCompletion(const Piece& piece, const FileInfo&, int64_t res) override {
    std::unique_lock lock(mu_);
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    order_ += piece.op == IoOp::kRead ? 'R' : 'W';
    return Decision{res, 0};
  }
  // Blocks until the first completion is held.
  void WaitHeld() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::string order() {
    std::lock_guard lock(mu_);
    return order_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  bool open_ = false;
  std::string order_;
};

// With reads and writes both waiting, one ring issues them in runs of
// mix_run_pieces by turns, each request's bytes intact; mix_run_pieces 0
// keeps submission order.
TEST(EngineMix, ReadsAndWritesWaitingGoOutInRunsByTurns) {
  for (const int run : {3, 0}) {
    SCOPED_TRACE("mix_run_pieces " + std::to_string(run));
    TempDir dir;
    auto pool = MakePool(3, 12 * 64 * kKiB);
    PinnedBuffer old_bytes = pool->Acquire(), new_bytes = pool->Acquire(), back = pool->Acquire();
    const int64_t n = old_bytes.size();
    FillRandom(old_bytes.data(), n, 7);
    FillRandom(new_bytes.data(), n, 8);
    IoEngineOptions o;
    o.kind = EngineKind::kUring;
    o.queue_depth = 1;  // one piece in flight: completions come in issue order
    o.block_size_bytes = 64 * kKiB;
    o.mix_run_pieces = run;
    {
      auto plain = CreateIoEngine(o);
      if (!plain.ok()) GTEST_SKIP() << "no io_uring here: " << plain.status().ToString();
      auto f = (*plain)->OpenFile(dir.File("data"), OpenOptions{true, true, false});
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_TRUE((*plain)->Write(*f, 0, old_bytes.data(), n).ok());
    }
    auto recorder = std::make_shared<OrderRecorder>();
    o.completion_hook = recorder;
    auto e = CreateIoEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    auto f = (*e)->OpenFile(dir.File("data"), OpenOptions{});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    // 12 pieces written past the old bytes; while the first is held, the
    // old bytes read back.
    auto w = (*e)->Submit(IoOp::kWrite, std::vector<IoSegment>{{*f, n, n, new_bytes.data()}});
    ASSERT_TRUE(w.ok());
    recorder->WaitHeld();
    auto r = (*e)->Submit(IoOp::kRead, std::vector<IoSegment>{{*f, 0, n, back.data()}});
    ASSERT_TRUE(r.ok());
    recorder->Open();
    ASSERT_TRUE((*e)->Wait(*w).ok());
    Status read = (*e)->Wait(*r);
    ASSERT_TRUE(read.ok()) << read.ToString();
    EXPECT_EQ(recorder->order(), run == 3 ? "WWWRRRWWWRRRWWWRRRWWWRRR" : "WWWWWWWWWWWWRRRRRRRRRRRR");
    EXPECT_EQ(std::memcmp(back.data(), old_bytes.data(), static_cast<size_t>(n)), 0);
    ASSERT_TRUE((*e)->Read(*f, n, back.data(), n).ok());
    EXPECT_EQ(std::memcmp(back.data(), new_bytes.data(), static_cast<size_t>(n)), 0);
  }
}

// QueueClock charges each stretch between changes to the state that held
// during it: reads only, writes only, both, and full at queue_depth.
TEST(EngineQueueTime, ClockChargesEachStretchToItsState) {
  QueueClock clock(/*queue_depth=*/2, /*now_ns=*/100);
  clock.Change(IoOp::kRead, +1, 110);    // 10 ns idle: not counted
  clock.Change(IoOp::kRead, +1, 130);    // 20 ns one read
  clock.Change(IoOp::kWrite, +1, 170);   // 40 ns two reads (full)
  clock.Change(IoOp::kRead, -2, 250);    // 80 ns reads and a write (full)
  clock.Change(IoOp::kWrite, -1, 410);   // 160 ns one write
  clock.Change(IoOp::kWrite, +1, 1000);  // idle again
  const IoQueueTime t = clock.time();
  EXPECT_EQ(t.read_only_ns, 60);
  EXPECT_EQ(t.mixed_ns, 80);
  EXPECT_EQ(t.write_only_ns, 160);
  EXPECT_EQ(t.full_ns, 120);
  EXPECT_EQ(t.busy_ns(), 300);
  const IoQueueTime d = t - IoQueueTime{10, 20, 30, 40};
  EXPECT_EQ(d.read_only_ns, 50);
  EXPECT_EQ(d.write_only_ns, 140);
  EXPECT_EQ(d.mixed_ns, 50);
  EXPECT_EQ(d.full_ns, 80);
}

// A ring counts the time its pieces were in flight, by direction: a read
// alone shows as reads only, with the queue full while more pieces than
// queue_depth wait. The posix engine keeps no queue and reports none.
TEST(EngineQueueTime, RingCountsTimeInFlightByDirection) {
  TempDir dir;
  auto pool = MakePool(1, 12 * 64 * kKiB);
  PinnedBuffer buf = pool->Acquire();
  FillRandom(buf.data(), buf.size(), 9);
  for (const EngineKind kind : {EngineKind::kUring, EngineKind::kPosix}) {
    IoEngineOptions o;
    o.kind = kind;
    o.queue_depth = 2;
    o.block_size_bytes = 64 * kKiB;  // 12 pieces
    auto e = CreateIoEngine(o);
    if (!e.ok() && kind == EngineKind::kUring) GTEST_SKIP() << "no io_uring here: " << e.status().ToString();
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    auto f = (*e)->OpenFile(dir.File("data"), OpenOptions{true, true, false});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE((*e)->Write(*f, 0, buf.data(), buf.size()).ok());
    const IoQueueTime written = (*e)->queue_time();
    ASSERT_TRUE((*e)->Read(*f, 0, buf.data(), buf.size()).ok());
    const IoQueueTime read = (*e)->queue_time() - written;
    if (kind == EngineKind::kPosix) {
      EXPECT_EQ(written.busy_ns() + written.full_ns + read.busy_ns() + read.full_ns, 0);
      continue;
    }
    EXPECT_GT(written.write_only_ns, 0);
    EXPECT_EQ(written.read_only_ns + written.mixed_ns, 0);
    EXPECT_GT(read.read_only_ns, 0);
    EXPECT_EQ(read.write_only_ns + read.mixed_ns, 0);
    EXPECT_GT(read.full_ns, 0);
    EXPECT_LE(read.full_ns, read.busy_ns());
  }
}

TEST(EngineCreate, FallsBackToPosixWhenUringIsRefused) {
  IoEngineOptions o;
  o.simulate_uring_unavailable = true;
  auto e = CreateIoEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->name(), "posix");
  o.kind = EngineKind::kUring;
  e = CreateIoEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnavailable);
}

TEST(EngineCreate, RejectsBadOptionsNamingTheKey) {
  IoEngineOptions o;
  o.block_size_bytes = 1000;
  auto e = CreateIoEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("aio.block_size"), std::string::npos);
  o = IoEngineOptions{};
  o.queue_depth = 0;
  EXPECT_NE(CreateIoEngine(o).status().message().find("aio.queue_depth"), std::string::npos);
  o = IoEngineOptions{};
  o.thread_count = 0;
  EXPECT_NE(CreateIoEngine(o).status().message().find("aio.thread_count"), std::string::npos);
}

TEST(EngineCreate, FromAioConfigCarriesEveryKnob) {
  AioConfig c;
  c.block_size = 256 * 1024;
  c.queue_depth = 32;
  c.thread_count = 3;
  c.single_submit = true;
  c.overlap_events = false;
  const IoEngineOptions o = FromAioConfig(c);
  EXPECT_EQ(o.block_size_bytes, 256 * 1024);
  EXPECT_EQ(o.queue_depth, 32);
  EXPECT_EQ(o.thread_count, 3);
  EXPECT_TRUE(o.single_submit);
  EXPECT_FALSE(o.overlap_events);
}

TEST(EngineLimits, MaxRequestsIsABoundNotAnAllocation) {
  TempDir dir;
  IoEngineOptions o;
  o.kind = EngineKind::kUring;
  o.max_requests = 4;
  auto e = CreateIoEngine(o);
  ASSERT_TRUE(e.ok());
  auto f = (*e)->OpenFile(dir.File("x"), OpenOptions{true, true, false});
  ASSERT_TRUE(f.ok());
  auto pool = MakePool(5, 4096);
  std::vector<PinnedBuffer> bufs;
  std::vector<IoTicket> tickets;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(pool->Acquire());
    auto t = (*e)->Submit(IoOp::kWrite, IoSegment{*f, i * 4096, 4096, bufs.back().data()});
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  bufs.push_back(pool->Acquire());
  auto t = (*e)->Submit(IoOp::kWrite, IoSegment{*f, 4 * 4096, 4096, bufs.back().data()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE((*e)->Wait(tickets[0]).ok());
  t = (*e)->Submit(IoOp::kWrite, IoSegment{*f, 4 * 4096, 4096, bufs.back().data()});
  EXPECT_TRUE(t.ok());
  EXPECT_TRUE((*e)->WaitAll().ok());
}

TEST(EngineRegistration, PoolMemoryBecomesFixedBuffers) {
  IoEngineOptions o;
  o.kind = EngineKind::kUring;
  auto e = UringEngine::Create(o);
  ASSERT_TRUE(e.ok());
  auto pool = MakePool(2, 1 * kMiB);
  auto region = pool->region();
  ASSERT_TRUE((*e)->RegisterMemory(region.data(), region.size()).ok());
  if (!(*e)->buffers_registered()) GTEST_SKIP() << "the kernel refused fixed buffers (RLIMIT_MEMLOCK?)";
  EXPECT_TRUE((*e)->files_registered());
  TempDir dir;
  auto f = (*e)->OpenFile(dir.File("x"), OpenOptions{true, true, false});
  ASSERT_TRUE(f.ok());
  PinnedBuffer a = pool->Acquire(), b = pool->Acquire();
  FillRandom(a.data(), a.size(), 5);
  ASSERT_TRUE((*e)->Write(*f, 0, a.data(), a.size()).ok());
  ASSERT_TRUE((*e)->Read(*f, 0, b.data(), b.size()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
}

TEST(EngineDirectIo, RefusedDirectIoFallsBackOrFailsAsAsked) {
  // /dev/shm is tmpfs; newer kernels accept O_DIRECT there, older refuse it.
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir unused;
  const std::string path = "/dev/shm/zinf-aio-test-" + std::to_string(::getpid());
  IoEngineOptions o;
  o.kind = EngineKind::kPosix;
  o.direct_io = DirectIo::kOff;
  auto e = CreateIoEngine(o);
  ASSERT_TRUE(e.ok());
  auto f = (*e)->OpenFile(path, OpenOptions{true, true, false});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE((*e)->file_info(*f).direct);
  EXPECT_GE((*e)->file_info(*f).alignment_bytes, 512);
  ASSERT_TRUE((*e)->CloseFile(*f).ok());
  o.direct_io = DirectIo::kRequire;
  e = CreateIoEngine(o);
  f = (*e)->OpenFile(path, OpenOptions{true, false, false});
  if (f.ok()) {
    EXPECT_TRUE((*e)->file_info(*f).direct);
  } else {
    EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(f.status().message().find("O_DIRECT"), std::string::npos);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace zinf::aio
