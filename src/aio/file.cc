#include "aio/file.h"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/log.h"

namespace zinf::aio {

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept : fd_(other.fd_), info_(std::move(other.info_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    info_ = std::move(other.info_);
    other.fd_ = -1;
  }
  return *this;
}

Status File::Close() {
  if (fd_ < 0) return Status::Ok();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoStatus(errno, "close", info_.path);
  return Status::Ok();
}

namespace {

// statx(STATX_DIOALIGN) through the raw syscall: glibc 2.36's struct statx
// predates the field, the kernel's does not.
int64_t StatxDioAlign(int fd) {
  struct ::statx stx = {};
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0) return 0;
  if ((stx.stx_mask & STATX_DIOALIGN) == 0) return 0;
  return std::max<int64_t>(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
}

}  // namespace

int64_t LogicalBlockSize(dev_t device) {
  const std::string dev = "/sys/dev/block/" + std::to_string(major(device)) + ":" + std::to_string(minor(device));
  // A partition has no queue/ of its own: its parent's is one level up.
  for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream in(dev + rel);
    int64_t n = 0;
    if (in >> n && n > 0) return n;
  }
  return 0;
}

int64_t DirectIoAlignment(int fd, const std::string& path) {
  (void)path;
  int64_t a = StatxDioAlign(fd);
  if (a <= 0) {
    struct ::stat st = {};
    if (::fstat(fd, &st) == 0) a = LogicalBlockSize(st.st_dev);
  }
  if (a <= 0) a = 4096;
  return std::max<int64_t>(a, 512);
}

StatusOr<File> OpenForIo(const std::string& path, const OpenOptions& open, DirectIo direct_io) {
  int flags = O_CLOEXEC | (open.read_only ? O_RDONLY : O_RDWR);
  if (open.create) flags |= O_CREAT;
  if (open.truncate) flags |= O_TRUNC;
  FileInfo info;
  info.path = path;
  int fd = -1;
  if (direct_io != DirectIo::kOff) {
    fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0) {
      info.direct = true;
    } else if (errno != EINVAL) {
      return ErrnoStatus(errno, "open", path);
    } else if (direct_io == DirectIo::kRequire) {
      return Status(StatusCode::kUnavailable,
                    "open " + path +
                        ": the filesystem refuses O_DIRECT (aio needs direct I/O; "
                        "put swap files on a local block-device filesystem such as ext4 or xfs)",
                    EINVAL);
    } else {
      Log("aio").warn(
          "{}: the filesystem refuses O_DIRECT; using buffered I/O through the page cache "
          "(slower, and throughput figures include caching)",
          path);
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
  }
  info.alignment_bytes = DirectIoAlignment(fd, path);
  return File(fd, std::move(info));
}

Status SyncFd(const File& file) {
  if (::fdatasync(file.fd()) != 0) return ErrnoStatus(errno, "fdatasync", file.info().path);
  return Status::Ok();
}

StatusOr<int64_t> FileSizeFd(const File& file) {
  struct ::stat st = {};
  if (::fstat(file.fd(), &st) != 0) return ErrnoStatus(errno, "fstat", file.info().path);
  return static_cast<int64_t>(st.st_size);
}

Status TruncateFd(const File& file, int64_t size_bytes) {
  if (::ftruncate(file.fd(), size_bytes) != 0) {
    return ErrnoStatus(errno, "ftruncate", file.info().path, size_bytes);
  }
  return Status::Ok();
}

Status AllocateFd(const File& file, int64_t size_bytes) {
  if (size_bytes <= 0) return Status::Ok();
  if (::fallocate(file.fd(), 0, 0, size_bytes) == 0) return Status::Ok();
  const int err = errno;
  if (err == EOPNOTSUPP || err == ENOSYS) {
    ZINF_ASSIGN_OR_RETURN(int64_t size, FileSizeFd(file));
    if (size >= size_bytes) return Status::Ok();
    return TruncateFd(file, size_bytes);
  }
  return ErrnoStatus(err, "fallocate", file.info().path, 0, size_bytes);
}

StatusOr<FileId> FileTable::Add(File file) {
  std::lock_guard lock(mu_);
  for (int i = 0; i < kMaxFiles; ++i) {
    if (!files_[i].is_open()) {
      files_[i] = std::move(file);
      return static_cast<FileId>(i);
    }
  }
  return Status::ResourceExhausted("open " + file.info().path + ": the engine already has " +
                                   std::to_string(kMaxFiles) + " files open");
}

Status FileTable::Remove(FileId id) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= kMaxFiles || !files_[id].is_open()) {
    return Status::InvalidArgument("close: file id " + std::to_string(id) + " is not open");
  }
  return files_[id].Close();
}

bool FileTable::IsOpen(FileId id) const {
  std::lock_guard lock(mu_);
  return id >= 0 && id < kMaxFiles && files_[id].is_open();
}

Status FileTable::CheckOpen(FileId id, std::string_view op) const {
  if (IsOpen(id)) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": file id " + std::to_string(id) + " is not open");
}

const File& FileTable::Get(FileId id) const {
  ZINF_CHECK_MSG(id >= 0 && id < kMaxFiles, "file id out of range");
  return files_[id];
}

Status FileTable::Sync(FileId id) const {
  ZINF_RETURN_IF_ERROR(CheckOpen(id, "fdatasync"));
  return SyncFd(Get(id));
}

StatusOr<int64_t> FileTable::Size(FileId id) const {
  ZINF_RETURN_IF_ERROR(CheckOpen(id, "fstat"));
  return FileSizeFd(Get(id));
}

Status FileTable::Truncate(FileId id, int64_t size_bytes) const {
  ZINF_RETURN_IF_ERROR(CheckOpen(id, "ftruncate"));
  return TruncateFd(Get(id), size_bytes);
}

Status FileTable::Allocate(FileId id, int64_t size_bytes) const {
  ZINF_RETURN_IF_ERROR(CheckOpen(id, "fallocate"));
  return AllocateFd(Get(id), size_bytes);
}

}  // namespace zinf::aio
