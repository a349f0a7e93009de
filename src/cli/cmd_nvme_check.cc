// zinf nvme-check PATH...: can these directories hold zinf's NVMe swap?
//
// Space rule (--config with --params N): the whole model's offloaded state
// on this node, split evenly over the nvme_paths that hold it:
//   offload_param.device = nvme:      2 bytes per parameter (the 16-bit working copy)
//   offload_optimizer.device = nvme: 16 bytes per parameter (fp32 master weights,
//                                    Adam m and v, fp32 gradient accumulator)
// A path listed by both offloads needs both shares. Add 10% for alignment
// padding and extents. Checkpoints are written elsewhere and not counted.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "aio/nvme_check.h"
#include "cli/command.h"
#include "core/units.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

std::string Canonical(const std::string& p) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

// Bytes each path needs under the rule above, keyed by canonical path.
std::map<std::string, int64_t> RequiredBytes(const Config& config, int64_t params) {
  std::map<std::string, double> need;
  auto add = [&](const std::vector<std::string>& paths, double bytes_per_param) {
    if (paths.empty()) return;
    const double share = bytes_per_param * static_cast<double>(params) / static_cast<double>(paths.size());
    for (const auto& p : paths) need[Canonical(p)] += share;
  };
  if (config.zero.offload_param.device == OffloadDevice::kNvme) add(config.zero.offload_param.nvme_paths, 2.0);
  if (config.zero.offload_optimizer.device == OffloadDevice::kNvme) {
    add(config.zero.offload_optimizer.nvme_paths, 16.0);
  }
  std::map<std::string, int64_t> out;
  for (const auto& [p, bytes] : need) out[p] = static_cast<int64_t>(bytes * 1.1);
  return out;
}

int Run(const std::vector<std::string>& args) {
  auto flags =
      Flags::Parse(args, {"config", "params", "test-size", "block-size", "queue-depth", "threads"}, {"no-speed"});
  if (!flags.ok()) return Fail("nvme-check", flags.status(), 2);
  std::vector<std::string> paths = flags->positionals();
  std::map<std::string, int64_t> required;
  aio::IoEngineOptions engine;
  engine.queue_depth = 32;
  if (auto path = flags->Get("config")) {
    auto config = LoadConfigFile(*path);
    if (!config.ok()) return Fail("nvme-check", config.status(), 2);
    Status st = ResolveAuto(*config, AutoContext{});
    if (!st.ok()) return Fail("nvme-check", st, 2);
    engine = aio::FromAioConfig(config->aio);
    if (paths.empty()) {
      std::set<std::string> seen;
      for (const auto* list : {&config->zero.offload_param.nvme_paths, &config->zero.offload_optimizer.nvme_paths}) {
        for (const auto& p : *list) {
          if (seen.insert(p).second) paths.push_back(p);
        }
      }
    }
    auto params = flags->GetInt("params", 0);
    if (!params.ok()) return Fail("nvme-check", params.status(), 2);
    if (*params > 0) {
      required = RequiredBytes(*config, *params);
    } else if (config->offloads_to_nvme()) {
      std::fprintf(stderr, "note: pass --params N (the model's parameter count) to check free space\n");
    }
  }
  if (paths.empty()) {
    return Fail("nvme-check", Status::InvalidArgument("give one or more directories, or --config with nvme_paths"), 2);
  }
  auto bs = flags->GetInt("block-size", engine.block_size_bytes);
  auto qd = flags->GetInt("queue-depth", engine.queue_depth);
  auto threads = flags->GetInt("threads", engine.thread_count);
  auto test = flags->GetInt("test-size", 256 * kMiB);
  for (const auto* v : {&bs, &qd, &threads, &test}) {
    if (!v->ok()) return Fail("nvme-check", v->status(), 2);
  }
  engine.block_size_bytes = *bs;
  engine.queue_depth = static_cast<int>(*qd);
  engine.thread_count = static_cast<int>(*threads);
  Status valid = aio::ValidateOptions(engine);
  if (!valid.ok()) return Fail("nvme-check", valid, 2);

  int failed = 0;
  for (const std::string& path : paths) {
    aio::NvmeCheckOptions o;
    o.engine = engine;
    o.test_bytes = flags->Has("no-speed") ? 0 : *test;
    auto it = required.find(Canonical(path));
    o.required_bytes = it == required.end() ? 0 : it->second;
    const aio::NvmeCheckReport r = aio::CheckNvmePath(path, o);
    std::printf("%s: %s\n", path.c_str(), r.ok() ? "OK" : "FAIL");
    std::printf("  exists: %s, writable: %s\n", r.exists ? "yes" : "no", r.writable ? "yes" : "no");
    if (r.exists) {
      std::printf("  filesystem: %s, logical block: %s, O_DIRECT: %s, alignment: %s\n", r.filesystem.c_str(),
                  r.logical_block_bytes > 0 ? FormatBytes(r.logical_block_bytes).c_str() : "unknown",
                  r.direct_io ? "works" : "no",
                  r.alignment_bytes > 0 ? FormatBytes(r.alignment_bytes).c_str() : "unknown");
      std::printf("  free: %s", r.free_bytes >= 0 ? FormatBytes(r.free_bytes).c_str() : "unknown");
      if (r.required_bytes > 0) std::printf(", needed: %s", FormatBytes(r.required_bytes).c_str());
      std::printf("\n");
    }
    if (r.write_gbps > 0) {
      std::printf("  speed (%s, %s file, %s blocks, qd %d x %d threads): write %.2f GB/s, read %.2f GB/s\n",
                  r.engine.c_str(), FormatBytes(o.test_bytes).c_str(), FormatBytes(engine.block_size_bytes).c_str(),
                  engine.queue_depth, engine.thread_count, r.write_gbps, r.read_gbps);
    }
    for (const auto& p : r.problems) std::printf("  problem: %s\n", p.c_str());
    for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
    if (!r.ok()) ++failed;
  }
  if (failed > 0) std::fprintf(stderr, "nvme-check: %d of %zu paths failed\n", failed, paths.size());
  return failed > 0 ? 1 : 0;
}

ZINF_COMMAND({"nvme-check", "check directories for NVMe swap: O_DIRECT, alignment, free space, speed",
              "nvme-check [PATH...] [--config FILE [--params N]] [--test-size 256M] [--block-size B]\n"
              "           [--queue-depth Q] [--threads T] [--no-speed]\n"
              "  For each directory: exists and writable, O_DIRECT works (an aligned write read\n"
              "  back), logical block size and the alignment zinf will use, free space, and a\n"
              "  short sequential write and read (speed test). Exit 1 when any path fails.\n"
              "  Without PATHs, checks the config's offload nvme_paths. Engine settings come from\n"
              "  the config's aio section (flags override; default queue depth 32).\n"
              "  Space needed (--params N): 2 bytes per parameter for offload_param=nvme and 16\n"
              "  for offload_optimizer=nvme (fp32 master, Adam m, v, fp32 gradients), split\n"
              "  evenly over each offload's nvme_paths, plus 10%.",
              Run});

}  // namespace
}  // namespace zinf::cli
