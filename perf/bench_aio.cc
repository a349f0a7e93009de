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
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio/file.h"
#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "aio/throughput.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "core/units.h"
#include "report.h"
#include "scratch.h"

namespace zinf::perf {
namespace {

constexpr const char* kName = "bench aio";
constexpr uint64_t kPatternSeed = 0x5a1f;
constexpr int kBuffersOutstanding = 4;

std::string DefaultFile() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/zinf-bench-aio.dat";
}

// What the flags ask for (a bad one is a usage error, exit code 2).
struct Options {
  std::string file;
  int64_t size = 0;
  int reps = 0;
  aio::IoEngineOptions engine;
  int64_t request_bytes = 0;
  int buffer_count = 0;
  bool use_fio = true;
  bool keep_file = false;
  std::string html_path, json_path;
};

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  ZINF_ASSIGN_OR_RETURN(cli::Flags flags,
                        cli::Flags::Parse(args,
                                          {"file", "size", "block-size", "queue-depth", "threads", "reps", "engine",
                                           "request-size", "buffers", "html", "json"},
                                          {"single-submit", "no-overlap-events", "keep-file", "no-fio"}));
  Options o;
  o.file = flags.GetOr("file", DefaultFile());
  auto size = flags.GetInt("size", 2 * kGiB);
  auto bs = flags.GetInt("block-size", 1 * kMiB);
  auto qd = flags.GetInt("queue-depth", 32);
  auto threads = flags.GetInt("threads", 1);
  auto reps = flags.GetInt("reps", 3);
  for (const auto* v : {&size, &bs, &qd, &threads, &reps}) {
    if (!v->ok()) return v->status();
  }
  aio::IoEngineOptions& eo = o.engine;
  eo.block_size_bytes = *bs;
  eo.queue_depth = static_cast<int>(*qd);
  eo.thread_count = static_cast<int>(*threads);
  eo.single_submit = flags.Has("single-submit");
  eo.overlap_events = !flags.Has("no-overlap-events");
  eo.direct_io = aio::DirectIo::kRequire;
  const std::string engine_kind = flags.GetOr("engine", "auto");
  if (engine_kind == "uring") {
    eo.kind = aio::EngineKind::kUring;
  } else if (engine_kind == "posix") {
    eo.kind = aio::EngineKind::kPosix;
  } else if (engine_kind != "auto") {
    return Status::InvalidArgument("--engine: expected auto, uring or posix");
  }
  ZINF_RETURN_IF_ERROR(aio::ValidateOptions(eo));
  ZINF_ASSIGN_OR_RETURN(o.request_bytes,
                        flags.GetInt("request-size", eo.block_size_bytes * eo.queue_depth * eo.thread_count));
  ZINF_ASSIGN_OR_RETURN(const int64_t buffers, flags.GetInt("buffers", kBuffersOutstanding));
  o.buffer_count = static_cast<int>(std::max<int64_t>(buffers, 1));
  if (*size < o.request_bytes || *size % (eo.block_size_bytes * eo.thread_count) != 0 || *reps < 1 ||
      o.request_bytes % eo.block_size_bytes != 0) {
    return Status::InvalidArgument(
        "--size must be a multiple of block_size x threads and at least "
        "--request-size (default block_size x queue_depth x threads), which must be a multiple of "
        "block_size; --reps at least 1");
  }
  o.size = *size;
  o.reps = static_cast<int>(*reps);
  o.use_fio = !flags.Has("no-fio");
  o.keep_file = flags.Has("keep-file");
  o.html_path = flags.GetOr("html", "");
  o.json_path = flags.GetOr("json", "");
  return o;
}

// zinf's side: the engine with the file open and the pinned, registered
// buffers kept outstanding. When it goes, the buffers are released, the
// file closed and (unless --keep-file) removed.
struct Rig {
  Rig() = default;
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;
  ~Rig() {
    buffers.clear();
    if (engine && fid) engine->CloseFile(*fid).IgnoreError();
  }

  ScratchFiles file;  // declared first: removed after the engine closes it
  std::unique_ptr<aio::IoEngine> engine;
  std::optional<aio::FileId> fid;
  std::unique_ptr<aio::PinnedPool> pool;
  std::vector<aio::PinnedBuffer> buffers;
  aio::PassTarget target;
};

