#include "swap/swap_store.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/crc32c.h"
#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::CorruptFile;
using testing::FillRandom;
using testing::MakeEngine;
using testing::MakeFaultyEngine;
using testing::MakePool;
using testing::TempDir;

constexpr int64_t kStripe = 64 << 10;

std::vector<TensorSpec> SomeTensors() {
  // Sizes that are not multiples of the stripe or the alignment, one smaller
  // than a block, one spanning many stripes.
  return {{"master/sg0", 300'000, 4}, {"exp_avg/sg0", 300'000, 4}, {"tiny", 10, 1}, {"big", 1'000'003, 2}};
}

SwapStoreOptions Options(const TempDir& dir, int paths) {
  SwapStoreOptions o;
  for (int i = 0; i < paths; ++i) o.paths.push_back(dir.Sub("nvme" + std::to_string(i)));
  o.stripe_bytes = kStripe;
  o.run_id = "test-run";
  return o;
}

class SwapStoreRoundTrip : public ::testing::TestWithParam<std::tuple<int, aio::EngineKind>> {};

TEST_P(SwapStoreRoundTrip, ManyOutstandingFromOneThread) {
  const auto [paths, kind] = GetParam();
  TempDir dir;
  auto engine = MakeEngine(kind);
  ASSERT_TRUE(engine);
  auto store_or = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, paths));
  ASSERT_TRUE(store_or.ok()) << store_or.status().ToString();
  SwapStore& store = **store_or;
  ASSERT_EQ(store.file_paths().size(), static_cast<size_t>(paths));

  const int n = store.tensor_count();
  auto pool = MakePool(2 * n, store.PaddedBytes(1'000'003));
  std::vector<aio::PinnedBuffer> out, in;
  std::vector<SwapHandle> handles;
  for (int i = 0; i < n; ++i) {
    out.push_back(pool->Acquire());
    FillRandom(out.back().data(), static_cast<size_t>(store.tensor(i).size_bytes), 100 + i);
    auto h = store.SwapOut(i, out.back().data());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handles.push_back(*h);
  }
  // Wait in reverse order: handles are independent.
  for (int i = n - 1; i >= 0; --i) ASSERT_TRUE(store.Wait(handles[static_cast<size_t>(i)]).ok());
  handles.clear();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(store.IsWritten(i));
    in.push_back(pool->Acquire());
    std::memset(in.back().data(), 0, static_cast<size_t>(in.back().size()));
    auto h = store.SwapIn(i, in.back().data());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handles.push_back(*h);
  }
  ASSERT_TRUE(store.WaitAll().ok());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(in[static_cast<size_t>(i)].data(), out[static_cast<size_t>(i)].data(),
                          static_cast<size_t>(store.tensor(i).size_bytes)),
              0)
        << store.tensor(i).name;
  }
}

INSTANTIATE_TEST_SUITE_P(PathsAndEngines, SwapStoreRoundTrip,
                         ::testing::Combine(::testing::Values(1, 3),
                                            ::testing::Values(aio::EngineKind::kAuto, aio::EngineKind::kPosix)));

TEST(SwapStore, RangesRoundTripAndUnwrittenRangesAreRefused) {
  TempDir dir;
  auto engine = MakeEngine();
  auto store = SwapStore::Create(engine.get(), {{"t", 5 * kStripe + 100, 4}}, Options(dir, 3));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto pool = MakePool(2, 8 * kStripe);
  aio::PinnedBuffer a = pool->Acquire(), b = pool->Acquire();
  FillRandom(a.data(), 5 * kStripe + 100, 7);
  // Only the tail first: the head stays unreadable.
  auto h = (*store)->SwapOutRange(0, 4 * kStripe, kStripe + 100, a.data() + 4 * kStripe);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*store)->Wait(*h).ok());
  EXPECT_FALSE((*store)->IsWritten(0));
  auto bad = (*store)->SwapIn(0, b.data());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition) << bad.status().ToString();
  // Misaligned ranges are refused.
  EXPECT_EQ((*store)->SwapOutRange(0, 100, kStripe, a.data()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->SwapOutRange(0, 0, kStripe + 1, a.data()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->SwapOut(0, a.data() + 8).status().code(), StatusCode::kInvalidArgument);

  h = (*store)->SwapOutRange(0, 0, 4 * kStripe, a.data());
  ASSERT_TRUE(h.ok() && (*store)->Wait(*h).ok());
  EXPECT_TRUE((*store)->IsWritten(0));
  auto r = (*store)->SwapIn(0, b.data());
  ASSERT_TRUE(r.ok() && (*store)->Wait(*r).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 5 * kStripe + 100), 0);
}

