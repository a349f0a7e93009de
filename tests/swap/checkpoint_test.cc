#include "swap/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <limits>
#include <map>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::CorruptFile;
using testing::FillRandom;
using testing::MakeEngine;
using testing::MakeFaultyEngine;
using testing::MakePool;
using testing::RandomBytes;
using testing::TempDir;

constexpr int64_t kPoolBuffer = 256 << 10;

// A rank's state as opaque blobs: sizes that are not multiples of anything.
struct State {
  std::vector<std::byte> master, exp_avg, scaler;
  std::map<std::string, std::string> meta;
  explicit State(uint64_t seed)
      : master(RandomBytes(700'001, seed)), exp_avg(RandomBytes(300'000, seed + 1)), scaler(RandomBytes(24, seed + 2)) {
    meta = {{"step", std::to_string(seed)}, {"config", "{\"zero_optimization\": {\"stage\": 3}}"}};
  }
  std::vector<BlobRef> Refs() {
    return {BlobRef::Ram("master", std::span<std::byte>(master)),
            BlobRef::Ram("exp_avg", std::span<std::byte>(exp_avg)),
            BlobRef::Ram("loss_scaler", std::span<std::byte>(scaler))};
  }
};

// Loads `dir` into fresh buffers and checks it equals `want`.
void ExpectLoads(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& dir, const State& want) {
  State got(999);
  auto meta = LoadCheckpoint(engine, pool, dir, got.Refs());
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(*meta, want.meta);
  EXPECT_EQ(got.master, want.master);
  EXPECT_EQ(got.exp_avg, want.exp_avg);
  EXPECT_EQ(got.scaler, want.scaler);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = MakeEngine();
    pool_ = MakePool(2, kPoolBuffer);
    ASSERT_TRUE(engine_ && pool_);
    root_ = dir_.Sub("ckpt");
  }
  std::string Step(int n) const { return root_ + "/step-" + std::to_string(n); }
  void SaveOld() { ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(1), old_.meta, old_.Refs()).ok()); }
  void ExpectOldIsLatest() {
    auto latest = ResolveLatest(*engine_, *pool_, root_);
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    EXPECT_EQ(*latest, Step(1));
    ExpectLoads(*engine_, *pool_, *latest, old_);
  }

  TempDir dir_;
  std::string root_;
  std::unique_ptr<aio::IoEngine> engine_;
  std::unique_ptr<aio::PinnedPool> pool_;
  State old_{1};
  State new_{2};
};

TEST_F(CheckpointTest, SaveLoadRoundTripAndLatest) {
  SaveOld();
  ExpectOldIsLatest();
  SaveOptions small_chunks;
  small_chunks.chunk_bytes = 64 << 10;
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs(), small_chunks).ok());
  auto latest = ResolveLatest(*engine_, *pool_, root_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Step(2));
  ExpectLoads(*engine_, *pool_, Step(2), new_);
  ExpectLoads(*engine_, *pool_, Step(1), old_);
  // Never overwritten in place.
  EXPECT_EQ(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs()).code(), StatusCode::kFailedPrecondition);
  // Nothing temporary is left behind.
  auto entries = ListDirectory(root_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-1", "step-2"}));
}

// replace_orphan: a directory `latest` does not name (saved without
// updating `latest`, as a run killed before that step leaves it) is
// replaced; the one `latest` names never is.
// Save and restore report their bytes piece by piece: from 0, never
// backwards, and the total only once the work is done (the save: in place).
TEST_F(CheckpointTest, SaveAndRestoreReportProgress) {
  const int64_t blob_bytes = 700'001 + 300'000 + 24;
  std::vector<std::pair<int64_t, int64_t>> calls;
  bool in_place_at_total = false;
  SaveOptions so;
  so.progress = [&](int64_t done, int64_t total) {
    calls.emplace_back(done, total);
    if (done == total) in_place_at_total = PathExists(Step(1));
  };
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(1), old_.meta, old_.Refs(), so).ok());
  ASSERT_GE(calls.size(), 4u);  // the first, one per 256 KiB piece, the last
  EXPECT_EQ(calls.front(), std::make_pair(int64_t{0}, blob_bytes));
  EXPECT_EQ(calls.back(), std::make_pair(blob_bytes, blob_bytes));
  EXPECT_TRUE(in_place_at_total);
  for (size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].first, calls[i - 1].first);
    EXPECT_EQ(calls[i].second, blob_bytes);
    if (i + 1 < calls.size()) {
      EXPECT_LT(calls[i].first, blob_bytes);
    }
  }

  calls.clear();
  auto reader = CheckpointReader::Open(*engine_, *pool_, Step(1));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  State got(7);
  ProgressFn fn = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  ASSERT_TRUE(reader->Restore(got.Refs(), fn).ok());
  EXPECT_EQ(got.master, old_.master);
  ASSERT_GE(calls.size(), 3u);
  EXPECT_EQ(calls.front(), std::make_pair(int64_t{0}, 2 * blob_bytes));  // verified, then read
  EXPECT_EQ(calls.back(), std::make_pair(2 * blob_bytes, 2 * blob_bytes));
}

