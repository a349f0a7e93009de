#include "swap/checkpoint_dirs.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "swap/checkpoint.h"
#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::MakeEngine;
using testing::MakePool;
using testing::RandomBytes;
using testing::TempDir;

std::vector<std::string> Entries(const std::string& dir) {
  auto e = ListDirectory(dir);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? *e : std::vector<std::string>{};
}

// Real checkpoints (a small blob and metadata naming the step) in a run's
// folders.
class CheckpointDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = MakeEngine();
    pool_ = MakePool(2, 64 << 10);
    ASSERT_TRUE(engine_ && pool_);
    save_dir_ = dir_.Sub("run");
  }
  // Saves checkpoint `dir`; `latest` is updated unless `update_latest` is false.
  void Save(const std::string& dir, int64_t step, bool update_latest = true) {
    SaveOptions so;
    so.update_latest = update_latest;
    ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, dir, {{"step", std::to_string(step)}},
                               {BlobRef::Ram("state", std::span<const std::byte>(blob_))}, so)
                    .ok());
  }

  TempDir dir_;
  std::string save_dir_;
  std::unique_ptr<aio::IoEngine> engine_;
  std::unique_ptr<aio::PinnedPool> pool_;
  std::vector<std::byte> blob_ = RandomBytes(1000, 7);
};

TEST(CheckpointDirNamesTest, RankAndStepDirectories) {
  EXPECT_EQ(RankDirectory("/s/run", 3), "/s/run/rank-3");
  EXPECT_EQ(StepDirectory("/s/run/rank-3", 42), "/s/run/rank-3/step-00000042");
  EXPECT_EQ(StepDirectory("r", 123456789), "r/step-123456789");
  for (int64_t step : {int64_t{0}, int64_t{7}, int64_t{99999999}, int64_t{1234567890123}}) {
    EXPECT_EQ(StepOfDirectory(StepDirectory("a/rank-0", step)), step);
  }
}

TEST(CheckpointDirNamesTest, StepOfDirectoryRefusesOtherNames) {
  EXPECT_EQ(StepOfDirectory("step-00000042"), 42);
  EXPECT_EQ(StepOfDirectory("a/b/step-5/"), 5);  // trailing slash
  for (const char* name : {"step-", "step-12a", "step--1", "latest", "rank-0", "a/step-00000042.tmp-0a1b", "Step-1",
                           "step-99999999999999999999"}) {
    EXPECT_EQ(StepOfDirectory(name), -1) << name;
  }
}

TEST(CheckpointDirNamesTest, KeepOneNeedsOneRank) {
  EXPECT_TRUE(CheckKeepCheckpoints(0, 1).ok());
  EXPECT_TRUE(CheckKeepCheckpoints(0, 8).ok());
  EXPECT_TRUE(CheckKeepCheckpoints(1, 1).ok());
  EXPECT_TRUE(CheckKeepCheckpoints(2, 8).ok());
  const Status one = CheckKeepCheckpoints(1, 2);
  EXPECT_EQ(one.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(one.message().find("at least 2 with several ranks"), std::string::npos) << one.ToString();
  EXPECT_EQ(CheckKeepCheckpoints(-1, 1).code(), StatusCode::kInvalidArgument);
}

// Only step directories up to the one saved count; later ones, and anything
// that is no step directory, stay.
TEST_F(CheckpointDirsTest, PruneKeepsTheNewestUpToTheSavedStep) {
  const std::string rank_dir = RankDirectory(save_dir_, 0);
  for (int step = 1; step <= 6; ++step) ASSERT_TRUE(MakeDirectories(StepDirectory(rank_dir, step)).ok());
  ASSERT_TRUE(MakeDirectories(JoinPath(rank_dir, "notes")).ok());
  ASSERT_TRUE(MakeDirectories(JoinPath(rank_dir, "step-00000001.tmp-0a1b")).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(rank_dir, "latest"), "x").ok());

  ASSERT_TRUE(PruneCheckpoints(rank_dir, /*saved_step=*/6, /*keep=*/0).ok());  // 0 keeps all
  EXPECT_EQ(Entries(rank_dir).size(), 9u);
  ASSERT_TRUE(PruneCheckpoints(rank_dir, /*saved_step=*/4, /*keep=*/2).ok());
  EXPECT_EQ(Entries(rank_dir), (std::vector<std::string>{"latest", "notes", "step-00000001.tmp-0a1b", "step-00000003",
                                                         "step-00000004", "step-00000005", "step-00000006"}));
  ASSERT_TRUE(PruneCheckpoints(rank_dir, /*saved_step=*/6, /*keep=*/1).ok());
  EXPECT_EQ(Entries(rank_dir),
            (std::vector<std::string>{"latest", "notes", "step-00000001.tmp-0a1b", "step-00000006"}));

  const Status missing = PruneCheckpoints(dir_.Sub("nothing"), 1, 1);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(dir_.Sub("nothing")), std::string::npos) << missing.ToString();
}