TEST(SwapStore, ChecksumMismatchIsCorruptionNamingFileOffsetAndTensor) {
  TempDir dir;
  auto engine = MakeEngine();
  auto store = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, 3));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  SwapStore& s = **store;
  auto pool = MakePool(2, s.PaddedBytes(1'000'003));
  aio::PinnedBuffer a = pool->Acquire(), b = pool->Acquire();
  const TensorId big = *s.Find("big");
  FillRandom(a.data(), 1'000'003, 1);
  auto h = s.SwapOut(big, a.data());
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());

  // Flip a byte in the third extent of "big": stripe unit (first + 2) on file
  // (first + 2) % 3. Find it by scanning: exactly one extent must fail.
  bool corrupted = false;
  for (const std::string& f : s.file_paths()) {
    if (corrupted) break;
    // Every file's data starts after one alignment block; "big" follows
    // three tensors of 5 + 5 + 1 stripes, so its units start at 11.
    const int64_t unit = 11 + 2;
    if (f != s.file_paths()[unit % 3]) continue;
    CorruptFile(f, s.alignment_bytes() + (unit / 3) * kStripe + 123);
    corrupted = true;
  }
  ASSERT_TRUE(corrupted);
  auto r = s.SwapIn(big, b.data());
  ASSERT_TRUE(r.ok());
  Status st = s.Wait(*r);
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find(s.file_paths()[13 % 3]), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offset " + std::to_string(s.alignment_bytes() + (13 / 3) * kStripe)), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("'big'"), std::string::npos) << st.message();
  // Other tensors are unaffected.
  const TensorId tiny = *s.Find("tiny");
  h = s.SwapOut(tiny, a.data());
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());
  r = s.SwapIn(tiny, b.data());
  ASSERT_TRUE(r.ok() && s.Wait(*r).ok());
}