TEST_F(CheckpointTest, ReplaceOrphanReplacesOnlyWhatLatestDoesNotName) {
  SaveOld();
  SaveOptions no_latest;
  no_latest.update_latest = false;
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), old_.meta, old_.Refs(), no_latest).ok());
  ExpectOldIsLatest();
  SaveOptions replace;
  replace.replace_orphan = true;
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs(), replace).ok());
  ExpectLoads(*engine_, *pool_, Step(2), new_);
  auto latest = ResolveLatest(*engine_, *pool_, root_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Step(2));
  Status again = SaveCheckpoint(*engine_, *pool_, Step(2), old_.meta, old_.Refs(), replace);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  EXPECT_NE(again.message().find("latest"), std::string::npos) << again.ToString();
  ExpectLoads(*engine_, *pool_, Step(2), new_);
}

TEST_F(CheckpointTest, BlobsFromAndIntoSwapStore) {
  SwapStoreOptions o;
  o.paths = {dir_.Sub("nvme0"), dir_.Sub("nvme1"), dir_.Sub("nvme2")};
  o.stripe_bytes = 64 << 10;
  auto store = SwapStore::Create(engine_.get(), {{"m", 700'001, 4}, {"v", 700'001, 4}}, o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto big = MakePool(1, (*store)->PaddedBytes(700'001));
  aio::PinnedBuffer buf = big->Acquire();
  std::memcpy(buf.data(), old_.master.data(), old_.master.size());
  auto h = (*store)->SwapOut(0, buf.data());
  ASSERT_TRUE(h.ok() && (*store)->Wait(*h).ok());
  // A swap tensor never written cannot be saved.
  EXPECT_EQ(SaveCheckpoint(*engine_, *pool_, Step(9), {}, {BlobRef::Swap("v", store->get(), 1)}).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(1), old_.meta, {BlobRef::Swap("master", store->get(), 0)}).ok());
  // Restore into the other tensor and read it back.
  auto meta = LoadCheckpoint(*engine_, *pool_, Step(1), {BlobRef::Swap("master", store->get(), 1)});
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  std::memset(buf.data(), 0, 700'001);
  auto r = (*store)->SwapIn(1, buf.data());
  ASSERT_TRUE(r.ok() && (*store)->Wait(*r).ok());
  EXPECT_EQ(std::memcmp(buf.data(), old_.master.data(), old_.master.size()), 0);
}

TEST_F(CheckpointTest, CorruptBlobIsRefusedNamingFileAndOffset) {
  SaveOld();
  SaveOptions o;
  o.chunk_bytes = 64 << 10;
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs(), o).ok());
  CorruptFile(Step(2) + "/blob-00000.bin", 200'000);
  State got(7);
  const State before = got;
  auto meta = LoadCheckpoint(*engine_, *pool_, Step(2), got.Refs());
  ASSERT_FALSE(meta.ok());
  EXPECT_EQ(meta.status().code(), StatusCode::kCorruption);
  EXPECT_NE(meta.status().message().find("blob-00000.bin offset 196608"), std::string::npos) << meta.status().message();
  EXPECT_NE(meta.status().message().find("'master'"), std::string::npos) << meta.status().message();
  // Nothing was restored from a damaged checkpoint.
  EXPECT_EQ(got.master, before.master);
  ExpectLoads(*engine_, *pool_, Step(1), old_);
}

TEST_F(CheckpointTest, TruncatedBlobIsRefused) {
  SaveOld();
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs()).ok());
  ASSERT_EQ(::truncate((Step(2) + "/blob-00001.bin").c_str(), 4096), 0);
  auto r = CheckpointReader::Open(*engine_, *pool_, Step(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("blob-00001.bin offset 4096"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  ExpectLoads(*engine_, *pool_, Step(1), old_);
}

TEST_F(CheckpointTest, MissingManifestOrFileIsRefused) {
  SaveOld();
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs()).ok());
  ASSERT_TRUE(RemoveFile(Step(2) + "/blob-00002.bin").ok());
  auto r = CheckpointReader::Open(*engine_, *pool_, Step(2));
  ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("blob-00002.bin"), std::string::npos);
  EXPECT_NE(r.status().message().find("missing"), std::string::npos);
  ASSERT_TRUE(RemoveFile(Step(2) + "/manifest").ok());
  r = CheckpointReader::Open(*engine_, *pool_, Step(2));
  ASSERT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("no manifest"), std::string::npos);
  ExpectLoads(*engine_, *pool_, Step(1), old_);
}

