#include "cli/run_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace zinf::cli {

StepMetrics MakeStepMetrics(const model::StepReport& r, int64_t samples) {
  StepMetrics m;
  m.step = r.step;
  m.samples = samples;
  m.loss = r.loss;
  m.lr = r.lr;
  m.grad_norm = r.grad_norm;
  m.loss_scale = r.loss_scale;
  m.applied = r.applied;
  m.tokens = r.tokens;
  m.tokens_per_second = static_cast<double>(r.tokens) / std::max(r.seconds, 1e-9);
  m.total_seconds = r.seconds;
  m.compute_seconds = r.compute_seconds;
  m.nvme_seconds = static_cast<double>(r.engine.nvme_wait_ns) / 1e9;
  m.pcie_seconds = static_cast<double>(r.engine.fetch_wait_ns) / 1e9;
  m.comm_seconds = static_cast<double>(r.engine.allgather_ns + r.engine.reduce_scatter_ns) / 1e9;
  m.optimizer_seconds = static_cast<double>(r.engine.optimizer_ns) / 1e9;
  m.engine = r.engine;
  return m;
}

AppendFile::~AppendFile() {
  if (file_ != nullptr) std::fclose(file_);
}

Status AppendFile::Open(const std::string& path, bool exclusive) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0644);
  if (fd < 0) return ErrnoStatus(errno, "create", path);
  FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "open", path);
  }
  if (file_ != nullptr) std::fclose(file_);
  file_ = f;
  path_ = path;
  offset_ = 0;
  return Status::Ok();
}

Status AppendFile::Append(std::string_view bytes) {
  if (file_ == nullptr) return Status::FailedPrecondition("append to a file that is not open");
  errno = 0;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() || std::fflush(file_) != 0) {
    return ErrnoStatus(errno != 0 ? errno : EIO, "write", path_, offset_, static_cast<int64_t>(bytes.size()));
  }
  offset_ += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

}  // namespace zinf::cli
