// zinf bench aio: sequential write and read of one file through zinf's
// IoEngine and through fio, interleaved on the same file in the same run.
//
// Method. The file is fallocated, written once with a pattern and read back
// and checked (untimed for the comparison: results are checked before they
// are timed). Then each repetition times zinf and fio writes and reads,
// alternating which tool goes first, so drift
// in the device (caches, thermal, neighbours) falls on both alike. Each
// repetition runs each tool twice per op in ABBA order (A alternating between
// repetitions) and, before the reads, one untimed read pass: on a virtual
// disk the host may still be flushing the writes, which would otherwise
// penalise whichever tool reads first. A tool's rate in a repetition is
// 2 x size over its two passes' time. A zinf pass is timed from its first
// submit to its last completion; fio's time is size over its own bw_bytes.
// The figures are medians over repetitions; a ratio is the median of the
// per-repetition zinf/fio ratios.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio/file.h"
#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "aio/throughput.h"
#include "aio_perf.h"
#include "report.h"
#include "cli/command.h"
#include "core/units.h"

namespace zinf::perf {
namespace {

constexpr uint64_t kPatternSeed = 0x5a1f;
constexpr int kBuffersOutstanding = 4;

std::string DefaultFile() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/zinf-bench-aio.dat";
}

int Run(const std::vector<std::string>& args) {
  auto flags = cli::Flags::Parse(
      args, {"file", "size", "block-size", "queue-depth", "threads", "reps", "engine", "request-size", "buffers",
             "html", "json"},
      {"single-submit", "no-overlap-events", "keep-file", "no-fio"});
  if (!flags.ok()) return cli::Fail("bench aio", flags.status(), 2);
  const std::string file = flags->GetOr("file", DefaultFile());
  auto size = flags->GetInt("size", 2 * kGiB);
  auto bs = flags->GetInt("block-size", 1 * kMiB);
  auto qd = flags->GetInt("queue-depth", 32);
  auto threads = flags->GetInt("threads", 1);
  auto reps = flags->GetInt("reps", 3);
  for (const auto* v : {&size, &bs, &qd, &threads, &reps}) {
    if (!v->ok()) return cli::Fail("bench aio", v->status(), 2);
  }
  aio::IoEngineOptions eo;
  eo.block_size_bytes = *bs;
  eo.queue_depth = static_cast<int>(*qd);
  eo.thread_count = static_cast<int>(*threads);
  eo.single_submit = flags->Has("single-submit");
  eo.overlap_events = !flags->Has("no-overlap-events");
  eo.direct_io = aio::DirectIo::kRequire;
  const std::string engine_kind = flags->GetOr("engine", "auto");
  if (engine_kind == "uring") {
    eo.kind = aio::EngineKind::kUring;
  } else if (engine_kind == "posix") {
    eo.kind = aio::EngineKind::kPosix;
  } else if (engine_kind != "auto") {
    return cli::Fail("bench aio", Status::InvalidArgument("--engine: expected auto, uring or posix"), 2);
  }
  Status valid = aio::ValidateOptions(eo);
  if (!valid.ok()) return cli::Fail("bench aio", valid, 2);
  auto request_flag = flags->GetInt("request-size", eo.block_size_bytes * eo.queue_depth * eo.thread_count);
  auto buffers_flag = flags->GetInt("buffers", kBuffersOutstanding);
  for (const auto* v : {&request_flag, &buffers_flag}) {
    if (!v->ok()) return cli::Fail("bench aio", v->status(), 2);
  }
  const int64_t request_bytes = *request_flag;
  const int buffer_count = static_cast<int>(std::max<int64_t>(*buffers_flag, 1));
  if (*size < request_bytes || *size % (eo.block_size_bytes * eo.thread_count) != 0 || *reps < 1 ||
      request_bytes % eo.block_size_bytes != 0) {
    return cli::Fail("bench aio", Status::InvalidArgument(
                                      "--size must be a multiple of block_size x threads and at least "
                                      "--request-size (default block_size x queue_depth x threads), which must be a multiple of "
                                      "block_size; --reps at least 1"), 2);
  }
  const bool use_fio = !flags->Has("no-fio");
  std::string fio_version = "not run";
  if (use_fio) {
    auto v = FioVersion();
    if (!v.ok()) return cli::Fail("bench aio", v.status());
    fio_version = *v;
  }

  auto engine = aio::CreateIoEngine(eo);
  if (!engine.ok()) return cli::Fail("bench aio", engine.status());
  aio::IoEngine& e = **engine;
  auto fid = e.OpenFile(file, aio::OpenOptions{true, false, false});
  if (!fid.ok()) return cli::Fail("bench aio", fid.status());
  aio::PinnedPoolOptions po;
  po.buffer_count = buffer_count;
  po.buffer_bytes = request_bytes;
  po.name = "bench aio buffers";
  auto pool = aio::PinnedPool::Create(po);
  if (!pool.ok()) return cli::Fail("bench aio", pool.status());
  auto region = (*pool)->region();
  Status st = e.RegisterMemory(region.data(), region.size());
  if (!st.ok()) return cli::Fail("bench aio", st);
  std::vector<aio::PinnedBuffer> buffers;
  for (int i = 0; i < buffer_count; ++i) buffers.push_back((*pool)->Acquire());
  const aio::PassTarget target = aio::EngineTarget(e, *fid);

  auto cleanup = [&] {
    buffers.clear();
    e.CloseFile(*fid).IgnoreError();
    if (!flags->Has("keep-file")) std::filesystem::remove(file);
  };
  auto fail = [&](const Status& s) {
    cleanup();
    return cli::Fail("bench aio", s);
  };

  std::fprintf(stderr, "bench aio: %s, %s, %s blocks, qd %d, %d thread(s), engine %s\n", file.c_str(),
               FormatBytes(*size).c_str(), FormatBytes(eo.block_size_bytes).c_str(), eo.queue_depth,
               eo.thread_count, std::string(e.name()).c_str());
  st = e.Allocate(*fid, *size);
  if (!st.ok()) return fail(st);
  // Fill and check: the bytes must be right before the speed counts.
  auto fill = aio::TimedPass(target, aio::IoOp::kWrite, *size, buffers, [](char* d, int64_t off, int64_t len) {
    aio::FillPattern(d, off, len, kPatternSeed);
  });
  if (!fill.ok()) return fail(fill.status());
  auto check = aio::TimedPass(target, aio::IoOp::kRead, *size, buffers, {},
                              [&](const char* d, int64_t off, int64_t len) {
                                return aio::CheckPattern(d, off, len, kPatternSeed, file);
                              });
  if (!check.ok()) return fail(check.status());
  std::fprintf(stderr, "  fill %.2f GB/s, verified read %.2f GB/s (untimed for the comparison)\n", fill->gbps(),
               check->gbps());

  // fio gets huge-page buffers like zinf's pool, where root can reserve them.
  FioHugePages fio_pages(use_fio ? FioBufferBytes(FioRun{file, *size, aio::IoOp::kRead, eo}) : 0);
  if (use_fio) std::fprintf(stderr, "  fio buffers: %s\n", fio_pages.description().c_str());
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  std::vector<double> zr, zw, fr, fw, rr, wr;
  for (int rep = 0; rep < *reps; ++rep) {
    const bool fio_first = rep % 2 == 1;
    // Seconds spent by each tool on its two passes of each op: [write, read].
    double zs[2] = {0, 0}, fs[2] = {0, 0};
    Status pass_error;
    auto timed = [&](bool run_fio, aio::IoOp op) {
      const int k = op == aio::IoOp::kWrite ? 0 : 1;
      if (run_fio) {
        if (!use_fio) return;
        FioRun run{file, *size, op, eo};
        run.huge_pages = fio_pages.active();
        auto g = RunFio(run);
        if (!g.ok()) {
          pass_error = g.status();
          return;
        }
        fs[k] += static_cast<double>(*size) / (*g * 1e9);
      } else {
        auto p = aio::TimedPass(target, op, *size, buffers);
        if (!p.ok()) {
          pass_error = p.status();
          return;
        }
        zs[k] += p->seconds;
      }
    };
    for (aio::IoOp op : {aio::IoOp::kWrite, aio::IoOp::kRead}) {
      if (op == aio::IoOp::kRead) {
        // Settle: the host behind a virtual disk may still be flushing the
        // writes; an untimed read absorbs that instead of the first timed one.
        auto settle = aio::TimedPass(target, aio::IoOp::kRead, *size, buffers);
        if (!settle.ok()) return fail(settle.status());
      }
      // ABBA order within the repetition, A alternating between repetitions.
      for (bool run_fio : {fio_first, !fio_first, !fio_first, fio_first}) {
        timed(run_fio, op);
        if (!pass_error.ok()) return fail(pass_error);
      }
    }
    const double two = 2.0 * static_cast<double>(*size) / 1e9;
    double z[2] = {two / zs[0], two / zs[1]};
    double f[2] = {use_fio ? two / fs[0] : 0, use_fio ? two / fs[1] : 0};
    std::fprintf(stderr, "  rep %d: zinf write %.3f read %.3f GB/s | fio write %.3f read %.3f GB/s\n", rep + 1,
                 z[0], z[1], f[0], f[1]);
    zw.push_back(z[0]);
    zr.push_back(z[1]);
    nlohmann::ordered_json r = {{"rep", rep + 1}, {"first", fio_first ? "fio" : "zinf"},
                                {"write_gbps", z[0]}, {"read_gbps", z[1]}};
    if (use_fio) {
      fw.push_back(f[0]);
      fr.push_back(f[1]);
      wr.push_back(z[0] / f[0]);
      rr.push_back(z[1] / f[1]);
      r["fio_write_gbps"] = f[0];
      r["fio_read_gbps"] = f[1];
      r["write_ratio"] = wr.back();
      r["read_ratio"] = rr.back();
    }
    runs.push_back(r);
  }

  nlohmann::ordered_json out;
  out["benchmark"] = "aio";
  out["file"] = file;
  out["size_bytes"] = *size;
  out["block_size_bytes"] = eo.block_size_bytes;
  out["queue_depth"] = eo.queue_depth;
  out["thread_count"] = eo.thread_count;
  out["single_submit"] = eo.single_submit;
  out["overlap_events"] = eo.overlap_events;
  out["engine"] = std::string(e.name());
  out["request_bytes"] = request_bytes;
  out["buffers"] = buffer_count;
  out["direct_io"] = e.file_info(*fid).direct;
  out["repetitions"] = *reps;
  out["read_gbps"] = Median(zr);
  out["write_gbps"] = Median(zw);
  if (use_fio) {
    out["fio_read_gbps"] = Median(fr);
    out["fio_write_gbps"] = Median(fw);
    out["read_ratio"] = Median(rr);
    out["write_ratio"] = Median(wr);
  } else {
    out["fio_read_gbps"] = nullptr;
    out["fio_write_gbps"] = nullptr;
    out["read_ratio"] = nullptr;
    out["write_ratio"] = nullptr;
  }
  out["units"] = "GB/s = 1e9 bytes per second; *_gbps and *_ratio are medians over repetitions";
  out["compared"] =
      "Sequential write then read of the whole file, same file, interleaved: per repetition each tool "
      "writes twice then (after one untimed settle read) reads twice in ABBA order, A alternating between "
      "repetitions; a tool's rate is 2 x size over the time of its two passes. zinf: IoEngine requests of request_bytes (default block_size x queue_depth x "
      "thread_count) from `buffers` pinned, registered buffers kept outstanding; the engine cuts them into block_size pieces spread over "
      "thread_count io_uring rings, each with up to queue_depth in flight; timed from first submit to last "
      "completion. fio: ioengine=io_uring direct=1 fixedbufs registerfiles, numjobs=thread_count jobs each "
      "over 1/thread_count of the file, bs=block_size, iodepth=queue_depth, iodepth_batch_submit and "
      "iodepth_batch_complete_min from single_submit and overlap_events; fio's own bw_bytes. The file was "
      "written with a pattern and read back and checked before timing. Buffers: zinf's PinnedPool uses "
      "transparent huge pages; fio gets huge pages too (--iomem=shmhuge, vm.nr_hugepages raised for the run "
      "and restored) when it can be reserved, see fio_buffers; with 4 KiB-page buffers a device that limits "
      "segments per request (virtio-blk: 254) splits each 1 MiB request in two and fio under-reports it.";
  out["fio_buffers"] = use_fio ? fio_pages.description() : "";
  out["fio_version"] = fio_version;
  FioRun shown{file, *size, aio::IoOp::kRead, eo};
  shown.huge_pages = fio_pages.active();
  out["fio_command_read"] = use_fio ? FioCommand(shown) : "";
  out["verified"] = true;
  out["runs"] = runs;
  HtmlReport report("zinf bench aio: " + FormatBytes(*size) + ", " + FormatBytes(eo.block_size_bytes) +
                    " blocks, queue depth " + std::to_string(eo.queue_depth));
  report.AddParagraph(out["compared"].get<std::string>());
  report.AddTable("Key figures (medians over repetitions, GB/s)", {"", "zinf", "fio", "zinf / fio"},
                  {{"write", FormatFigure(Median(zw)), use_fio ? FormatFigure(Median(fw)) : "not run",
                    use_fio ? FormatFigure(Median(wr)) : ""},
                   {"read", FormatFigure(Median(zr)), use_fio ? FormatFigure(Median(fr)) : "not run",
                    use_fio ? FormatFigure(Median(rr)) : ""}});
  BarChart chart;
  chart.title = "Bandwidth per repetition (GB/s)";
  chart.x_label = "repetition";
  chart.y_label = "GB/s";
  chart.series = {{"zinf write", zw}, {"fio write", fw}, {"zinf read", zr}, {"fio read", fr}};
  for (int rep = 0; rep < *reps; ++rep) chart.categories.push_back("rep " + std::to_string(rep + 1));
  report.AddBarChart(chart);
  Status emitted = EmitResult(out.dump(2), flags->GetOr("json", ""), flags->GetOr("html", ""), report);
  cleanup();
  return emitted.ok() ? 0 : cli::Fail("bench aio", emitted);
}

ZINF_COMMAND({"bench aio", "zinf's NVMe read/write speed against fio on the same file",
              "bench aio [--file PATH] [--size 2G] [--block-size 1M] [--queue-depth 32] [--threads 1]\n"
              "          [--reps 3] [--single-submit] [--no-overlap-events] [--engine auto|uring|posix]\n"
              "          [--request-size B] [--buffers N] [--keep-file] [--no-fio] [--html OUT.html] [--json OUT.json]\n"
              "  Writes and reads PATH (default $TMPDIR/zinf-bench-aio.dat) through zinf and through\n"
              "  fio (io_uring, O_DIRECT, same bs / iodepth / numjobs), interleaved, --reps times.\n"
              "  Prints JSON: read_gbps, write_gbps, fio_read_gbps, fio_write_gbps, read_ratio,\n"
              "  write_ratio (medians) and what was compared. Progress goes to stderr. --html writes\n"
              "  a page with the figures and a chart per repetition; --json a copy of the JSON.",
              Run});

}  // namespace
}  // namespace zinf::perf