TEST_F(CheckpointTest, DamagedManifestOrOtherVersionIsRefused) {
  SaveOld();
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, Step(2), new_.meta, new_.Refs()).ok());
  const std::string manifest = Step(2) + "/manifest";
  CorruptFile(manifest, 100);
  auto r = CheckpointReader::Open(*engine_, *pool_, Step(2));
  ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("manifest offset"), std::string::npos) << r.status().message();
  CorruptFile(manifest, 100);  // undo
  ASSERT_TRUE(CheckpointReader::Open(*engine_, *pool_, Step(2)).ok());
  // "zinf-checkpoint 1 ..." -> "zinf-checkpoint 7 ..."
  {
    FILE* f = std::fopen(manifest.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 16, SEEK_SET);
    std::fputc('7', f);
    std::fclose(f);
  }
  r = CheckpointReader::Open(*engine_, *pool_, Step(2));
  ASSERT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("version 7"), std::string::npos) << r.status().message();
  // A damaged pointer is an error, never a guess.
  CorruptFile(root_ + "/latest", 14);
  EXPECT_EQ(ResolveLatest(*engine_, *pool_, root_).status().code(), StatusCode::kCorruption);
  ExpectLoads(*engine_, *pool_, Step(1), old_);
}

TEST_F(CheckpointTest, InjectedFaultsDuringSaveLeaveThePreviousCheckpoint) {
  SaveOld();
  std::string expected_latest = Step(1);
  int failures = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    aio::FaultOptions f;
    f.seed = seed;
    f.eio_rate = 0.05;
    f.torn_write_rate = 0.1;
    f.short_rate = 0.1;
    f.eagain_rate = 0.05;
    auto faulty = MakeFaultyEngine(f);
    const std::string dir = Step(100 + static_cast<int>(seed));
    Status s = SaveCheckpoint(*faulty, *pool_, dir, new_.meta, new_.Refs());
    std::unique_ptr<aio::IoEngine> clean = MakeEngine();
    if (s.ok()) {
      // Everything that claimed success really is there.
      ExpectLoads(*clean, *pool_, dir, new_);
      expected_latest = dir;
    } else {
      ++failures;
      EXPECT_NE(s.message().find(dir), std::string::npos) << s.ToString();
      EXPECT_FALSE(PathExists(dir));
      auto entries = ListDirectory(root_);
      ASSERT_TRUE(entries.ok());
      for (const std::string& e : *entries) EXPECT_EQ(e.find(".tmp-"), std::string::npos) << e;
    }
    // The pointer moves only with a save that succeeded.
    auto latest = ResolveLatest(*clean, *pool_, root_);
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, expected_latest);
  }
  EXPECT_GT(failures, 0);
  ExpectLoads(*engine_, *pool_, Step(1), old_);
}