TEST_F(CheckpointDirsTest, LatestStepReadsThePointer) {
  const std::string rank_dir = RankDirectory(save_dir_, 0);
  EXPECT_EQ(LatestStep(rank_dir).status().code(), StatusCode::kNotFound);
  Save(StepDirectory(rank_dir, 3), 3);
  Save(StepDirectory(rank_dir, 5), 5);
  auto latest = LatestStep(rank_dir);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, 5);

  // `latest` naming a checkpoint that is no step directory.
  Save(JoinPath(rank_dir, "final"), 6);
  const Status named = LatestStep(rank_dir).status();
  EXPECT_EQ(named.code(), StatusCode::kCorruption);
  EXPECT_NE(named.message().find("final, not a step directory"), std::string::npos) << named.ToString();

  ASSERT_TRUE(WriteFileAtomic(JoinPath(rank_dir, "latest"), "zinf-latest 1 step-00000005 00000000\n").ok());
  EXPECT_EQ(LatestStep(rank_dir).status().code(), StatusCode::kCorruption);
}

// A save directory: each rank its own `latest` (a crash between the ranks'
// saves left them apart); a step directory: each rank its own rank's step.
TEST_F(CheckpointDirsTest, FindResumePointPerRank) {
  for (int step : {1, 2}) Save(StepDirectory(RankDirectory(save_dir_, 0), step), step);
  Save(StepDirectory(RankDirectory(save_dir_, 1), 1), 1);

  auto r0 = FindResumePoint(save_dir_, 0, 2);
  auto r1 = FindResumePoint(save_dir_, 1, 2);
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status().ToString() << r1.status().ToString();
  EXPECT_EQ(r0->rank_dir, RankDirectory(save_dir_, 0));
  EXPECT_EQ(r0->step, 2);
  EXPECT_EQ(r0->path, StepDirectory(r0->rank_dir, 2));
  EXPECT_EQ(r1->step, 1);
  // Agreed on the oldest: rank 0 goes back to step 1.
  EXPECT_EQ(r0->Checkpoint(1), StepDirectory(RankDirectory(save_dir_, 0), 1));

  auto named = FindResumePoint(StepDirectory(RankDirectory(save_dir_, 1), 1), 0, 2);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(named->rank_dir, RankDirectory(save_dir_, 0));
  EXPECT_EQ(named->step, 1);
  EXPECT_EQ(named->Checkpoint(1), StepDirectory(RankDirectory(save_dir_, 0), 1));

  const Status no_rank = FindResumePoint(save_dir_, 2, 3).status();
  EXPECT_EQ(no_rank.code(), StatusCode::kNotFound);
  EXPECT_NE(no_rank.message().find(RankDirectory(save_dir_, 2)), std::string::npos) << no_rank.ToString();
  EXPECT_EQ(FindResumePoint(dir_.Sub("nothing"), 0, 1).status().code(), StatusCode::kNotFound);
}

