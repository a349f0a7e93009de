// FileLock: "this directory is in use by a run" as an advisory lock file.
//
// Two training runs pointed at the same save dir or swap dir would each take
// the other's half-written checkpoint for a leftover of a crash and delete
// it, and overwrite each other's swap files. A run therefore holds an
// exclusive flock(2) on a lock file in each directory it writes, for as long
// as it uses the directory. flock belongs to the open file description, so
// the kernel drops it when the holder closes it, exits or is killed (kill -9
// included): a crashed run never leaves a stale lock to clean up. The file
// itself stays; it holds the holder's pid, so a refused run can name it.
//
// Advisory: it keeps out only those who take it too (zinf runs). On a network
// filesystem flock may be local to one host.
//
// Thread-safety: a FileLock is a value owned by one thread at a time.
#pragma once

#include <string>

#include "zinf/status.h"

namespace zinf {

class FileLock {
 public:
  // Creates `path` (mode 0644) if missing and takes an exclusive lock on it
  // without waiting, then writes this process's pid into it. Errors:
  // kFailedPrecondition when another open file description holds the lock
  // (another process, or another FileLock on the same file in this one),
  // naming `path` and the holder's pid as the file gives it; open's or
  // flock's errno otherwise, naming `path`.
  static StatusOr<FileLock> Acquire(const std::string& path);

  FileLock() = default;  // holds nothing
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // releases the lock (the file stays)

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();

  int fd_ = -1;
  std::string path_;
};

}  // namespace zinf