StatusOr<std::unique_ptr<Rig>> CreateRig(const Options& o) {
  auto rig = std::make_unique<Rig>();
  ZINF_ASSIGN_OR_RETURN(rig->engine, aio::CreateIoEngine(o.engine));
  aio::IoEngine& e = *rig->engine;
  ZINF_ASSIGN_OR_RETURN(rig->fid, e.OpenFile(o.file, aio::OpenOptions{true, false, false}));
  if (!o.keep_file) rig->file.Add(o.file);
  aio::PinnedPoolOptions po;
  po.buffer_count = o.buffer_count;
  po.buffer_bytes = o.request_bytes;
  po.name = "bench aio buffers";
  ZINF_ASSIGN_OR_RETURN(rig->pool, aio::PinnedPool::Create(po));
  auto region = rig->pool->region();
  ZINF_RETURN_IF_ERROR(e.RegisterMemory(region.data(), region.size()));
  for (int i = 0; i < o.buffer_count; ++i) rig->buffers.push_back(rig->pool->Acquire());
  rig->target = aio::EngineTarget(e, *rig->fid);
  return rig;
}

// Fill and check: the bytes must be right before the speed counts.
Status FillAndCheck(const Options& o, Rig& rig) {
  ZINF_RETURN_IF_ERROR(rig.engine->Allocate(*rig.fid, o.size));
  ZINF_ASSIGN_OR_RETURN(aio::PassResult fill, aio::TimedPass(rig.target, aio::IoOp::kWrite, o.size, rig.buffers,
                                                             [](char* d, int64_t off, int64_t len) {
                                                               aio::FillPattern(d, off, len, kPatternSeed);
                                                             }));
  ZINF_ASSIGN_OR_RETURN(aio::PassResult check, aio::TimedPass(rig.target, aio::IoOp::kRead, o.size, rig.buffers, {},
                                                              [&](const char* d, int64_t off, int64_t len) {
                                                                return aio::CheckPattern(d, off, len, kPatternSeed,
                                                                                         o.file);
                                                              }));
  std::fprintf(stderr, "  fill %.2f GB/s, verified read %.2f GB/s (untimed for the comparison)\n", fill.gbps(),
               check.gbps());
  return Status::Ok();
}

// Seconds one tool needs for one pass of `op` over the file: zinf's from its
// first submit to its last completion, fio's from its own bw_bytes.
StatusOr<double> TimedPassSeconds(const Options& o, Rig& rig, const FioHugePages& fio_pages, bool run_fio,
                                  aio::IoOp op) {
  if (run_fio) {
    FioRun run{o.file, o.size, op, o.engine};
    run.huge_pages = fio_pages.active();
    ZINF_ASSIGN_OR_RETURN(const double gbps, RunFio(run));
    return static_cast<double>(o.size) / (gbps * 1e9);
  }
  ZINF_ASSIGN_OR_RETURN(aio::PassResult p, aio::TimedPass(rig.target, op, o.size, rig.buffers));
  return p.seconds;
}

// One repetition's rates in GB/s, [write, read] (fio's 0 without fio).
struct RepRates {
  double zinf[2] = {0, 0};
  double fio[2] = {0, 0};
};

// Each tool writes twice, then (after one untimed settle read) reads twice,
// in ABBA order with A = fio on odd repetitions.
StatusOr<RepRates> MeasureRep(const Options& o, Rig& rig, const FioHugePages& fio_pages, int rep) {
  const bool fio_first = rep % 2 == 1;
  // Seconds spent by each tool on its two passes of each op: [write, read].
  double zs[2] = {0, 0}, fs[2] = {0, 0};
  for (aio::IoOp op : {aio::IoOp::kWrite, aio::IoOp::kRead}) {
    const int k = op == aio::IoOp::kWrite ? 0 : 1;
    if (op == aio::IoOp::kRead) {
      // Settle: the host behind a virtual disk may still be flushing the
      // writes; an untimed read absorbs that instead of the first timed one.
      ZINF_RETURN_IF_ERROR(aio::TimedPass(rig.target, aio::IoOp::kRead, o.size, rig.buffers).status());
    }
    for (bool run_fio : {fio_first, !fio_first, !fio_first, fio_first}) {
      if (run_fio && !o.use_fio) continue;
      ZINF_ASSIGN_OR_RETURN(const double seconds, TimedPassSeconds(o, rig, fio_pages, run_fio, op));
      (run_fio ? fs : zs)[k] += seconds;
    }
  }
  const double two = 2.0 * static_cast<double>(o.size) / 1e9;
  RepRates r;
  r.zinf[0] = two / zs[0];
  r.zinf[1] = two / zs[1];
  r.fio[0] = o.use_fio ? two / fs[0] : 0;
  r.fio[1] = o.use_fio ? two / fs[1] : 0;
  return r;
}