// A checkpoint outside the layout resumes as it is with one rank only.
TEST_F(CheckpointDirsTest, LoneCheckpointOnlyWithOneRank) {
  const std::string lone = dir_.Sub("exported");
  Save(lone, 9);
  auto one = FindResumePoint(lone, 0, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_TRUE(one->rank_dir.empty());
  EXPECT_EQ(one->Checkpoint(one->step), lone);
  const Status two = FindResumePoint(lone, 0, 2).status();
  EXPECT_EQ(two.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.message().find("rank-<r>/step-<n>"), std::string::npos) << two.ToString();
}

// The orphan rule the trainer relies on: a step directory renamed into place
// whose `latest` update never happened is replaced by the next save of that
// step; the one `latest` names never is.
TEST_F(CheckpointDirsTest, SavingAStepAgainReplacesOnlyAnOrphan) {
  const std::string rank_dir = RankDirectory(save_dir_, 0);
  Save(StepDirectory(rank_dir, 1), 1);
  Save(StepDirectory(rank_dir, 2), 2, /*update_latest=*/false);  // killed before `latest`
  auto latest = LatestStep(rank_dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 1);

  SaveOptions replace;
  replace.replace_orphan = true;
  ASSERT_TRUE(SaveCheckpoint(*engine_, *pool_, StepDirectory(rank_dir, 2), {{"step", "2 again"}},
                             {BlobRef::Ram("state", std::span<const std::byte>(blob_))}, replace)
                  .ok());
  auto md = ReadCheckpointMetadata(StepDirectory(rank_dir, 2));
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->at("step"), "2 again");
  EXPECT_EQ(*LatestStep(rank_dir), 2);
  EXPECT_EQ(SaveCheckpoint(*engine_, *pool_, StepDirectory(rank_dir, 2), {},
                           {BlobRef::Ram("state", std::span<const std::byte>(blob_))}, replace)
                .code(),
            StatusCode::kFailedPrecondition);
}

// A second run on the same save dir would delete the first's save in
// progress as an orphan; it is refused, per rank, naming the holder's pid.
TEST_F(CheckpointDirsTest, RankDirectoryIsLockedForOneRun) {
  auto lock = LockRankDirectory(save_dir_, 0);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  auto second = LockRankDirectory(save_dir_, 0);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("checkpoint directory " + RankDirectory(save_dir_, 0) + " is in use"),
            std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("process " + std::to_string(::getpid())), std::string::npos);
  EXPECT_TRUE(LockRankDirectory(save_dir_, 1).ok());  // another rank of the same run
  // The lock file is no step directory: saving, `latest` and pruning ignore it.
  Save(StepDirectory(RankDirectory(save_dir_, 0), 1), 1);
  Save(StepDirectory(RankDirectory(save_dir_, 0), 2), 2);
  ASSERT_TRUE(PruneCheckpoints(RankDirectory(save_dir_, 0), 2, 1).ok());
  EXPECT_EQ(Entries(RankDirectory(save_dir_, 0)), (std::vector<std::string>{".lock", "latest", "step-00000002"}));
  *lock = FileLock();
  EXPECT_TRUE(LockRankDirectory(save_dir_, 0).ok());
}

TEST_F(CheckpointDirsTest, ReadCheckpointMetadataWithoutLoading) {
  const std::string dir = StepDirectory(RankDirectory(save_dir_, 0), 4);
  Save(dir, 4);
  auto md = ReadCheckpointMetadata(dir);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(*md, (std::map<std::string, std::string>{{"step", "4"}}));
  EXPECT_EQ(ReadCheckpointMetadata(dir_.Sub("nothing")).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(RemoveFile(JoinPath(dir, "manifest")).ok());
  EXPECT_EQ(ReadCheckpointMetadata(dir).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace zinf::swap
