// zinf bench swap: the NVMe-offloaded optimizer step (OptimizerSwapper with
// pipelined reads and writes) against the limits it chases, all measured in
// the same run:
//   * io_bound_s: the step's bytes over what fio moves on the same paths
//     with the same engine settings: per step every sub-group's master, m
//     and v are read (12 B/param) and written back (12 B/param), reads and
//     writes overlapping; the fp32 gradient comes from RAM, as the engine
//     hands it over. So fio runs a sequential
//     mixed job (rw=rw) with the step's read share (1/2) over a file as
//     large as the state on each path, and io_bound_s = (read + written
//     bytes) / fio's mixed GB/s. With several paths, their bandwidths add.
//     fio's pure read and write speeds are reported too, for reference.
//   * adam_bound_s: CpuAdam::Update over the same number of parameters held
//     in RAM, same pool, same ISA (what `zinf bench adam` times).
// ratio_to_bound = step_s / max(io_bound_s, adam_bound_s): 1.0 means the
// pipeline hides the faster of the two completely.
//
// Before timing, the first step's 16-bit output for sub-group 0 is checked
// bit for bit against the same update done in RAM.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "core/units.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "report.h"
#include "core/fs.h"
#include "swap/optimizer_swapper.h"

namespace zinf::perf {
namespace {

constexpr const char* kName = "bench swap";

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::vector<float> RandomFloats(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * (static_cast<float>(rng() >> 40) / static_cast<float>(1 << 24) - 0.5f);
  return v;
}

int Run(const std::vector<std::string>& args) {
  auto flags = cli::Flags::Parse(args, {"params", "sub-group", "nvme", "steps", "threads", "fio-size", "queue-depth",
                                        "block-size", "html", "json"},
                                 {"no-fio", "no-pipeline", "keep-files"});
  if (!flags.ok()) return cli::Fail(kName, flags.status(), 2);
  auto params = flags->GetInt("params", int64_t{1} << 24);
  auto steps = flags->GetInt("steps", 5);
  auto threads = flags->GetInt("threads", 0);
  auto fio_size = flags->GetInt("fio-size", 0);  // 0: the state's size per path
  auto qd = flags->GetInt("queue-depth", 32);
  auto bs = flags->GetInt("block-size", kMiB);
  for (const auto* v : {&params, &steps, &threads, &fio_size, &qd, &bs}) {
    if (!v->ok()) return cli::Fail(kName, v->status(), 2);
  }
  // Default: 4M elements (at most N/16), so the pipeline's unhidden first
  // read and last write are a small part of the step.
  auto sub_group = flags->GetInt("sub-group", std::max<int64_t>(1, std::min<int64_t>(*params / 16, int64_t{1} << 22)));
  if (!sub_group.ok()) return cli::Fail(kName, sub_group.status(), 2);
  if (*params < 1 || *steps < 1 || *sub_group < 1) {
    return cli::Fail(kName, Status::InvalidArgument("--params, --steps and --sub-group must be positive"), 2);
  }
  std::vector<std::string> paths = flags->GetAll("nvme");
  if (paths.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    paths.push_back(std::string(tmp && *tmp ? tmp : "/tmp") + "/zinf-bench-swap");
  }
  const bool pipeline = !flags->Has("no-pipeline");

  aio::IoEngineOptions eo;
  eo.block_size_bytes = *bs;
  eo.queue_depth = static_cast<int>(*qd);
  eo.thread_count = static_cast<int>(paths.size());
  eo.direct_io = aio::DirectIo::kPrefer;
  if (Status v = aio::ValidateOptions(eo); !v.ok()) return cli::Fail(kName, v, 2);
  auto engine = aio::CreateIoEngine(eo);
  if (!engine.ok()) return cli::Fail(kName, engine.status());

  optim::ThreadPool::Options tpo;
  tpo.num_threads = static_cast<int>(*threads);
  auto pool = optim::ThreadPool::Create(tpo);
  if (!pool.ok()) return cli::Fail(kName, pool.status());
  auto isa = optim::DefaultIsa();
  if (!isa.ok()) return cli::Fail(kName, isa.status(), 2);
  OptimizerConfig oc;
  oc.lr = 1e-3;
  oc.weight_decay = 0.01;
  auto adam = optim::CpuAdam::Create(oc, pool->get(), *isa);
  if (!adam.ok()) return cli::Fail(kName, adam.status());

  swap::OptimizerSwapperOptions so;
  so.total_elems = *params;
  so.sub_group_elems = *sub_group;
  so.device = OffloadDevice::kNvme;
  so.pipeline_read = pipeline;
  so.pipeline_write = pipeline;
  so.store.paths = paths;
  so.store.file_prefix = "zinf-bench-swap";
  so.store.stripe_bytes = *bs;
  so.gradients_in_store = false;  // the engine's mode: the gradient stays in RAM
  aio::PinnedPoolOptions po;
  po.buffer_count = swap::OptimizerSwapper::PoolBuffers(so);
  po.buffer_bytes = swap::OptimizerSwapper::RequiredBufferBytes(so, so.store.alignment_bytes);
  po.name = "bench swap pipeline";
  auto buffers = aio::PinnedPool::Create(po);
  if (!buffers.ok()) return cli::Fail(kName, buffers.status());
  std::fprintf(stderr, "bench swap: %s params in sub-groups of %s over %zu path(s), engine %s, isa %s\n",
               FormatCount(*params).c_str(), FormatCount(*sub_group).c_str(), paths.size(),
               std::string((*engine)->name()).c_str(), std::string(optim::IsaName(*isa)).c_str());
  auto swapper = swap::OptimizerSwapper::Create(so, engine->get(), buffers->get());
  if (!swapper.ok()) return cli::Fail(kName, swapper.status());
  swap::OptimizerSwapper& s = **swapper;

  // State and gradients; then one checked step.
  const int64_t n = *params;
  std::vector<float> master = RandomFloats(n, 1, 2.0f);
  std::vector<float> grads = RandomFloats(n, 2, 0.02f);
  Status st = s.Initialize(master.data());
  if (!st.ok()) return cli::Fail(kName, st);
  std::vector<uint16_t> out16(static_cast<size_t>(n));
  optim::AdamStepArgs step_args;
  step_args.lr = 1e-3;
  step_args.step = 1;
  swap::StepIo io = swap::OutputTo(out16.data());
  io.grads = grads.data();
  st = s.Step(*adam, step_args, io);
  if (!st.ok()) return cli::Fail(kName, st);
  {
    const int64_t k0 = s.sub_group_elems(0);
    std::vector<float> m(static_cast<size_t>(k0), 0.0f), v(static_cast<size_t>(k0), 0.0f);
    std::vector<uint16_t> ref16(static_cast<size_t>(k0));
    std::vector<float> p(master.begin(), master.begin() + k0);
    optim::AdamSpan span{p.data(), m.data(), v.data(), grads.data(), ElementType::kF32, ref16.data(),
                         ElementType::kBf16, k0};
    st = adam->Update(span, step_args);
    if (!st.ok()) return cli::Fail(kName, st);
    if (std::memcmp(ref16.data(), out16.data(), ref16.size() * 2) != 0) {
      return cli::Fail(kName, Status::Internal("the swapped step's sub-group 0 differs from the same step in RAM"));
    }
  }

  // The I/O bound: fio on every path with the engine's settings, over as
  // many bytes as the state, reading and writing at once in the step's mix
  // (12 bytes read for every 12 written), since the pipeline overlaps them.
  // fio's files are laid out (and pure write and read speeds taken) once;
  // then each repetition times one step and, right after it, fio's mixed
  // job, so both see the same machine; the ratio is the median of the
  // per-repetition ratios.
  const int64_t bytes_read = 12 * n, bytes_written = 12 * n;
  const int64_t bytes_moved = bytes_read + bytes_written;
  const int read_percent = static_cast<int>(std::lround(100.0 * double(bytes_read) / double(bytes_moved)));
  const bool use_fio = !flags->Has("no-fio");
  std::string fio_version = "not run";
  std::vector<FioRun> fio_runs;
  double read_gbps = 0, write_gbps = 0;
  FioRun probe;
  probe.engine = eo;
  probe.engine.thread_count = 1;
  FioHugePages fio_pages(use_fio ? FioBufferBytes(probe) : 0);  // like the pool's buffers; see aio_perf.h
  auto remove_fio_files = [&] {
    for (const FioRun& run : fio_runs) RemoveFile(run.file).IgnoreError();
  };
  if (use_fio) {
    auto version = FioVersion();
    if (!version.ok()) return cli::Fail(kName, version.status());
    fio_version = *version;
    const int64_t per_path = AlignUp(*fio_size > 0 ? *fio_size : 12 * n / int64_t(paths.size()), eo.block_size_bytes);
    for (const std::string& path : paths) {
      FioRun run = probe;
      run.huge_pages = fio_pages.active();
      run.file = JoinPath(path, "zinf-bench-swap.fio");
      run.size_bytes = per_path;
      run.op = aio::IoOp::kWrite;
      fio_runs.push_back(run);
      auto w = RunFio(run);  // also lays the file out for the reads
      run.op = aio::IoOp::kRead;
      auto r = w.ok() ? RunFio(run) : w;
      if (!r.ok()) {
        remove_fio_files();
        return cli::Fail(kName, r.status());
      }
      write_gbps += *w;
      read_gbps += *r;
      fio_runs.back().read_percent = read_percent;
    }
  }

  std::vector<double> step_times, io_bounds, mixed_rates;
  for (int64_t i = 0; i < *steps; ++i) {
    step_args.step = 2 + i;
    const auto t0 = std::chrono::steady_clock::now();
    st = s.Step(*adam, step_args, io);
    step_times.push_back(Seconds(t0));
    if (!st.ok()) {
      remove_fio_files();
      return cli::Fail(kName, st);
    }
    auto mixed = RunFioSum(fio_runs);
    if (!mixed.ok()) {
      remove_fio_files();
      return cli::Fail(kName, mixed.status());
    }
    const double mixed_gbps = *mixed;
    if (use_fio) {
      mixed_rates.push_back(mixed_gbps);
      io_bounds.push_back(static_cast<double>(bytes_moved) / (mixed_gbps * 1e9));
    }
    std::fprintf(stderr, "  rep %lld: step %.3f s, fio mixed %.2f GB/s -> %.3f s\n", static_cast<long long>(i + 1),
                 step_times.back(), mixed_gbps, use_fio ? io_bounds.back() : 0.0);
  }
  remove_fio_files();
  const double step_s = Median(step_times);
  const double io_bound_s = Median(io_bounds);
  const double mixed_gbps = Median(mixed_rates);
  swapper->reset();
  buffers->reset();

  // The Adam bound: the same update over the same parameters in RAM.
  std::vector<double> adam_times;
  {
    std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < *steps; ++i) {
      optim::AdamSpan span{master.data(), m.data(), v.data(), grads.data(), ElementType::kF32, out16.data(),
                           ElementType::kBf16, n};
      step_args.step = 1 + i;
      const auto t0 = std::chrono::steady_clock::now();
      st = adam->Update(span, step_args);
      adam_times.push_back(Seconds(t0));
      if (!st.ok()) return cli::Fail(kName, st);
    }
  }
  const double adam_bound_s = Median(adam_times);
  std::vector<double> ratios;
  for (size_t i = 0; i < step_times.size(); ++i) {
    const double bound = std::max(use_fio ? io_bounds[i] : 0.0, adam_bound_s);
    ratios.push_back(step_times[i] / bound);
  }
  if (!flags->Has("keep-files")) {
    for (size_t i = 0; i < paths.size(); ++i) {
      RemoveFile(JoinPath(paths[i], "zinf-bench-swap." + std::to_string(i) + ".swp")).IgnoreError();
    }
  }

