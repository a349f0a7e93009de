#include "aio/nvme_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "aio/file.h"
#include "aio/pinned_pool.h"
#include "aio/throughput.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

std::string FilesystemOf(const std::string& path) {
  // The longest mount point that prefixes the path, from /proc/self/mounts.
  std::error_code ec;
  const std::string canon = std::filesystem::weakly_canonical(path, ec).string();
  std::ifstream mounts("/proc/self/mounts");
  std::string dev, mnt, type, rest;
  std::string best_type = "unknown";
  size_t best_len = 0;
  while (mounts >> dev >> mnt >> type && std::getline(mounts, rest)) {
    const bool prefix = canon == mnt || (canon.rfind(mnt, 0) == 0 && (mnt == "/" || canon[mnt.size()] == '/'));
    if (prefix && mnt.size() >= best_len) {
      best_len = mnt.size();
      best_type = type;
    }
  }
  return best_type;
}

}  // namespace

NvmeCheckReport CheckNvmePath(const std::string& path, const NvmeCheckOptions& options) {
  NvmeCheckReport r;
  r.path = path;
  r.required_bytes = options.required_bytes;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    r.problems.push_back("does not exist (create the directory, one per drive)");
    return r;
  }
  r.exists = true;
  if (!std::filesystem::is_directory(path, ec)) {
    r.problems.push_back("is not a directory");
    return r;
  }
  r.filesystem = FilesystemOf(path);
  if (struct ::stat st = {}; ::stat(path.c_str(), &st) == 0) r.logical_block_bytes = LogicalBlockSize(st.st_dev);
  struct ::statvfs vfs = {};
  if (::statvfs(path.c_str(), &vfs) == 0) {
    r.free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  }
  if (::access(path.c_str(), W_OK) != 0) {
    r.problems.push_back(std::string("not writable: ") + std::strerror(errno));
    return r;
  }
  r.writable = true;
  if (r.required_bytes > 0 && r.free_bytes >= 0 && r.free_bytes < r.required_bytes) {
    r.problems.push_back("needs " + FormatBytes(r.required_bytes) + " but only " + FormatBytes(r.free_bytes) +
                         " is free");
  }

  const std::string scratch =
      (std::filesystem::path(path) / (".zinf-nvme-check." + std::to_string(::getpid()))).string();
  IoEngineOptions eo = options.engine;
  eo.direct_io = DirectIo::kRequire;
  auto engine = CreateIoEngine(eo);
  if (!engine.ok()) {
    r.problems.push_back("cannot start an I/O engine: " + engine.status().ToString());
    return r;
  }
  r.engine = std::string((*engine)->name());
  auto file = (*engine)->OpenFile(scratch, OpenOptions{true, true, false});
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kUnavailable) {
      r.problems.push_back("O_DIRECT is refused by this filesystem (" + r.filesystem +
                           "); swap would go through the page cache");
    } else {
      r.problems.push_back("cannot create a file: " + file.status().ToString());
    }
    ::unlink(scratch.c_str());
    return r;
  }
  IoEngine& e = **engine;
  r.alignment_bytes = e.file_info(*file).alignment_bytes;

  // A small aligned write + read back, checked, proves O_DIRECT really works.
  const int64_t test = options.test_bytes > 0 ? AlignUp(options.test_bytes, 4 * kMiB) : 0;
  const int64_t buffer_bytes =
      std::max<int64_t>(std::min<int64_t>(eo.block_size_bytes * eo.queue_depth, 64 * kMiB), r.alignment_bytes);
  PinnedPoolOptions po;
  po.buffer_count = 4;
  po.buffer_bytes = buffer_bytes;
  po.name = "nvme-check buffers";
  auto pool = PinnedPool::Create(po);
  Status st = pool.status();
  std::vector<PinnedBuffer> buffers;
  if (st.ok()) {
    auto region = (*pool)->region();
    st = e.RegisterMemory(region.data(), region.size());
    for (int i = 0; st.ok() && i < 4; ++i) buffers.push_back((*pool)->Acquire());
  }
  if (st.ok()) {
    FillPattern(buffers[0].data(), 0, r.alignment_bytes, 7);
    st = e.Write(*file, 0, buffers[0].data(), r.alignment_bytes);
    if (st.ok()) {
      std::memset(buffers[0].data(), 0, static_cast<size_t>(r.alignment_bytes));
      st = e.Read(*file, 0, buffers[0].data(), r.alignment_bytes);
    }
    if (st.ok()) st = CheckPattern(buffers[0].data(), 0, r.alignment_bytes, 7, scratch);
    if (st.ok()) {
      r.direct_io = true;
    } else {
      r.problems.push_back("O_DIRECT write/read failed: " + st.ToString());
    }
  }
  if (st.ok() && test > 0) {
    if (r.free_bytes >= 0 && r.free_bytes < 2 * test) {
      r.notes.push_back("speed test skipped: not enough free space");
    } else {
      st = e.Allocate(*file, test);
      const PassTarget target = EngineTarget(e, *file);
      const uint64_t seed = 11;
      auto w = st.ok() ? TimedPass(target, IoOp::kWrite, test, buffers,
                                   [&](char* d, int64_t off, int64_t len) { FillPattern(d, off, len, seed); })
                       : StatusOr<PassResult>(st);
      auto rd = w.ok() ? TimedPass(target, IoOp::kRead, test, buffers, {},
                                   [&](const char* d, int64_t off, int64_t len) {
                                     return CheckPattern(d, off, len, seed, scratch);
                                   })
                       : StatusOr<PassResult>(w.status());
      if (!rd.ok()) {
        r.problems.push_back("speed test failed: " + rd.status().ToString());
      } else {
        r.write_gbps = w->gbps();
        r.read_gbps = rd->gbps();
      }
    }
  }
  buffers.clear();
  (*engine)->CloseFile(*file).IgnoreError();
  ::unlink(scratch.c_str());
  if (r.filesystem == "tmpfs" || r.filesystem == "ramfs") {
    r.notes.push_back(r.filesystem + " is memory, not a drive: swapping there only moves RAM around");
  }
  return r;
}

}  // namespace zinf::aio
