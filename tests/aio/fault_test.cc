// Every fault the injector makes ends in the right bytes or a clear error --
// never in wrong bytes reported as success.
#include "aio/fault_engine.h"

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aio/aio_test_util.h"
#include "aio/pinned_pool.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

using testing::FillRandom;
using testing::TempDir;

constexpr int64_t kChunk = 256 * kKiB;
constexpr int kChunks = 24;

IoEngineOptions Inner(EngineKind kind) {
  IoEngineOptions o;
  o.kind = kind;
  o.thread_count = 2;
  o.queue_depth = 8;
  o.block_size_bytes = 64 * kKiB;
  return o;
}

class FaultTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    PinnedPoolOptions po;
    po.buffer_count = 2 * kChunks;
    po.buffer_bytes = kChunk;
    auto pool = PinnedPool::Create(po);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(pool).value();
    for (int i = 0; i < kChunks; ++i) {
      out_.push_back(pool_->Acquire());
      in_.push_back(pool_->Acquire());
      FillRandom(out_[i].data(), kChunk, 1000 + i);
    }
  }
  void TearDown() override {
    out_.clear();
    in_.clear();
  }

  std::unique_ptr<FaultyEngine> Make(const FaultOptions& f) {
    auto e = FaultyEngine::Create(Inner(GetParam()), f);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(e).value();
  }

  // Writes every chunk, then reads every chunk, all outstanding at once.
  // Returns the first error; `ok_reads` counts chunks read back without error.
  Status WriteThenRead(IoEngine& e, FileId f, int* ok_reads) {
    std::vector<IoTicket> t;
    for (int i = 0; i < kChunks; ++i) {
      auto s = e.Submit(IoOp::kWrite, IoSegment{f, i * kChunk, kChunk, out_[i].data()});
      if (!s.ok()) return s.status();
      t.push_back(*s);
    }
    Status first;
    for (IoTicket x : t) {
      Status st = e.Wait(x);
      if (first.ok()) first = st;
    }
    if (!first.ok()) return first;
    t.clear();
    for (int i = 0; i < kChunks; ++i) {
      std::memset(in_[i].data(), 0xAB, kChunk);
      auto s = e.Submit(IoOp::kRead, IoSegment{f, i * kChunk, kChunk, in_[i].data()});
      if (!s.ok()) return s.status();
      t.push_back(*s);
    }
    *ok_reads = 0;
    for (int i = 0; i < kChunks; ++i) {
      Status st = e.Wait(t[i]);
      if (st.ok()) {
        ++*ok_reads;
        // The core promise: a read that reports success has the right bytes.
        EXPECT_EQ(std::memcmp(in_[i].data(), out_[i].data(), kChunk), 0) << "chunk " << i;
      } else if (first.ok()) {
        first = st;
      }
    }
    return first;
  }

  TempDir dir_;
  std::unique_ptr<PinnedPool> pool_;
  std::vector<PinnedBuffer> out_, in_;
};

TEST_P(FaultTest, RecoverableFaultsEndInTheRightBytes) {
  FaultOptions f;
  f.seed = 7;
  f.eagain_rate = 0.15;
  f.eintr_rate = 0.1;
  f.short_rate = 0.2;
  f.delay_rate = 0.2;
  auto e = Make(f);
  auto file = e->OpenFile(dir_.File("x"), OpenOptions{true, true, false});
  ASSERT_TRUE(file.ok());
  int ok_reads = 0;
  Status st = WriteThenRead(*e, *file, &ok_reads);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ok_reads, kChunks);
  const FaultCounts c = e->injector().counts();
  EXPECT_GT(c.eagain, 0);
  EXPECT_GT(c.eintr, 0);
  EXPECT_GT(c.short_io, 0);
  EXPECT_GT(c.delayed, 0);
  EXPECT_TRUE(e->sticky_error().ok());
}

TEST_P(FaultTest, EioFailsTheRequestNamingFileOffsetLengthAndSticks) {
  FaultOptions f;
  f.seed = 3;
  f.eio_rate = 0.03;
  f.short_rate = 0.1;
  auto e = Make(f);
  auto file = e->OpenFile(dir_.File("x"), OpenOptions{true, true, false});
  ASSERT_TRUE(file.ok());
  int ok_reads = -1;
  // Checks every successful read's bytes. The posix engine fails inside
  // Submit, so the loop may stop at the next (refused) Submit instead.
  ASSERT_FALSE(WriteThenRead(*e, *file, &ok_reads).ok());
  EXPECT_GT(e->injector().counts().eio, 0);
  const Status st = e->sticky_error();
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_EQ(st.sys_errno(), EIO);
  EXPECT_NE(st.message().find(dir_.File("x")), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(" offset "), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(" length "), std::string::npos) << st.ToString();
  auto t = e->Submit(IoOp::kRead, IoSegment{*file, 0, kChunk, in_[0].data()});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kAborted);
}

