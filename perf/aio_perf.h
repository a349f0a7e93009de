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
};

// The fio command line for `run` (JSON output on stdout).
std::string FioCommand(const FioRun& run);
// Runs fio; its aggregate bandwidth in GB/s (1e9 bytes per second).
StatusOr<double> RunFio(const FioRun& run);
// Whether `fio` is on PATH (its version, or an error).
StatusOr<std::string> FioVersion();

double Median(std::vector<double> v);

}  // namespace zinf::perf