// Kills a saving child at each stage; what is left must load as the old
// checkpoint (or, once the new one is in place, as the new one).
class CheckpointKillTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointKillTest, SigkillDuringSaveLeavesOldCheckpointIntact) {
  const int kill_at = GetParam();  // index of the after_step call to stop at
  TempDir dir;
  const std::string root = dir.Sub("ckpt");
  State old_state(1), new_state(2);
  {
    auto engine = MakeEngine();
    auto pool = MakePool(2, kPoolBuffer);
    ASSERT_TRUE(SaveCheckpoint(*engine, *pool, root + "/step-1", old_state.meta, old_state.Refs()).ok());
  }  // no engine threads while forking

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    auto engine = aio::CreateIoEngine(testing::EngineOptions());
    auto pool = MakePool(2, kPoolBuffer);
    if (!engine.ok() || !pool) ::_exit(3);
    int calls = 0;
    SaveOptions o;
    o.after_step = [&](const std::string&) {
      if (calls++ == kill_at) {
        const char c = 'k';
        if (::write(pipe_fds[1], &c, 1) != 1) ::_exit(4);
        for (;;) ::pause();  // the parent kills us here
      }
    };
    Status s = SaveCheckpoint(**engine, *pool, root + "/step-2", new_state.meta, new_state.Refs(), o);
    ::_exit(s.ok() ? 0 : 5);
  }
  ::close(pipe_fds[1]);
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1) << "the child never reached stage " << kill_at;
  ::close(pipe_fds[0]);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  auto engine = MakeEngine();
  auto pool = MakePool(2, kPoolBuffer);
  // Stages: 0..2 blob files, 3 manifest, 4 renamed into place, 5 latest.
  auto latest = ResolveLatest(*engine, *pool, root);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, root + (kill_at >= 5 ? "/step-2" : "/step-1"));
  ExpectLoads(*engine, *pool, root + "/step-1", old_state);
  if (kill_at >= 4) {
    ExpectLoads(*engine, *pool, root + "/step-2", new_state);
  } else {
    EXPECT_FALSE(PathExists(root + "/step-2"));
    // The next save of the same checkpoint cleans up and succeeds.
    ASSERT_TRUE(SaveCheckpoint(*engine, *pool, root + "/step-2", new_state.meta, new_state.Refs()).ok());
    ExpectLoads(*engine, *pool, *ResolveLatest(*engine, *pool, root), new_state);
    auto entries = ListDirectory(root);
    ASSERT_TRUE(entries.ok());
    EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-1", "step-2"}));
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointKillTest, ::testing::Range(0, 6));

// Integers of the manifest metadata: errors name the checkpoint and the key.
TEST(ManifestIntegerTest, ParsesOrNamesTheKey) {
  const std::map<std::string, std::string> md = {{"count", "42"},
                                                 {"negative", "-3"},
                                                 {"max", "9223372036854775807"},
                                                 {"too_big", "9223372036854775808"},
                                                 {"empty", ""},
                                                 {"suffix", "4x"},
                                                 {"space", " 4"},
                                                 {"plus", "+4"},
                                                 {"hex", "0x10"},
                                                 {"real", "1.5"}};
  auto count = ManifestInteger("ckpt/step-1", md, "count");
  ASSERT_TRUE(count.ok()) << count.status().ToString();
  EXPECT_EQ(*count, 42);
  EXPECT_EQ(*ManifestInteger("d", md, "negative"), -3);
  EXPECT_EQ(*ManifestInteger("d", md, "max", 0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*ManifestInteger("d", md, "count", 42), 42);

  const Status missing = ManifestInteger("ckpt/step-1", md, "absent").status();
  EXPECT_EQ(missing.code(), StatusCode::kCorruption);
  EXPECT_EQ(missing.message(), "checkpoint ckpt/step-1: manifest lacks 'absent'");
  for (const char* key : {"too_big", "empty", "suffix", "space", "plus", "hex", "real"}) {
    const Status bad = ManifestInteger("ckpt/step-1", md, key).status();
    EXPECT_EQ(bad.code(), StatusCode::kCorruption) << key;
    EXPECT_EQ(bad.message(),
              "checkpoint ckpt/step-1: '" + std::string(key) + "' is not an integer: '" + md.at(key) + "'");
  }
  const Status below = ManifestInteger("ckpt/step-1", md, "negative", 0).status();
  EXPECT_EQ(below.code(), StatusCode::kCorruption);
  EXPECT_EQ(below.message(), "checkpoint ckpt/step-1: 'negative' is -3, expected at least 0");
}

}  // namespace
}  // namespace zinf::swap
