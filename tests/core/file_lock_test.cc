#include "core/file_lock.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace zinf {
namespace {

class FileLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/zinf-lock-test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/run.lock";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_, path_;
};

TEST_F(FileLockTest, SecondOpenFileDescriptionIsRefusedNamingTheHolder) {
  auto first = FileLock::Acquire(path_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->held());
  auto second = FileLock::Acquire(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("process " + std::to_string(::getpid())), std::string::npos) << msg;

  // A move hands the lock over without dropping it; destruction drops it.
  FileLock moved = std::move(*first);
  EXPECT_FALSE(FileLock::Acquire(path_).ok());
  moved = FileLock();
  EXPECT_TRUE(FileLock::Acquire(path_).ok());
}

// Another process holds it; when that process dies (kill -9, no cleanup)
// the lock goes with it.
TEST_F(FileLockTest, AnotherProcessIsNamedAndItsDeathReleasesTheLock) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = FileLock::Acquire(path_);
    const char byte = lock.ok() ? 'y' : 'n';
    if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
    ::pause();  // hold it until killed
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  auto refused = FileLock::Acquire(path_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("process " + std::to_string(child)), std::string::npos)
      << refused.status().ToString();

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ::close(ready[0]);
  ::close(ready[1]);
  auto mine = FileLock::Acquire(path_);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
}

TEST_F(FileLockTest, MissingDirectoryIsAnErrnoError) {
  auto lock = FileLock::Acquire(dir_ + "/no/such/dir/run.lock");
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find("no/such/dir/run.lock"), std::string::npos);
}

}  // namespace
}  // namespace zinf