// Per repetition rates (GB/s) and zinf / fio ratios, and each repetition as JSON.
struct Rates {
  std::vector<double> zr, zw, fr, fw, rr, wr;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
};

StatusOr<Rates> Measure(const Options& o, Rig& rig, const FioHugePages& fio_pages) {
  Rates out;
  for (int rep = 0; rep < o.reps; ++rep) {
    ZINF_ASSIGN_OR_RETURN(const RepRates x, MeasureRep(o, rig, fio_pages, rep));
    const double* z = x.zinf;
    const double* f = x.fio;
    std::fprintf(stderr, "  rep %d: zinf write %.3f read %.3f GB/s | fio write %.3f read %.3f GB/s\n", rep + 1, z[0],
                 z[1], f[0], f[1]);
    out.zw.push_back(z[0]);
    out.zr.push_back(z[1]);
    nlohmann::ordered_json r = {
        {"rep", rep + 1}, {"first", rep % 2 == 1 ? "fio" : "zinf"}, {"write_gbps", z[0]}, {"read_gbps", z[1]}};
    if (o.use_fio) {
      out.fw.push_back(f[0]);
      out.fr.push_back(f[1]);
      out.wr.push_back(z[0] / f[0]);
      out.rr.push_back(z[1] / f[1]);
      r["fio_write_gbps"] = f[0];
      r["fio_read_gbps"] = f[1];
      r["write_ratio"] = out.wr.back();
      r["read_ratio"] = out.rr.back();
    }
    out.runs.push_back(r);
  }
  return out;
}

