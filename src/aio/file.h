// Files for the engines: a move-only fd, opening with O_DIRECT (and what to
// do when a filesystem refuses it), the alignment O_DIRECT needs, a bounded
// table of open files shared by the engines, and crash-safe whole-file writes.
//
// Thread-safety: File is a value-like owner (one owner at a time). FileTable
// is internally locked; see its comment.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "aio/io_engine.h"
#include "zinf/status.h"

namespace zinf::aio {

// Owns one file descriptor; closes it on destruction.
class File {
 public:
  File() = default;
  File(int fd, FileInfo info) : fd_(fd), info_(std::move(info)) {}
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const FileInfo& info() const { return info_; }
  // Closes now and reports close()'s error (which the destructor cannot).
  Status Close();

 private:
  int fd_ = -1;
  FileInfo info_;
};

// Opens `path` for engine I/O, honouring `direct_io`, and fills its alignment.
// kUnavailable (kRequire) or one warning (kPrefer) when O_DIRECT is refused.
StatusOr<File> OpenForIo(const std::string& path, const OpenOptions& open, DirectIo direct_io);

// The logical block size of the block device `device` (a file's st_dev)
// from sysfs, looking through a partition to its disk; 0 when unknown.
int64_t LogicalBlockSize(dev_t device);

// The alignment O_DIRECT needs for `fd`: statx(STATX_DIOALIGN) where the
// kernel reports it, else the block device's logical block size from sysfs,
// else 4096. Never below 512.
int64_t DirectIoAlignment(int fd, const std::string& path);

// Synchronous fd-level operations the engines share; errors name the path.
Status SyncFd(const File& file);  // fdatasync
StatusOr<int64_t> FileSizeFd(const File& file);
Status TruncateFd(const File& file, int64_t size_bytes);
// fallocate(0, size), or ftruncate where the filesystem has no fallocate.
Status AllocateFd(const File& file, int64_t size_bytes);

// Files opened by one engine, indexed by FileId. Open/Close take the lock;
// Get() does not: a FileId handed to Submit stays valid (the caller may not
// close a file with requests outstanding), and the queue that carries the
// request to a worker orders the slot's writes before the worker's reads.
class FileTable {
 public:
  static constexpr int kMaxFiles = 64;

  // kResourceExhausted when all kMaxFiles slots are used.
  StatusOr<FileId> Add(File file);
  Status Remove(FileId id);  // closes the file
  bool IsOpen(FileId id) const;
  // kInvalidArgument "`op`: file id N is not open" unless `id` is open.
  Status CheckOpen(FileId id, std::string_view op) const;
  const File& Get(FileId id) const;

  // The fd-level operations above on an open file, for the engines' methods
  // of the same names; kInvalidArgument when `id` is not open.
  Status Sync(FileId id) const;
  StatusOr<int64_t> Size(FileId id) const;
  Status Truncate(FileId id, int64_t size_bytes) const;
  Status Allocate(FileId id, int64_t size_bytes) const;

 private:
  mutable std::mutex mu_;
  std::array<File, kMaxFiles> files_;
};

}  // namespace zinf::aio
