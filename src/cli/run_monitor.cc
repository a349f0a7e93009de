#include "cli/run_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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
  m.kernels = r.kernels;
  return m;
}

std::vector<std::pair<std::string, double>> StepScalars(const StepMetrics& m) {
  auto f = [](double v) { return v; };
  return {{"Train/Samples/train_loss", f(m.loss)},
          {"Train/Samples/lr", f(m.lr)},
          {"Train/Samples/loss_scale", f(m.loss_scale)},
          {"Train/Samples/grad_norm", f(m.grad_norm)},
          {"Train/Samples/tokens_per_second", f(m.tokens_per_second)},
          {"Train/Samples/samples", f(static_cast<double>(m.samples))},
          {"Train/Samples/step", f(static_cast<double>(m.step))},
          {"Train/Samples/elapsed_time_ms_total", f(1e3 * m.total_seconds)},
          {"Train/Samples/elapsed_time_ms_compute", f(1e3 * m.compute_seconds)},
          {"Train/Samples/elapsed_time_ms_nvme_wait", f(1e3 * m.nvme_seconds)},
          {"Train/Samples/elapsed_time_ms_pcie_wait", f(1e3 * m.pcie_seconds)},
          {"Train/Samples/elapsed_time_ms_comm", f(1e3 * m.comm_seconds)},
          {"Train/Samples/elapsed_time_ms_optimizer", f(1e3 * m.optimizer_seconds)}};
}

AppendFile::~AppendFile() {
  if (file_ != nullptr) std::fclose(file_);
}

namespace {

// `path` opened with `flags` as a stream in `mode`.
StatusOr<FILE*> OpenStream(const std::string& path, int flags, const char* mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, (flags & O_CREAT) != 0 ? "create" : "open", path);
  FILE* f = ::fdopen(fd, mode);
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "open", path);
  }
  return f;
}

}  // namespace

Status AppendFile::Open(const std::string& path, bool exclusive) {
  ZINF_ASSIGN_OR_RETURN(FILE * f, OpenStream(path, O_WRONLY | O_CREAT | (exclusive ? O_EXCL : O_TRUNC), "w"));
  if (file_ != nullptr) std::fclose(file_);
  file_ = f;
  path_ = path;
  offset_ = 0;
  return Status::Ok();
}

Status AppendFile::Continue(const std::string& path, const std::function<bool(std::string_view line)>& keep) {
  ZINF_ASSIGN_OR_RETURN(FILE * f, OpenStream(path, O_RDWR | O_CREAT, "r+"));
  const int fd = ::fileno(f);
  // The kept prefix: whole lines, each kept, up to the first one that is not.
  int64_t cut = 0;
  char* line = nullptr;
  size_t capacity = 0;
  errno = 0;
  for (ssize_t n; (n = ::getline(&line, &capacity, f)) > 0;) {
    if (line[n - 1] != '\n' || !keep(std::string_view(line, static_cast<size_t>(n - 1)))) break;
    cut += n;
  }
  std::free(line);
  const int read_error = std::ferror(f) ? (errno != 0 ? errno : EIO) : 0;
  if (read_error != 0 || ::ftruncate(fd, cut) != 0 || std::fseek(f, cut, SEEK_SET) != 0) {
    const int err = read_error != 0 ? read_error : errno;
    std::fclose(f);
    return ErrnoStatus(err, read_error != 0 ? "read" : "truncate", path, cut);
  }
  if (file_ != nullptr) std::fclose(file_);
  file_ = f;
  path_ = path;
  offset_ = cut;
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
