#include "aio_perf.h"

#include <sys/wait.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace zinf::perf {
namespace {

StatusOr<std::string> Capture(const std::string& command, int* exit_code) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return ErrnoStatus(errno, "popen", command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  *exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  return out;
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string FioCommand(const FioRun& run) {
  const aio::IoEngineOptions& e = run.engine;
  const int64_t per_job = run.size_bytes / e.thread_count;
  std::string c = "fio --name=zinf-compare --output-format=json --thread --group_reporting";
  c += " --filename=" + Quote(run.file);
  if (run.read_percent >= 0) {
    c += " --rw=rw --rwmixread=" + std::to_string(run.read_percent);
  } else {
    c += std::string(" --rw=") + (run.op == aio::IoOp::kRead ? "read" : "write");
  }
  c += " --ioengine=io_uring --direct=1 --fixedbufs --registerfiles";
  if (run.huge_pages) c += " --iomem=shmhuge";
  c += " --bs=" + std::to_string(e.block_size_bytes);
  c += " --iodepth=" + std::to_string(e.queue_depth);
  c += " --iodepth_batch_submit=" + std::to_string(e.single_submit ? 1 : e.queue_depth);
  c += " --iodepth_batch_complete_min=" + std::to_string(e.overlap_events ? 1 : e.queue_depth);
  c += " --numjobs=" + std::to_string(e.thread_count);
  c += " --size=" + std::to_string(per_job);
  c += " --offset_increment=" + std::to_string(per_job);
  return c;
}

StatusOr<double> RunFioSum(const std::vector<FioRun>& runs) {
  double gbps = 0;
  for (const FioRun& run : runs) {
    ZINF_ASSIGN_OR_RETURN(double g, RunFio(run));
    gbps += g;
  }
  return gbps;
}

StatusOr<double> RunFio(const FioRun& run) {
  const std::string cmd = FioCommand(run) + " 2>&1";
  int code = 0;
  ZINF_ASSIGN_OR_RETURN(std::string out, Capture(cmd, &code));
  if (code != 0) return Status::Internal("fio failed (exit " + std::to_string(code) + "): " + out.substr(0, 2000));
  // fio may print warnings before the JSON document.
  const size_t brace = out.find('{');
  if (brace == std::string::npos) return Status::Internal("fio printed no JSON: " + out.substr(0, 2000));
  auto j = nlohmann::json::parse(out.substr(brace), nullptr, false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) {
    return Status::Internal("cannot parse fio's JSON output: " + out.substr(0, 2000));
  }
  const auto& job = j["jobs"][0];
  if (job.value("error", 0) != 0) return Status::IoError("fio reported error " + std::to_string(job.value("error", 0)));
  double bytes_per_s = 0;
  for (const char* key : {"read", "write"}) {
    const bool wanted = run.read_percent >= 0 || (run.op == aio::IoOp::kRead) == (key[0] == 'r');
    if (!wanted) continue;
    if (!job.contains(key) || !job[key].contains("bw_bytes")) return Status::Internal("fio JSON lacks bw_bytes");
    bytes_per_s += job[key]["bw_bytes"].get<double>();
  }
  return bytes_per_s / 1e9;
}

namespace {
constexpr char kNrHugepages[] = "/proc/sys/vm/nr_hugepages";

long ReadLong(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  long v = -1;
  if (std::fscanf(f, "%ld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

bool WriteLong(const char* path, long v) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return false;
  const bool ok = std::fprintf(f, "%ld\n", v) > 0;
  return std::fclose(f) == 0 && ok;
}
}  // namespace

int64_t FioBufferBytes(const FioRun& run) {
  return int64_t{run.engine.queue_depth} * run.engine.block_size_bytes * run.engine.thread_count;
}

FioHugePages::FioHugePages(int64_t bytes) {
  constexpr int64_t kHugePage = int64_t{2} << 20;
  previous_ = ReadLong(kNrHugepages);
  const long want = static_cast<long>((bytes + kHugePage - 1) / kHugePage) * 2 + 4;  // shm rounding, slack
  if (previous_ < 0) {
    description_ = "4 KiB pages (cannot read vm.nr_hugepages)";
  } else if (!WriteLong(kNrHugepages, previous_ + want)) {
    description_ = "4 KiB pages (cannot reserve huge pages: not root?)";
  } else if (ReadLong(kNrHugepages) < previous_ + want) {
    WriteLong(kNrHugepages, previous_);
    description_ = "4 KiB pages (the kernel could not reserve enough huge pages)";
  } else {
    active_ = true;
    description_ = "2 MiB huge pages (" + std::to_string(want) + " reserved for the run)";
  }
}

FioHugePages::~FioHugePages() {
  if (active_) WriteLong(kNrHugepages, previous_);
}

StatusOr<std::string> FioVersion() {
  int code = 0;
  ZINF_ASSIGN_OR_RETURN(std::string out, Capture("fio --version 2>&1", &code));
  if (code != 0) return Status::NotFound("fio is not installed (or not on PATH): it is what zinf compares itself with");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace zinf::perf
