// perf/scratch: a benchmark's scratch space is gone when its owner goes,
// whichever way the run ends, and not before.
#include "scratch.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "core/fs.h"

namespace zinf::perf {
namespace {

// A base directory for one test, removed after it.
class ScratchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/zinf-scratch-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    base_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(base_).ok()); }

  static void Touch(const std::string& path) {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::write(fd, "x", 1), 1);
    ::close(fd);
  }

  std::string base_;
};

TEST_F(ScratchTest, DirIsMadeInsideBaseAndRemovedWithItsContents) {
  std::string path;
  {
    auto dir = ScratchDir::Create(JoinPath(base_, "a/b"), "zinf-bench-x");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    path = dir->path();
    EXPECT_EQ(ParentPath(path), JoinPath(base_, "a/b"));
    EXPECT_EQ(BaseName(path).rfind("zinf-bench-x.", 0), 0u) << path;
    ASSERT_TRUE(PathExists(path));
    ASSERT_TRUE(MakeDirectory(JoinPath(path, "sub")).ok());
    Touch(JoinPath(path, "sub/file"));
    Touch(JoinPath(path, "file"));
  }
  EXPECT_FALSE(PathExists(path));
  // Only the scratch directory goes, not the base made for it.
  EXPECT_TRUE(PathExists(JoinPath(base_, "a/b")));
}

TEST_F(ScratchTest, TwoDirsInOneBaseDiffer) {
  auto a = ScratchDir::Create(base_, "p");
  auto b = ScratchDir::Create(base_, "p");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->path(), b->path());
}

TEST_F(ScratchTest, MovedDirIsRemovedOnceByItsLastOwner) {
  ScratchDir kept;
  EXPECT_TRUE(kept.path().empty());
  std::string path;
  {
    auto dir = ScratchDir::Create(base_, "p");
    ASSERT_TRUE(dir.ok());
    path = dir->path();
    kept = std::move(*dir);
    EXPECT_TRUE(dir->path().empty());
  }
  EXPECT_TRUE(PathExists(path));  // the moved-from object removed nothing
  EXPECT_EQ(kept.path(), path);
  // Assigning over an owner removes what it held.
  auto other = ScratchDir::Create(base_, "q");
  ASSERT_TRUE(other.ok());
  const std::string other_path = other->path();
  kept = std::move(*other);
  EXPECT_FALSE(PathExists(path));
  EXPECT_TRUE(PathExists(other_path));
}

TEST_F(ScratchTest, DirInABaseThatCannotBeMadeIsAnErrorNamingIt) {
  const std::string file = JoinPath(base_, "file");
  Touch(file);
  auto dir = ScratchDir::Create(JoinPath(file, "below"), "p");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().ToString().find(file), std::string::npos) << dir.status().ToString();
}

TEST_F(ScratchTest, FilesAreRemovedWhenTheOwnerGoes) {
  const std::string a = JoinPath(base_, "a.fio"), b = JoinPath(base_, "b.fio"), never = JoinPath(base_, "never");
  {
    ScratchFiles files;
    files.Add(a);
    files.Add(never);  // registered, never created: not an error
    Touch(a);
    ScratchFiles moved = std::move(files);
    EXPECT_TRUE(files.paths().empty());
    moved.Add(b);
    Touch(b);
    EXPECT_TRUE(PathExists(a) && PathExists(b));
  }
  EXPECT_FALSE(PathExists(a));
  EXPECT_FALSE(PathExists(b));
  // Files beside them stay.
  EXPECT_TRUE(PathExists(base_));
}

TEST_F(ScratchTest, RemoveAllRemovesNowAndKeepHandsFilesOver) {
  const std::string a = JoinPath(base_, "a"), b = JoinPath(base_, "b");
  ScratchFiles files;
  files.Add(a);
  Touch(a);
  files.RemoveAll();
  EXPECT_FALSE(PathExists(a));
  EXPECT_TRUE(files.paths().empty());
  Touch(a);  // a file of the same name made after is not the owner's any more
  {
    ScratchFiles kept;
    kept.Add(b);
    Touch(b);
    kept.Keep();
  }
  EXPECT_TRUE(PathExists(a));
  EXPECT_TRUE(PathExists(b));
}

}  // namespace
}  // namespace zinf::perf