  nlohmann::json j;
  j["params"] = n;
  j["sub_group"] = *sub_group;
  j["paths"] = paths;
  j["engine"] = std::string((*engine)->name());
  j["isa"] = std::string(optim::IsaName(*isa));
  j["threads"] = (*pool)->num_threads();
  j["pipeline_read"] = pipeline;
  j["pipeline_write"] = pipeline;
  j["steps"] = *steps;
  j["step_s"] = step_s;
  j["adam_bound_s"] = adam_bound_s;
  j["io_bound_s"] = io_bound_s;
  j["fio"] = fio_version;
  j["fio_buffers"] = use_fio ? fio_pages.description() : "";
  j["fio_mixed_read_percent"] = read_percent;
  j["fio_mixed_gbps"] = mixed_gbps;
  j["fio_read_gbps"] = read_gbps;
  j["fio_write_gbps"] = write_gbps;
  j["compared"] = "Each repetition times one pipelined optimizer step (state read, Adam, state written) and right "
                  "after it fio's mixed job; ratio_to_bound is the median of step / max(io bound, adam bound) "
                  "over repetitions. step_s: median step wall time. "
                  "io_bound_s: bytes_read + bytes_written over fio's sequential mixed read/write bandwidth "
                  "(rw=rw at the step's read share, io_uring, O_DIRECT, same block size and queue depth) on "
                  "a file as large as the state on each path. adam_bound_s: the same Adam update in RAM.";
  j["bytes_read"] = bytes_read;
  j["bytes_written"] = bytes_written;
  j["ratio_to_bound"] = Median(ratios);
  j["step_s_runs"] = step_times;
  j["io_bound_s_runs"] = io_bounds;
  HtmlReport report("zinf bench swap: " + FormatCount(n) + " params on " + std::to_string(paths.size()) +
                    " path(s), sub-groups of " + FormatCount(*sub_group));
  report.AddParagraph(j["compared"].get<std::string>());
  report.AddTable("Key figures (medians)", {"figure", "value"},
                  {{"step s", FormatFigure(step_s)},
                   {"io bound s", use_fio ? FormatFigure(io_bound_s) : "not run"},
                   {"adam bound s", FormatFigure(adam_bound_s)},
                   {"ratio_to_bound", FormatFigure(Median(ratios))},
                   {"fio mixed GB/s", use_fio ? FormatFigure(mixed_gbps) : "not run"},
                   {"bytes read + written per step", FormatBytes(bytes_moved)}});
  BarChart chart;
  chart.title = "Per repetition: optimizer step vs. its bounds (s)";
  chart.x_label = "repetition";
  chart.y_label = "seconds";
  chart.series = {{"step", step_times}, {"io bound (fio)", io_bounds},
                  {"adam bound", std::vector<double>(step_times.size(), adam_bound_s)}};
  for (size_t i = 0; i < step_times.size(); ++i) {
    chart.categories.push_back("rep " + std::to_string(i + 1) + " (ratio " + FormatFigure(ratios[i]) + ")");
  }
  report.AddBarChart(chart);
  if (Status e = EmitResult(j.dump(2), flags->GetOr("json", ""), flags->GetOr("html", ""), report); !e.ok()) {
    return cli::Fail(kName, e);
  }
  return 0;
}

ZINF_COMMAND({kName, "time the NVMe-offloaded optimizer step against fio and the in-RAM Adam step",
              "bench swap [--params N (2^24)] [--sub-group S (min(N/16, 4M))] [--nvme DIR]... [--steps R (5)]\n"
              "           [--threads T] [--queue-depth Q (32)] [--block-size B (1M)] [--fio-size F (state size)]\n"
              "           [--no-pipeline] [--no-fio] [--keep-files] [--html OUT.html] [--json OUT.json]\n"
              "  Runs the pipelined optimizer step over N fp32 parameters whose master, m, v and\n"
              "  gradient live in swap files on the --nvme paths, checks the first step against the\n"
              "  same update in RAM, times R steps, then measures in the same run the in-RAM Adam\n"
              "  step (adam_bound_s) and fio's mixed sequential read/write bandwidth on every path, in\n"
              "  the step's read/write mix over a file as large as the state (io_bound_s).\n"
              "  Prints JSON: step_s, io_bound_s, adam_bound_s, ratio_to_bound = step_s /\n"
              "  max(io_bound_s, adam_bound_s), bytes_read, bytes_written (per step). --html writes a\n"
              "  page with the figures and a chart per repetition; --json a copy of the JSON.",
              Run});

}  // namespace
}  // namespace zinf::perf