// A caller that took the crcs while making the bytes hands them over: the
// store records them as given (it does not sum the bytes again), so the
// right ones read back clean and a wrong one is found at the swap-in, in
// its extent alone.
TEST(SwapStore, ChecksumsTheCallerTookAreRecordedAsGiven) {
  TempDir dir;
  auto engine = MakeEngine();
  auto store = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, 2));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  SwapStore& s = **store;
  auto pool = MakePool(2, s.PaddedBytes(1'000'003));
  aio::PinnedBuffer a = pool->Acquire(), b = pool->Acquire();
  const TensorId big = *s.Find("big");
  const int64_t padded = s.PaddedBytes(1'000'003);
  ASSERT_EQ(s.extent_count(big), (padded + kStripe - 1) / kStripe);
  FillRandom(a.data(), padded, 2);
  std::vector<uint32_t> crcs;
  for (int64_t e = 0; e < s.extent_count(big); ++e) {
    crcs.push_back(Crc32c(a.data() + e * kStripe, static_cast<size_t>(std::min(kStripe, padded - e * kStripe))));
  }
  auto h = s.SwapOut(big, a.data(), crcs.data());
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());
  auto r = s.SwapIn(big, b.data());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(s.Wait(*r).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(padded)), 0);

  crcs[5] ^= 1u;  // not the bytes' crc
  h = s.SwapOut(big, a.data(), crcs.data());
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());
  r = s.SwapIn(big, b.data());
  ASSERT_TRUE(r.ok());
  Status st = s.Wait(*r);
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("tensor bytes from " + std::to_string(5 * kStripe) + ";"), std::string::npos)
      << st.message();
  EXPECT_EQ(s.SwapOut(big, a.data(), nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwapStore, StaleFilesFromAnotherLayoutAreRefusedOrReplaced) {
  TempDir dir;
  auto engine = MakeEngine();
  auto pool = MakePool(1, 1 << 20);
  {
    auto first = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, 2));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    aio::PinnedBuffer a = pool->Acquire();
    FillRandom(a.data(), 300'000, 3);
    auto h = (*first)->SwapOut(0, a.data());
    ASSERT_TRUE(h.ok() && (*first)->Wait(*h).ok());
  }
  std::vector<TensorSpec> other = SomeTensors();
  other[0].size_bytes += kStripe;  // another layout

  SwapStoreOptions refuse = Options(dir, 2);
  refuse.stale_policy = StalePolicy::kRefuse;
  auto refused = SwapStore::Create(engine.get(), other, refuse);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("another layout"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("zinf.0.swp"), std::string::npos) << refused.status().message();

  // Another run with the same layout is stale too.
  SwapStoreOptions other_run = refuse;
  other_run.run_id = "another-run";
  auto refused_run = SwapStore::Create(engine.get(), SomeTensors(), other_run);
  ASSERT_FALSE(refused_run.ok());
  EXPECT_NE(refused_run.status().message().find("another run"), std::string::npos);

  // The same layout and run reuses the files, but never serves old bytes.
  auto same = SwapStore::Create(engine.get(), SomeTensors(), refuse);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  aio::PinnedBuffer b = pool->Acquire();
  EXPECT_EQ((*same)->SwapIn(0, b.data()).status().code(), StatusCode::kFailedPrecondition);
  same->reset();

  // kReplace makes new files.
  auto replaced = SwapStore::Create(engine.get(), other, Options(dir, 2));
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ((*replaced)->SwapIn(0, b.data()).status().code(), StatusCode::kFailedPrecondition);
}

// Two runs on one swap path: the second would replace the first's files as
// stale. It is refused, per rank, naming the holder's pid; the path is free
// again once the lock is gone.
TEST(SwapStore, SwapDirectoryIsLockedForOneRun) {
  TempDir dir;
  const std::string path = dir.Sub("nvme0");  // created by the lock
  auto first = LockSwapDirectory(path, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = LockSwapDirectory(path, 0);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find("swap directory " + path + " is in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("process " + std::to_string(::getpid())), std::string::npos) << msg;
  EXPECT_TRUE(LockSwapDirectory(path, 1).ok());  // another rank of the same run
  // The lock file is no swap file: a store on the path ignores it.
  auto engine = MakeEngine();
  SwapStoreOptions o = Options(dir, 1);
  o.stale_policy = StalePolicy::kRefuse;
  EXPECT_TRUE(SwapStore::Create(engine.get(), SomeTensors(), o).ok());
  *first = FileLock();
  EXPECT_TRUE(LockSwapDirectory(path, 0).ok());
}

TEST(SwapStore, FileThatIsNotASwapFileIsRefused) {
  TempDir dir;
  ASSERT_TRUE(MakeDirectories(dir.Sub("nvme0")).ok());
  {
    FILE* f = std::fopen((dir.Sub("nvme0") + "/zinf.0.swp").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::vector<char> junk(8192, 'x');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  auto engine = MakeEngine();
  SwapStoreOptions o = Options(dir, 1);
  o.stale_policy = StalePolicy::kRefuse;
  auto s = SwapStore::Create(engine.get(), SomeTensors(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a zinf swap file"), std::string::npos) << s.status().message();
}

TEST(SwapStore, NotEnoughSpaceIsFoundAtStartNamingEveryPath) {
  TempDir dir;
  auto engine = MakeEngine();
  // Far more than any test machine has: refused before anything is allocated.
  SwapStoreOptions o = Options(dir, 2);
  o.stripe_bytes = int64_t{1} << 30;
  auto s = SwapStore::Create(engine.get(), {{"huge", int64_t{1} << 50, 4}}, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNoSpace) << s.status().ToString();
  EXPECT_NE(s.status().message().find("needs"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("free"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find(dir.Sub("nvme1")), std::string::npos) << s.status().message();
}

TEST(SwapStore, FullDiskAtPreallocationIsNoSpaceNamingTheFile) {
  // RLIMIT_FSIZE makes fallocate past the limit fail with EFBIG, as a full
  // disk fails with ENOSPC: both are kNoSpace.
  TempDir dir;
  auto engine = MakeEngine();
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old), 0);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto s = SwapStore::Create(engine.get(), {{"t", 4 << 20, 4}}, Options(dir, 1));
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &old, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNoSpace) << s.status().ToString();
  EXPECT_NE(s.status().message().find("preallocating swap file"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("zinf.0.swp"), std::string::npos) << s.status().message();
  // No half-made file is left under the final name.
  EXPECT_FALSE(PathExists(dir.Sub("nvme0") + "/zinf.0.swp"));
}

TEST(SwapStore, RetryableFaultsNeverChangeTheBytes) {
  // EAGAIN, EINTR, short transfers and delays are handled below the store:
  // every transfer succeeds with the right bytes.
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    TempDir dir;
    aio::FaultOptions f;
    f.seed = seed;
    f.eagain_rate = 0.1;
    f.eintr_rate = 0.1;
    f.short_rate = 0.2;
    f.delay_rate = 0.1;
    auto engine = MakeFaultyEngine(f);
    auto store = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, 3));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto pool = MakePool(2, (*store)->PaddedBytes(1'000'003));
    aio::PinnedBuffer a = pool->Acquire(), b = pool->Acquire();
    for (int i = 0; i < (*store)->tensor_count(); ++i) {
      const auto n = static_cast<size_t>((*store)->tensor(i).size_bytes);
      FillRandom(a.data(), n, seed * 10 + i);
      auto h = (*store)->SwapOut(i, a.data());
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE((*store)->Wait(*h).ok());
      auto r = (*store)->SwapIn(i, b.data());
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE((*store)->Wait(*r).ok());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), n), 0);
    }
    EXPECT_GT(engine->injector().counts().total(), 0);
  }
}

