// Filesystem metadata operations besides data I/O: directories, renames,
// directory fsync, free space, random names.
//
// Data bytes never go through here: every byte of a swap file or checkpoint
// goes through aio::IoEngine. What the IoEngine interface has
// no verb for (mkdir, rename, unlink, fsync of a directory, statvfs) lives
// here, with errno turned into a Status naming the path (ErrnoStatus).
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

// mkdir(path, 0755). kFailedPrecondition when it already exists.
Status MakeDirectory(const std::string& path);
// Creates `path` and missing parents (mkdir -p); OK when it exists.
Status MakeDirectories(const std::string& path);
// Writes `contents` to `path` so that a crash leaves either the old file or
// the new one, never a mix: writes `path`.tmp-<random>, fsyncs it, renames it
// over `path`, fsyncs the directory. On an error `path` is untouched and the
// temporary file is removed. For small files (configs, pointers): the bytes
// are written with plain write(2), not through an IoEngine.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
// rename(from, to); `to` is replaced atomically when it is a file.
Status RenamePath(const std::string& from, const std::string& to);
// fsync on the directory itself, so renames and creations in it are durable.
Status SyncDirectory(const std::string& path);
// Removes a file; OK when it does not exist.
Status RemoveFile(const std::string& path);
// Removes a directory tree (best effort on the whole tree; first error returned).
Status RemoveTree(const std::string& path);
bool PathExists(const std::string& path);
// Names of the entries of directory `path` (no "." or ".."), sorted.
StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);
// Bytes an unprivileged writer may still allocate on the filesystem of `path`.
StatusOr<int64_t> FreeBytes(const std::string& path);
// Bytes of disk blocks allocated to file `path` (0 when it does not exist).
int64_t AllocatedBytes(const std::string& path);
// `n` random lowercase hex characters (getrandom).
std::string RandomHex(int n);
// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/". Trailing slashes are ignored.
std::string ParentPath(const std::string& path);
// "a/b/c" -> "c". Trailing slashes are ignored.
std::string BaseName(const std::string& path);
std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace zinf
