#include "core/fs.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir.h"
#include "testing/text.h"

namespace zinf {
namespace {

using test_support::ReadAll;

using TempDir = zinf::test_support::TempDir;  // tests/temp_dir.h

void WritePlain(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

// An error with `code` and errno `err` whose message names `path`.
void ExpectError(const Status& s, StatusCode code, int err, const std::string& path) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.sys_errno(), err) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString() << " does not name " << path;
}

TEST(FsTest, MakeDirectory) {
  TempDir dir;
  const std::string d = dir.Sub("d");
  ASSERT_TRUE(MakeDirectory(d).ok());
  EXPECT_TRUE(std::filesystem::is_directory(d));
  const Status again = MakeDirectory(d);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("already exists"), std::string::npos) << again.ToString();
  ExpectError(MakeDirectory(dir.Sub("no/d")), StatusCode::kNotFound, ENOENT, dir.Sub("no/d"));
  WritePlain(dir.Sub("file"), "x");
  ExpectError(MakeDirectory(dir.Sub("file/d")), StatusCode::kNotFound, ENOTDIR, dir.Sub("file/d"));
}

TEST(FsTest, MakeDirectories) {
  TempDir dir;
  ASSERT_TRUE(MakeDirectories(dir.Sub("a/b/c")).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.Sub("a/b/c")));
  EXPECT_TRUE(MakeDirectories(dir.Sub("a/b/c")).ok());   // exists: fine
  EXPECT_TRUE(MakeDirectories(dir.Sub("a/b/d/")).ok());  // trailing slash
  EXPECT_TRUE(std::filesystem::is_directory(dir.Sub("a/b/d")));
  EXPECT_EQ(MakeDirectories("").code(), StatusCode::kInvalidArgument);

  WritePlain(dir.Sub("file"), "x");
  const Status not_dir = MakeDirectories(dir.Sub("file"));
  EXPECT_EQ(not_dir.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(not_dir.message().find(dir.Sub("file") + " exists and is not a directory"), std::string::npos)
      << not_dir.ToString();
  // A file where a parent should be: the error names that prefix.
  ExpectError(MakeDirectories(dir.Sub("file/x/y")), StatusCode::kNotFound, ENOTDIR, dir.Sub("file/x"));
}

TEST(FsTest, WriteFileAtomicReplacesWholeAndLeavesNoTemporary) {
  TempDir dir;
  const std::string f = dir.Sub("pointer");
  ASSERT_TRUE(WriteFileAtomic(f, "first version, longer\n").ok());
  EXPECT_EQ(ReadAll(f), "first version, longer\n");
  ASSERT_TRUE(WriteFileAtomic(f, "second\n").ok());
  EXPECT_EQ(ReadAll(f), "second\n");
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("empty"), "").ok());
  EXPECT_EQ(ReadAll(dir.Sub("empty")), "");
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"empty", "pointer"}));
}

TEST(FsTest, WriteFileAtomicErrorsLeaveNothingBehind) {
  TempDir dir;
  // No such directory: the temporary file cannot be created.
  const Status missing = WriteFileAtomic(dir.Sub("no/file"), "x");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_NE(missing.message().find(dir.Sub("no/file.tmp-")), std::string::npos) << missing.ToString();
  // A directory in the way: the rename fails, the temporary file goes, the
  // directory stays.
  ASSERT_TRUE(MakeDirectory(dir.Sub("taken")).ok());
  const Status taken = WriteFileAtomic(dir.Sub("taken"), "x");
  EXPECT_FALSE(taken.ok());
  EXPECT_NE(taken.message().find(dir.Sub("taken")), std::string::npos) << taken.ToString();
  EXPECT_TRUE(std::filesystem::is_directory(dir.Sub("taken")));
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"taken"}));
}

TEST(FsTest, RenamePath) {
  TempDir dir;
  WritePlain(dir.Sub("a"), "A");
  WritePlain(dir.Sub("b"), "B");
  ASSERT_TRUE(RenamePath(dir.Sub("a"), dir.Sub("b")).ok());  // replaces b
  EXPECT_FALSE(PathExists(dir.Sub("a")));
  EXPECT_EQ(ReadAll(dir.Sub("b")), "A");
  const Status s = RenamePath(dir.Sub("a"), dir.Sub("c"));
  ExpectError(s, StatusCode::kNotFound, ENOENT, dir.Sub("c"));
  EXPECT_NE(s.message().find("rename " + dir.Sub("a")), std::string::npos) << s.ToString();
}

TEST(FsTest, SyncDirectory) {
  TempDir dir;
  EXPECT_TRUE(SyncDirectory(dir.path()).ok());
  ExpectError(SyncDirectory(dir.Sub("none")), StatusCode::kNotFound, ENOENT, dir.Sub("none"));
  WritePlain(dir.Sub("file"), "x");
  ExpectError(SyncDirectory(dir.Sub("file")), StatusCode::kNotFound, ENOTDIR, dir.Sub("file"));
}

