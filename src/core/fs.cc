#include "core/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace zinf {

Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno == EEXIST) return Status::FailedPrecondition("mkdir " + path + ": already exists");
    return ErrnoStatus(errno, "mkdir", path);
  }
  return Status::Ok();
}

Status MakeDirectories(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("mkdir -p: empty path");
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (prefix.empty() || prefix == "/") continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus(errno, "mkdir", prefix);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(path + " exists and is not a directory");
  return Status::Ok();
}

Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "rename " + from + " to", to);
  return Status::Ok();
}

Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open directory", path);
  Status s;
  if (::fsync(fd) != 0) s = ErrnoStatus(errno, "fsync directory", path);
  ::close(fd);
  return s;
}

Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink", path);
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoStatus(errno, "stat", path);
  }
  if (!S_ISDIR(st.st_mode)) return RemoveFile(path);
  Status first;
  auto entries = ListDirectory(path);
  if (!entries.ok()) return entries.status();
  for (const std::string& name : *entries) {
    Status s = RemoveTree(JoinPath(path, name));
    if (first.ok() && !s.ok()) first = s;
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT && first.ok()) first = ErrnoStatus(errno, "rmdir", path);
  return first;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, "opendir", path);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(dir);
  if (err != 0) return ErrnoStatus(err, "readdir", path);
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<int64_t> FreeBytes(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return ErrnoStatus(errno, "statvfs", path);
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

int64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_blocks) * 512;
}

std::string RandomHex(int n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(static_cast<size_t>(n));
  unsigned char bytes[64];
  while (static_cast<int>(out.size()) < n) {
    const ssize_t got = ::getrandom(bytes, sizeof(bytes), 0);
    if (got <= 0) {
      // getrandom cannot fail for small requests on Linux >= 3.17 except by
      // EINTR; fall back to the pid and a counter so a name is still unique.
      static unsigned counter = 0;
      const unsigned v = static_cast<unsigned>(::getpid()) * 2654435761u + counter++;
      for (int i = 0; i < 8 && static_cast<int>(out.size()) < n; ++i) out.push_back(kDigits[(v >> (4 * i)) & 15]);
      continue;
    }
    for (ssize_t i = 0; i < got && static_cast<int>(out.size()) < n; ++i) out.push_back(kDigits[bytes[i] & 15]);
  }
  return out;
}

namespace {
std::string StripTrailingSlashes(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}
}  // namespace

std::string ParentPath(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp-" + RandomHex(8);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open", tmp);
  auto fail = [&](Status st) {
    ::unlink(tmp.c_str());
    return st;
  };
  int64_t done = 0;
  while (done < static_cast<int64_t>(contents.size())) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - static_cast<size_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return fail(ErrnoStatus(err, "write", tmp, done, static_cast<int64_t>(contents.size()) - done));
    }
    done += n;
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(ErrnoStatus(err, "fsync", tmp));
  }
  if (::close(fd) != 0) return fail(ErrnoStatus(errno, "close", tmp));
  if (Status st = RenamePath(tmp, path); !st.ok()) return fail(st);
  return SyncDirectory(ParentPath(path));
}

}  // namespace zinf