nlohmann::ordered_json ToJson(const Options& o, const Rig& rig, const FioHugePages& fio_pages,
                              const std::string& fio_version, const Rates& m) {
  const aio::IoEngineOptions& eo = o.engine;
  nlohmann::ordered_json out;
  out["benchmark"] = "aio";
  out["file"] = o.file;
  out["size_bytes"] = o.size;
  out["block_size_bytes"] = eo.block_size_bytes;
  out["queue_depth"] = eo.queue_depth;
  out["thread_count"] = eo.thread_count;
  out["single_submit"] = eo.single_submit;
  out["overlap_events"] = eo.overlap_events;
  out["engine"] = std::string(rig.engine->name());
  out["request_bytes"] = o.request_bytes;
  out["buffers"] = o.buffer_count;
  out["direct_io"] = rig.engine->file_info(*rig.fid).direct;
  out["repetitions"] = o.reps;
  out["read_gbps"] = Median(m.zr);
  out["write_gbps"] = Median(m.zw);
  if (o.use_fio) {
    out["fio_read_gbps"] = Median(m.fr);
    out["fio_write_gbps"] = Median(m.fw);
    out["read_ratio"] = Median(m.rr);
    out["write_ratio"] = Median(m.wr);
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
      "repetitions; a tool's rate is 2 x size over the time of its two passes. zinf: IoEngine requests of "
      "request_bytes (default block_size x queue_depth x "
      "thread_count) from `buffers` pinned, registered buffers kept outstanding; the engine cuts them into block_size "
      "pieces spread over "
      "thread_count io_uring rings, each with up to queue_depth in flight; timed from first submit to last "
      "completion. fio: ioengine=io_uring direct=1 fixedbufs registerfiles, numjobs=thread_count jobs each "
      "over 1/thread_count of the file, bs=block_size, iodepth=queue_depth, iodepth_batch_submit and "
      "iodepth_batch_complete_min from single_submit and overlap_events; fio's own bw_bytes. The file was "
      "written with a pattern and read back and checked before timing. Buffers: zinf's PinnedPool uses "
      "transparent huge pages; fio gets huge pages too (--iomem=shmhuge, vm.nr_hugepages raised for the run "
      "and restored) when it can be reserved, see fio_buffers; with 4 KiB-page buffers a device that limits "
      "segments per request (virtio-blk: 254) splits each 1 MiB request in two and fio under-reports it.";
  out["fio_buffers"] = o.use_fio ? fio_pages.description() : "";
  out["fio_version"] = fio_version;
  FioRun shown{o.file, o.size, aio::IoOp::kRead, eo};
  shown.huge_pages = fio_pages.active();
  out["fio_command_read"] = o.use_fio ? FioCommand(shown) : "";
  out["verified"] = true;
  out["runs"] = m.runs;
  return out;
}

HtmlReport MakeReport(const Options& o, const nlohmann::ordered_json& j, const Rates& m) {
  HtmlReport report("zinf bench aio: " + FormatBytes(o.size) + ", " + FormatBytes(o.engine.block_size_bytes) +
                    " blocks, queue depth " + std::to_string(o.engine.queue_depth));
  report.AddParagraph(j["compared"].get<std::string>());
  report.AddTable("Key figures (medians over repetitions, GB/s)", {"", "zinf", "fio", "zinf / fio"},
                  {{"write", FormatFigure(Median(m.zw)), o.use_fio ? FormatFigure(Median(m.fw)) : "not run",
                    o.use_fio ? FormatFigure(Median(m.wr)) : ""},
                   {"read", FormatFigure(Median(m.zr)), o.use_fio ? FormatFigure(Median(m.fr)) : "not run",
                    o.use_fio ? FormatFigure(Median(m.rr)) : ""}});
  BarChart chart;
  chart.title = "Bandwidth per repetition (GB/s)";
  chart.x_label = "repetition";
  chart.y_label = "GB/s";
  chart.series = {{"zinf write", m.zw}, {"fio write", m.fw}, {"zinf read", m.zr}, {"fio read", m.fr}};
  for (int rep = 0; rep < o.reps; ++rep) chart.categories.push_back("rep " + std::to_string(rep + 1));
  report.AddBarChart(chart);
  return report;
}

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) return cli::Fail(kName, options.status(), 2);
  const Options& o = *options;
  std::string fio_version = "not run";
  if (o.use_fio) {
    auto v = FioVersion();
    if (!v.ok()) return cli::Fail(kName, v.status());
    fio_version = *v;
  }
  auto rig = CreateRig(o);
  if (!rig.ok()) return cli::Fail(kName, rig.status());
  std::fprintf(stderr, "bench aio: %s, %s, %s blocks, qd %d, %d thread(s), engine %s\n", o.file.c_str(),
               FormatBytes(o.size).c_str(), FormatBytes(o.engine.block_size_bytes).c_str(), o.engine.queue_depth,
               o.engine.thread_count, std::string((*rig)->engine->name()).c_str());
  if (Status s = FillAndCheck(o, **rig); !s.ok()) return cli::Fail(kName, s);

  // fio gets huge-page buffers like zinf's pool, where root can reserve them.
  FioHugePages fio_pages(o.use_fio ? FioBufferBytes(FioRun{o.file, o.size, aio::IoOp::kRead, o.engine}) : 0);
  if (o.use_fio) std::fprintf(stderr, "  fio buffers: %s\n", fio_pages.description().c_str());
  auto rates = Measure(o, **rig, fio_pages);
  if (!rates.ok()) return cli::Fail(kName, rates.status());

  const nlohmann::ordered_json j = ToJson(o, **rig, fio_pages, fio_version, *rates);
  HtmlReport report = MakeReport(o, j, *rates);
  if (Status s = EmitResult(j.dump(2), o.json_path, o.html_path, report); !s.ok()) return cli::Fail(kName, s);
  return 0;
}

ZINF_COMMAND(
    {"bench aio", "zinf's NVMe read/write speed against fio on the same file",
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