TEST(SwapStore, InjectedFailuresEndInClearErrorsNeverGarbage) {
  // EIO and torn writes, on swap-out and swap-in: every transfer either
  // moves the right bytes or fails with an error naming what failed; the
  // caller's buffers are not touched by a failed swap-out; after the first
  // error the engine is sticky and the store refuses further work.
  int failures = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    TempDir dir;
    aio::FaultOptions f;
    f.seed = seed;
    f.eio_rate = 0.03;
    f.torn_write_rate = 0.05;
    auto engine = MakeFaultyEngine(f);
    engine->injector().set_enabled(false);  // creating the files is not the test here
    auto store = SwapStore::Create(engine.get(), SomeTensors(), Options(dir, 3));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    engine->injector().set_enabled(true);
    SwapStore& s = **store;
    auto pool = MakePool(3, s.PaddedBytes(1'000'003));
    aio::PinnedBuffer a = pool->Acquire(), copy = pool->Acquire(), b = pool->Acquire();
    bool failed = false;
    for (int round = 0; round < 3 && !failed; ++round) {
      for (int i = 0; i < s.tensor_count() && !failed; ++i) {
        const auto n = static_cast<size_t>(s.tensor(i).size_bytes);
        FillRandom(a.data(), n, seed * 100 + round * 10 + i);
        std::memcpy(copy.data(), a.data(), n);
        auto h = s.SwapOut(i, a.data());
        Status st = h.ok() ? s.Wait(*h) : h.status();
        EXPECT_EQ(std::memcmp(copy.data(), a.data(), n), 0) << "swap-out changed the caller's buffer";
        if (!st.ok()) {
          failed = true;
          EXPECT_NE(st.message().find(s.tensor(i).name), std::string::npos) << st.message();
          EXPECT_NE(st.message().find(".swp"), std::string::npos) << st.message();
          EXPECT_FALSE(s.IsWritten(i));
          break;
        }
        auto r = s.SwapIn(i, b.data());
        st = r.ok() ? s.Wait(*r) : r.status();
        if (!st.ok()) {
          failed = true;
          EXPECT_NE(st.message().find(s.tensor(i).name), std::string::npos) << st.message();
          break;
        }
        ASSERT_EQ(std::memcmp(a.data(), b.data(), n), 0) << "seed " << seed << ": garbage read back";
      }
    }
    if (failed) {
      ++failures;
      // Sticky: nothing more is accepted, and nothing unwritten is served.
      auto h = s.SwapOut(0, a.data());
      Status st = h.ok() ? s.Wait(*h) : h.status();
      EXPECT_FALSE(st.ok());
    }
  }
  EXPECT_GT(failures, 0) << "the fault rates injected nothing; raise them";
}

