#include "core/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace zinf {

namespace {

// The pid the lock file names, as text for a message.
std::string HolderOf(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  char* end = nullptr;
  const long pid = n > 0 ? std::strtol(buf, &end, 10) : 0;
  if (pid <= 0) return "a process that has not written its pid yet";
  return "process " + std::to_string(pid);
}

}  // namespace

StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open lock file", path);
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = HolderOf(fd);
      ::close(fd);
      return Status::FailedPrecondition(path + " is locked by " + holder + " (another zinf run using this directory)");
    }
    ::close(fd);
    return ErrnoStatus(err, "flock", path);
  }
  // The pid, for the message of whoever is refused next. A failure here
  // costs only that message, not the lock.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "write pid to lock file", path);
  }
  return FileLock(fd, path);
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  // Closing the only descriptor of the open file description drops the lock.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace zinf