TEST(FsTest, RemoveFile) {
  TempDir dir;
  WritePlain(dir.Sub("f"), "x");
  ASSERT_TRUE(RemoveFile(dir.Sub("f")).ok());
  EXPECT_FALSE(PathExists(dir.Sub("f")));
  EXPECT_TRUE(RemoveFile(dir.Sub("f")).ok());  // already gone: fine
  ASSERT_TRUE(MakeDirectory(dir.Sub("d")).ok());
  ExpectError(RemoveFile(dir.Sub("d")), StatusCode::kInvalidArgument, EISDIR, dir.Sub("d"));
}

TEST(FsTest, RemoveTreeRemovesLinksNotTheirTargets) {
  TempDir dir;
  ASSERT_TRUE(MakeDirectories(dir.Sub("tree/a/b")).ok());
  WritePlain(dir.Sub("tree/a/b/f"), "x");
  WritePlain(dir.Sub("tree/g"), "y");
  ASSERT_TRUE(MakeDirectory(dir.Sub("kept")).ok());
  WritePlain(dir.Sub("kept/precious"), "z");
  ASSERT_EQ(::symlink(dir.Sub("kept").c_str(), dir.Sub("tree/link").c_str()), 0);
  ASSERT_TRUE(RemoveTree(dir.Sub("tree")).ok());
  EXPECT_FALSE(PathExists(dir.Sub("tree")));
  EXPECT_EQ(ReadAll(dir.Sub("kept/precious")), "z");
  EXPECT_TRUE(RemoveTree(dir.Sub("tree")).ok());           // already gone: fine
  ASSERT_TRUE(RemoveTree(dir.Sub("kept/precious")).ok());  // a file
  EXPECT_FALSE(PathExists(dir.Sub("kept/precious")));
  WritePlain(dir.Sub("file"), "x");
  ExpectError(RemoveTree(dir.Sub("file/x")), StatusCode::kNotFound, ENOTDIR, dir.Sub("file/x"));
}

TEST(FsTest, PathExistsSeesDanglingLinks) {
  TempDir dir;
  EXPECT_TRUE(PathExists(dir.path()));
  EXPECT_FALSE(PathExists(dir.Sub("none")));
  ASSERT_EQ(::symlink(dir.Sub("none").c_str(), dir.Sub("dangling").c_str()), 0);
  EXPECT_TRUE(PathExists(dir.Sub("dangling")));
}

TEST(FsTest, ListDirectorySortedWithoutDots) {
  TempDir dir;
  auto empty = ListDirectory(dir.path());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  for (const char* name : {"b", "a", "c.tmp-1", ".hidden"}) WritePlain(dir.Sub(name), "x");
  ASSERT_TRUE(MakeDirectory(dir.Sub("d")).ok());
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{".hidden", "a", "b", "c.tmp-1", "d"}));
  ExpectError(ListDirectory(dir.Sub("none")).status(), StatusCode::kNotFound, ENOENT, dir.Sub("none"));
  ExpectError(ListDirectory(dir.Sub("a")).status(), StatusCode::kNotFound, ENOTDIR, dir.Sub("a"));
}

TEST(FsTest, FreeAndAllocatedBytes) {
  TempDir dir;
  auto free_bytes = FreeBytes(dir.path());
  ASSERT_TRUE(free_bytes.ok()) << free_bytes.status().ToString();
  EXPECT_GT(*free_bytes, 0);
  ExpectError(FreeBytes(dir.Sub("none")).status(), StatusCode::kNotFound, ENOENT, dir.Sub("none"));

  EXPECT_EQ(AllocatedBytes(dir.Sub("none")), 0);
  const int64_t n = 1 << 20;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("full"), RandomHex(static_cast<int>(n))).ok());  // synced
  EXPECT_GE(AllocatedBytes(dir.Sub("full")), n);
  // A hole allocates (next to) nothing.
  WritePlain(dir.Sub("sparse"), "");
  ASSERT_EQ(::truncate(dir.Sub("sparse").c_str(), n), 0);
  EXPECT_LT(AllocatedBytes(dir.Sub("sparse")), n);
}

TEST(FsTest, RandomHex) {
  for (int n : {0, 1, 7, 64, 200}) {
    const std::string h = RandomHex(n);
    EXPECT_EQ(h.size(), static_cast<size_t>(n));
    EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
  }
  EXPECT_NE(RandomHex(32), RandomHex(32));
}

TEST(FsTest, PathComponents) {
  EXPECT_EQ(ParentPath("a/b/c"), "a/b");
  EXPECT_EQ(ParentPath("a/b/c/"), "a/b");
  EXPECT_EQ(ParentPath("c"), ".");
  EXPECT_EQ(ParentPath("/c"), "/");
  EXPECT_EQ(ParentPath("/"), "/");
  EXPECT_EQ(BaseName("a/b/c"), "c");
  EXPECT_EQ(BaseName("a/b/c//"), "c");
  EXPECT_EQ(BaseName("c"), "c");
  EXPECT_EQ(BaseName("/c"), "c");
  EXPECT_EQ(JoinPath("a/b", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("a/b/", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(JoinPath("/", "c"), "/c");
}

}  // namespace
}  // namespace zinf