TEST_P(FaultTest, RetriesAreBounded) {
  FaultOptions f;
  f.eagain_rate = 1.0;
  auto e = Make(f);
  auto file = e->OpenFile(dir_.File("x"), OpenOptions{true, true, false});
  ASSERT_TRUE(file.ok());
  Status st = e->Write(*file, 0, out_[0].data(), 4096);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gave up after"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.sys_errno(), EAGAIN);
}

TEST_P(FaultTest, TornWriteIsReportedAndLeavesOnlyOldOrNewBytes) {
  TempDir dir;
  const std::string path = dir.File("t");
  {
    // Old contents: chunk 1's bytes.
    auto plain = CreateIoEngine(Inner(GetParam()));
    ASSERT_TRUE(plain.ok());
    auto f = (*plain)->OpenFile(path, OpenOptions{true, true, false});
    ASSERT_TRUE((*plain)->Write(*f, 0, out_[1].data(), kChunk).ok());
    ASSERT_TRUE((*plain)->Sync(*f).ok());
  }
  FaultOptions fo;
  fo.seed = 11;
  fo.torn_write_rate = 1.0;
  auto e = Make(fo);
  auto f = e->OpenFile(path, OpenOptions{});
  ASSERT_TRUE(f.ok());
  Status st = e->Write(*f, 0, out_[0].data(), kChunk);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("torn write"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos);
  EXPECT_EQ(e->injector().counts().torn_writes, 1);
  EXPECT_EQ(e->Submit(IoOp::kRead, IoSegment{*f, 0, kChunk, in_[0].data()}).status().code(), StatusCode::kAborted);
  // Read back with a healthy engine: every block is the old or the new one,
  // new ones form a prefix.
  auto plain = CreateIoEngine(Inner(GetParam()));
  auto g = (*plain)->OpenFile(path, OpenOptions{});
  ASSERT_TRUE((*plain)->Read(*g, 0, in_[0].data(), kChunk).ok());
  bool in_new_prefix = true;
  const int64_t block = (*plain)->file_info(*g).alignment_bytes;  // tears happen at this granularity
  for (int64_t b = 0; b < kChunk; b += block) {
    const bool is_new = std::memcmp(in_[0].data() + b, out_[0].data() + b, block) == 0;
    const bool is_old = std::memcmp(in_[0].data() + b, out_[1].data() + b, block) == 0;
    ASSERT_TRUE(is_new || is_old) << "garbage at " << b;
    if (!is_new) in_new_prefix = false;
    if (is_new) {
      ASSERT_TRUE(in_new_prefix) << "new block after an old one at " << b;
    }
  }
}

TEST_P(FaultTest, CrashDropsWhatWasNotSynced) {
  FaultOptions fo;  // no faults but the crash
  auto e = Make(fo);
  const std::string path = dir_.File("c");
  auto f = e->OpenFile(path, OpenOptions{true, true, false});
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(e->Write(*f, 0, out_[0].data(), kChunk).ok());
  ASSERT_TRUE(e->Sync(*f).ok());
  ASSERT_TRUE(e->Write(*f, 4096, out_[1].data(), kChunk).ok());        // overlaps and extends
  ASSERT_TRUE(e->Write(*f, 3 * kChunk, out_[2].data(), kChunk).ok());  // past the end
  ASSERT_TRUE(e->Crash().ok());
  EXPECT_EQ(e->injector().counts().crash_dropped, 2);
  EXPECT_EQ(*e->FileSize(*f), kChunk);
  ASSERT_TRUE(e->Read(*f, 0, in_[0].data(), kChunk).ok());
  EXPECT_EQ(std::memcmp(in_[0].data(), out_[0].data(), kChunk), 0);
  // Synced data survives a second crash too, and new synced writes stick.
  ASSERT_TRUE(e->Write(*f, kChunk, out_[3].data(), kChunk).ok());
  ASSERT_TRUE(e->Sync(*f).ok());
  ASSERT_TRUE(e->Crash().ok());
  ASSERT_TRUE(e->Read(*f, kChunk, in_[1].data(), kChunk).ok());
  EXPECT_EQ(std::memcmp(in_[1].data(), out_[3].data(), kChunk), 0);
}

