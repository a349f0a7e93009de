// Checks that a directory can hold NVMe swap: it exists and is writable,
// O_DIRECT works there, which alignment it needs, whether it has the room a
// config needs, and how fast a short sequential write and read go.
//
// Thread-safety: plain function; it creates and removes one scratch file
// (".zinf-nvme-check.<pid>") in the directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aio/io_engine.h"

namespace zinf::aio {

struct NvmeCheckOptions {
  int64_t required_bytes = 0;      // room the config needs on this path (0: not checked)
  int64_t test_bytes = 256 << 20;  // speed-test file size; 0 skips the speed test
  IoEngineOptions engine;          // engine for the speed test (block size, qd, threads)
};

struct NvmeCheckReport {
  std::string path;
  bool exists = false;
  bool writable = false;
  bool direct_io = false;           // O_DIRECT open and an aligned write+read worked
  int64_t logical_block_bytes = 0;  // from sysfs (0 when unknown)
  int64_t alignment_bytes = 0;      // what zinf will align to here
  std::string filesystem;           // "ext4", "xfs", "tmpfs", ...
  int64_t free_bytes = -1;          // available to this user (-1 unknown)
  int64_t required_bytes = 0;
  double write_gbps = 0;  // 0 when not measured
  double read_gbps = 0;
  std::string engine;                 // engine used for the speed test
  std::vector<std::string> problems;  // each one a reason the path fails
  std::vector<std::string> notes;     // worth knowing, not failures

  bool ok() const { return problems.empty(); }
};

NvmeCheckReport CheckNvmePath(const std::string& path, const NvmeCheckOptions& options);

}  // namespace zinf::aio
