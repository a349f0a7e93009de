// Shared by `zinf bench aio` and `zinf tune aio`: running fio with the same
// semantics as a zinf engine configuration, and small statistics.
//
// fio job semantics matched to zinf's: numjobs = thread_count jobs (zinf's
// rings), each covering 1/thread_count of the file (offset_increment),
// bs = block_size, iodepth = queue_depth (per ring), ioengine=io_uring with
// direct=1, fixedbufs and registerfiles (zinf registers buffers and files),
// iodepth_batch_submit = 1 when single_submit else queue_depth, and
// iodepth_batch_complete_min = 1 when overlap_events else queue_depth.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "zinf/status.h"

namespace zinf::perf {

struct FioRun {
  std::string file;
  int64_t size_bytes = 0;
  aio::IoOp op = aio::IoOp::kRead;
  aio::IoEngineOptions engine;
  // 0..100: a mixed sequential job (fio rw=rw) with this share of reads
  // instead of `op` alone; RunFio then returns reads + writes together.
  int read_percent = -1;
  // Give fio huge-page buffers (--iomem=shmhuge); needs a FioHugePages.
  bool huge_pages = false;
};

// Reserves huge pages for fio's I/O buffers while it lives and gives them
// back after (the old vm.nr_hugepages is restored).
//
// Why: zinf's PinnedPool backs its buffers with huge pages, so a 1 MiB
// request is a few physically contiguous segments; fio's default 4 KiB-page
// buffers make 256 segments, which devices with a 254-segment limit (virtio
// disks among them) split in two, and fio then measures the split, not the
// drive. With huge pages on both sides the comparison is like for like.
// Only root can reserve them; elsewhere active() is false and fio keeps its
// default buffers (benchmarks say which in their JSON).
class FioHugePages {
 public:
  // Reserves enough 2 MiB pages for `bytes` of fio buffers (plus slack).
  explicit FioHugePages(int64_t bytes);
  ~FioHugePages();
  FioHugePages(const FioHugePages&) = delete;
  FioHugePages& operator=(const FioHugePages&) = delete;
  bool active() const { return active_; }
  // "2 MiB huge pages" or why not: "4 KiB pages (cannot reserve huge pages: ...)".
  const std::string& description() const { return description_; }

 private:
  bool active_ = false;
  long previous_ = -1;
  std::string description_;
};

// fio's buffer memory for one run of `run`: queue_depth * block_size per job.
int64_t FioBufferBytes(const FioRun& run);

// The fio command line for `run` (JSON output on stdout).
std::string FioCommand(const FioRun& run);
// Runs fio; its aggregate bandwidth in GB/s (1e9 bytes per second).
StatusOr<double> RunFio(const FioRun& run);
// Runs each job in turn (one per NVMe path) and returns the sum of their
// GB/s: the paths' bandwidths add. 0 for no jobs.
StatusOr<double> RunFioSum(const std::vector<FioRun>& runs);
// Whether `fio` is on PATH (its version, or an error).
StatusOr<std::string> FioVersion();

double Median(std::vector<double> v);

// Wall-clock seconds `fn()` takes (steady clock).
template <typename Fn>
double TimeSeconds(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zinf::perf