TEST_P(FaultTest, CrashThatKeepsOrTearsLeavesOnlyOldOrNewBlocks) {
  FaultOptions fo;
  fo.seed = 5;
  fo.crash_keep_rate = 0.3;
  fo.crash_tear_rate = 0.4;
  auto e = Make(fo);
  auto f = e->OpenFile(dir_.File("k"), OpenOptions{true, true, false});
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->Write(*f, i * kChunk, out_[i].data(), kChunk).ok());
  ASSERT_TRUE(e->Sync(*f).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->Write(*f, i * kChunk, out_[8 + i].data(), kChunk).ok());
  ASSERT_TRUE(e->Crash().ok());
  const FaultCounts c = e->injector().counts();
  EXPECT_EQ(c.crash_kept + c.crash_torn + c.crash_dropped, 8);
  const int64_t block = e->file_info(*f).alignment_bytes;  // tears happen at this granularity
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(e->Read(*f, i * kChunk, in_[i].data(), kChunk).ok());
    for (int64_t b = 0; b < kChunk; b += block) {
      const bool is_old = std::memcmp(in_[i].data() + b, out_[i].data() + b, block) == 0;
      const bool is_new = std::memcmp(in_[i].data() + b, out_[8 + i].data() + b, block) == 0;
      ASSERT_TRUE(is_old || is_new) << "chunk " << i << " block " << b;
    }
  }
}

TEST_P(FaultTest, TheSameSeedInjectsTheSameFaults) {
  auto run = [&](uint64_t seed) {
    FaultOptions f;
    f.seed = seed;
    f.eagain_rate = 0.1;
    f.short_rate = 0.1;
    f.delay_rate = 0.1;
    auto e = Make(f);
    TempDir d;
    auto file = e->OpenFile(d.File("s"), OpenOptions{true, true, false});
    int ok_reads = 0;
    EXPECT_TRUE(WriteThenRead(*e, *file, &ok_reads).ok());
    return e->injector().counts();
  };
  const FaultCounts a = run(99), b = run(99), c = run(100);
  EXPECT_EQ(a.eagain, b.eagain);
  EXPECT_EQ(a.short_io, b.short_io);
  EXPECT_EQ(a.delayed, b.delayed);
  EXPECT_TRUE(a.eagain != c.eagain || a.short_io != c.short_io || a.delayed != c.delayed);
}

TEST_P(FaultTest, PathFilterAndDisableLimitWhereFaultsGo) {
  FaultOptions f;
  f.eio_rate = 1.0;
  f.path_filter = "victim";
  auto e = Make(f);
  auto good = e->OpenFile(dir_.File("bystander"), OpenOptions{true, true, false});
  auto bad = e->OpenFile(dir_.File("victim"), OpenOptions{true, true, false});
  ASSERT_TRUE(good.ok() && bad.ok());
  EXPECT_TRUE(e->Write(*good, 0, out_[0].data(), kChunk).ok());
  e->injector().set_enabled(false);
  EXPECT_TRUE(e->Write(*bad, 0, out_[0].data(), kChunk).ok());
  e->injector().set_enabled(true);
  EXPECT_FALSE(e->Write(*bad, 0, out_[0].data(), kChunk).ok());
}

INSTANTIATE_TEST_SUITE_P(Engines, FaultTest, ::testing::Values(EngineKind::kUring, EngineKind::kPosix),
                         [](const ::testing::TestParamInfo<EngineKind>& p) {
                           return std::string(EngineKindName(p.param) == "io_uring" ? "uring" : "posix");
                         });

TEST(FaultHash, IsUniformEnoughAndDeterministic) {
  EXPECT_EQ(FaultHash(1, {2, 3}), FaultHash(1, {2, 3}));
  EXPECT_NE(FaultHash(1, {2, 3}), FaultHash(1, {3, 2}));
  int below = 0;
  for (uint64_t i = 0; i < 10000; ++i) below += FaultHash(17, {i}) < 0.25;
  EXPECT_GT(below, 2200);
  EXPECT_LT(below, 2800);
}

}  // namespace
}  // namespace zinf::aio