// The striping the swap files' format fixes (these tests came from the aio
// layer's StripedSpace, which tune aio used before it moved onto SwapStore):
// logical stripe unit u lives in file u % N at header + (u / N) * stripe.
TEST(SwapStore, ExtentsLandOnTheirStripesInEveryFile) {
  TempDir dir;
  auto engine = MakeEngine();
  // "head" takes units 0 and 1, so "body" starts at unit 2: not at file 0.
  auto store =
      SwapStore::Create(engine.get(), {{"head", kStripe + 100, 1}, {"body", 11 * kStripe + 4096, 1}}, Options(dir, 3));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  SwapStore& s = **store;
  auto pool = MakePool(1, s.PaddedBytes(12 * kStripe));
  aio::PinnedBuffer b = pool->Acquire();
  FillRandom(b.data(), static_cast<size_t>(b.size()), 9);
  const TensorId body = *s.Find("body");
  // A range from the second stripe of the tensor to its end, then its head.
  auto h = s.SwapOutRange(body, kStripe, 10 * kStripe + 4096, b.data() + kStripe);
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());
  h = s.SwapOutRange(body, 0, kStripe, b.data());
  ASSERT_TRUE(h.ok() && s.Wait(*h).ok());
  ASSERT_TRUE(s.IsWritten(body));

  std::vector<std::string> files;
  for (const std::string& path : s.file_paths()) {
    std::ifstream in(path, std::ios::binary);
    files.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(static_cast<int64_t>(files.back().size()), s.file_bytes()) << path;
  }
  const int64_t first_unit = 2;
  for (int64_t at = 0; at < 11 * kStripe + 4096; at += 4096) {
    const int64_t unit = first_unit + at / kStripe;
    const std::string& f = files[static_cast<size_t>(unit % 3)];
    const int64_t offset = s.alignment_bytes() + (unit / 3) * kStripe + at % kStripe;
    ASSERT_EQ(std::memcmp(f.data() + offset, b.data() + at, 4096), 0) << "tensor byte " << at;
  }
}

TEST(SwapStore, BadRangesAreRejectedNamingOffsetAndLength) {
  TempDir dir;
  auto engine = MakeEngine();
  auto store = SwapStore::Create(engine.get(), {{"t", 4 * kStripe, 4}}, Options(dir, 2));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto pool = MakePool(1, 5 * kStripe);
  aio::PinnedBuffer a = pool->Acquire();
  auto h = (*store)->SwapOutRange(0, 100, kStripe, a.data());
  ASSERT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("offset 100 length " + std::to_string(kStripe)), std::string::npos)
      << h.status().message();
  h = (*store)->SwapInRange(0, 3 * kStripe, 2 * kStripe, a.data());  // past the tensor's end
  ASSERT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      h.status().message().find("offset " + std::to_string(3 * kStripe) + " length " + std::to_string(2 * kStripe)),
      std::string::npos)
      << h.status().message();
  EXPECT_EQ((*store)->SwapOutRange(0, -kStripe, kStripe, a.data()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->SwapOut(1, a.data()).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwapStore, AnEioOnOnePathIsAnErrorNamingThatPathsFile) {
  TempDir dir;
  aio::FaultOptions f;
  f.eio_rate = 1.0;
  f.path_filter = "nvme1";
  auto engine = MakeFaultyEngine(f);
  engine->injector().set_enabled(false);
  auto store = SwapStore::Create(engine.get(), {{"t", 6 * kStripe, 4}}, Options(dir, 3));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  engine->injector().set_enabled(true);
  auto pool = MakePool(1, 6 * kStripe);
  aio::PinnedBuffer a = pool->Acquire();
  FillRandom(a.data(), 6 * kStripe, 4);
  auto h = (*store)->SwapOut(0, a.data());
  Status st = h.ok() ? (*store)->Wait(*h) : h.status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find((*store)->file_paths()[1]), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("'t'"), std::string::npos) << st.ToString();
  EXPECT_FALSE((*store)->IsWritten(0));
}

TEST(SwapStore, RejectsBadOptionsAndCreatesMissingDirectories) {
  TempDir dir;
  auto engine = MakeEngine();
  SwapStoreOptions o = Options(dir, 1);
  o.paths = {};
  EXPECT_EQ(SwapStore::Create(engine.get(), SomeTensors(), o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir, 1);
  o.stripe_bytes = 1000;
  auto bad = SwapStore::Create(engine.get(), SomeTensors(), o);
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("stripe_bytes"), std::string::npos) << bad.status().message();
  o = Options(dir, 1);
  o.alignment_bytes = 1000;
  bad = SwapStore::Create(engine.get(), SomeTensors(), o);
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("alignment_bytes"), std::string::npos) << bad.status().message();
  o = Options(dir, 1);
  o.max_outstanding = 0;
  EXPECT_EQ(SwapStore::Create(engine.get(), SomeTensors(), o).status().code(), StatusCode::kInvalidArgument);
  // A path that does not exist yet is made (nested), as training's are.
  o = Options(dir, 1);
  o.paths = {dir.Sub("not/yet")};
  auto made = SwapStore::Create(engine.get(), SomeTensors(), o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(PathExists(dir.Sub("not/yet") + "/zinf.0.swp"));
}

TEST(SwapStore, MaxOutstandingIsABoundAndAWaitFreesASlot) {
  TempDir dir;
  auto engine = MakeEngine();
  SwapStoreOptions o = Options(dir, 2);
  o.max_outstanding = 2;
  auto store = SwapStore::Create(engine.get(), SomeTensors(), o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  SwapStore& s = **store;
  auto pool = MakePool(3, s.PaddedBytes(1'000'003));
  aio::PinnedBuffer a = pool->Acquire(), b = pool->Acquire(), c = pool->Acquire();
  auto h0 = s.SwapOut(0, a.data());
  auto h1 = s.SwapOut(1, b.data());
  ASSERT_TRUE(h0.ok() && h1.ok());
  auto refused = s.SwapOut(2, c.data());
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("max_outstanding"), std::string::npos) << refused.status().message();
  ASSERT_TRUE(s.Wait(*h0).ok());
  auto h2 = s.SwapOut(2, c.data());
  ASSERT_TRUE(h2.ok()) << h2.status().ToString();
  EXPECT_NE(h2->id, h0->id) << "a reused slot must not hand out the spent handle again";
  EXPECT_TRUE(s.WaitAll().ok());
  EXPECT_TRUE(s.IsWritten(0) && s.IsWritten(1) && s.IsWritten(2));
}

TEST(SwapStore, HeaderEncodesAndDecodes) {
  SwapFileHeader h;
  h.header_bytes = 4096;
  h.file_index = 2;
  h.file_count = 3;
  h.data_bytes = 123456789;
  h.logical_bytes = 987654321;
  h.stripe_bytes = 1 << 20;
  h.tensor_count = 7;
  h.element_size_bytes = 4;
  h.layout_hash = 0x1234567890abcdefull;
  h.run_id = "run-42";
  char buf[SwapFileHeader::kEncodedBytes];
  h.Encode(buf);
  auto d = SwapFileHeader::Decode(buf, sizeof(buf), "f");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->layout_hash, h.layout_hash);
  EXPECT_EQ(d->run_id, h.run_id);
  EXPECT_EQ(d->data_bytes, h.data_bytes);
  buf[30] ^= 1;
  EXPECT_EQ(SwapFileHeader::Decode(buf, sizeof(buf), "f").status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace zinf::swap
