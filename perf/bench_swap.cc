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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "core/fs.h"
#include "core/units.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "report.h"
#include "scratch.h"
#include "swap/optimizer_swapper.h"

namespace zinf::perf {
namespace {

constexpr const char* kName = "bench swap";
constexpr char kFilePrefix[] = "zinf-bench-swap";

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::vector<float> RandomFloats(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * (static_cast<float>(rng() >> 40) / static_cast<float>(1 << 24) - 0.5f);
  return v;
}

// What the flags ask for (a bad one is a usage error, exit code 2).
struct Options {
  int64_t n = 0;
  int64_t sub_group = 0;
  int64_t steps = 0;
  int threads = 0;
  int64_t fio_size = 0;  // 0: the state's size per path
  std::vector<std::string> paths;
  bool pipeline = true;
  bool use_fio = true;
  bool keep_files = false;
  aio::IoEngineOptions engine;
  optim::Isa isa = optim::Isa::kScalar;
  std::string html_path, json_path;
};

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  ZINF_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args,
                                                            {"params", "sub-group", "nvme", "steps", "threads",
                                                             "fio-size", "queue-depth", "block-size", "html", "json"},
                                                            {"no-fio", "no-pipeline", "keep-files"}));
  auto params = flags.GetInt("params", int64_t{1} << 24);
  auto steps = flags.GetInt("steps", 5);
  auto threads = flags.GetInt("threads", 0);
  auto fio_size = flags.GetInt("fio-size", 0);
  auto qd = flags.GetInt("queue-depth", 32);
  auto bs = flags.GetInt("block-size", kMiB);
  for (const auto* v : {&params, &steps, &threads, &fio_size, &qd, &bs}) {
    if (!v->ok()) return v->status();
  }
  // Default: 4M elements (at most N/16), so the pipeline's unhidden first
  // read and last write are a small part of the step.
  ZINF_ASSIGN_OR_RETURN(
      const int64_t sub_group,
      flags.GetInt("sub-group", std::max<int64_t>(1, std::min<int64_t>(*params / 16, int64_t{1} << 22))));
  if (*params < 1 || *steps < 1 || sub_group < 1) {
    return Status::InvalidArgument("--params, --steps and --sub-group must be positive");
  }
  Options o;
  o.n = *params;
  o.sub_group = sub_group;
  o.steps = *steps;
  o.threads = static_cast<int>(*threads);
  o.fio_size = *fio_size;
  o.paths = flags.GetAll("nvme");
  if (o.paths.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    o.paths.push_back(std::string(tmp && *tmp ? tmp : "/tmp") + "/zinf-bench-swap");
  }
  o.pipeline = !flags.Has("no-pipeline");
  o.use_fio = !flags.Has("no-fio");
  o.keep_files = flags.Has("keep-files");
  o.engine.block_size_bytes = *bs;
  o.engine.queue_depth = static_cast<int>(*qd);
  o.engine.thread_count = static_cast<int>(o.paths.size());
  o.engine.direct_io = aio::DirectIo::kPrefer;
  ZINF_RETURN_IF_ERROR(aio::ValidateOptions(o.engine));
  ZINF_ASSIGN_OR_RETURN(o.isa, optim::DefaultIsa());
  o.html_path = flags.GetOr("html", "");
  o.json_path = flags.GetOr("json", "");
  return o;
}

// The offloaded optimizer: an IoEngine, Adam on a pool, the pipeline's
// pinned buffers and the OptimizerSwapper over swap files on every path
// (removed when the Rig goes, unless --keep-files).
struct Rig {
  ScratchFiles swap_files;  // declared first: removed after the swapper and engine close them
  std::unique_ptr<aio::IoEngine> engine;
  std::unique_ptr<optim::ThreadPool> pool;
  std::unique_ptr<optim::CpuAdam> adam;
  std::unique_ptr<aio::PinnedPool> buffers;
  std::unique_ptr<swap::OptimizerSwapper> swapper;
};

StatusOr<Rig> CreateRig(const Options& o) {
  Rig rig;
  ZINF_ASSIGN_OR_RETURN(rig.engine, aio::CreateIoEngine(o.engine));
  optim::ThreadPool::Options tpo;
  tpo.num_threads = o.threads;
  ZINF_ASSIGN_OR_RETURN(rig.pool, optim::ThreadPool::Create(tpo));
  OptimizerConfig oc;
  oc.lr = 1e-3;
  oc.weight_decay = 0.01;
  ZINF_ASSIGN_OR_RETURN(optim::CpuAdam adam, optim::CpuAdam::Create(oc, rig.pool.get(), o.isa));
  rig.adam = std::make_unique<optim::CpuAdam>(std::move(adam));

  swap::OptimizerSwapperOptions so;
  so.total_elems = o.n;
  so.sub_group_elems = o.sub_group;
  so.device = OffloadDevice::kNvme;
  so.pipeline_read = o.pipeline;
  so.pipeline_write = o.pipeline;
  so.store.paths = o.paths;
  so.store.file_prefix = kFilePrefix;
  so.store.stripe_bytes = o.engine.block_size_bytes;
  so.gradients_in_store = false;  // the engine's mode: the gradient stays in RAM
  aio::PinnedPoolOptions po;
  po.buffer_count = swap::OptimizerSwapper::PoolBuffers(so);
  po.buffer_bytes = swap::OptimizerSwapper::RequiredBufferBytes(so, so.store.alignment_bytes);
  po.name = "bench swap pipeline";
  ZINF_ASSIGN_OR_RETURN(rig.buffers, aio::PinnedPool::Create(po));
  std::fprintf(stderr, "bench swap: %s params in sub-groups of %s over %zu path(s), engine %s, isa %s\n",
               FormatCount(o.n).c_str(), FormatCount(o.sub_group).c_str(), o.paths.size(),
               std::string(rig.engine->name()).c_str(), std::string(optim::IsaName(o.isa)).c_str());
  if (!o.keep_files) {
    for (size_t i = 0; i < o.paths.size(); ++i) {
      rig.swap_files.Add(JoinPath(o.paths[i], std::string(kFilePrefix) + "." + std::to_string(i) + ".swp"));
    }
  }
  ZINF_ASSIGN_OR_RETURN(rig.swapper, swap::OptimizerSwapper::Create(so, rig.engine.get(), rig.buffers.get()));
  return rig;
}

// The state, gradient and 16-bit output in RAM.
struct State {
  std::vector<float> master, grads;
  std::vector<uint16_t> out16;
  swap::StepIo Io() {
    swap::StepIo io = swap::OutputTo(out16.data());
    io.grads = grads.data();
    return io;
  }
};

// Initializes the swapped state and runs step 1, whose sub-group 0 must
// match the same step in RAM bit for bit.
StatusOr<State> FirstStep(const Options& o, Rig& rig) {
  State state{RandomFloats(o.n, 1, 2.0f), RandomFloats(o.n, 2, 0.02f), std::vector<uint16_t>(static_cast<size_t>(o.n))};
  ZINF_RETURN_IF_ERROR(rig.swapper->Initialize(state.master.data()));
  optim::AdamStepArgs step_args;
  step_args.lr = 1e-3;
  step_args.step = 1;
  ZINF_RETURN_IF_ERROR(rig.swapper->Step(*rig.adam, step_args, state.Io()));
  const int64_t k0 = rig.swapper->sub_group_elems(0);
  std::vector<float> m(static_cast<size_t>(k0), 0.0f), v(static_cast<size_t>(k0), 0.0f);
  std::vector<uint16_t> ref16(static_cast<size_t>(k0));
  std::vector<float> p(state.master.begin(), state.master.begin() + k0);
  optim::AdamSpan span{p.data(),          m.data(),     v.data(),           state.grads.data(),
                       ElementType::kF32, ref16.data(), ElementType::kBf16, k0};
  ZINF_RETURN_IF_ERROR(rig.adam->Update(span, step_args));
  if (std::memcmp(ref16.data(), state.out16.data(), ref16.size() * 2) != 0) {
    return Status::Internal("the swapped step's sub-group 0 differs from the same step in RAM");
  }
  return state;
}

// The I/O bound's tool: fio on every path with the engine's settings, over
// as many bytes as the state, reading and writing at once in the step's mix
// (12 bytes read for every 12 written), since the pipeline overlaps them.
// fio's files are laid out (and pure write and read speeds taken) once.
struct Fio {
  std::unique_ptr<FioHugePages> pages;  // like the pool's buffers; see aio_perf.h
  ScratchFiles files;
  std::vector<FioRun> runs;  // the mixed jobs, one per path; none without fio
  std::string version = "not run";
  double read_gbps = 0, write_gbps = 0;
};

StatusOr<Fio> PrepareFio(const Options& o, int read_percent) {
  Fio fio;
  FioRun probe;
  probe.engine = o.engine;
  probe.engine.thread_count = 1;
  fio.pages = std::make_unique<FioHugePages>(o.use_fio ? FioBufferBytes(probe) : 0);
  if (!o.use_fio) return fio;
  ZINF_ASSIGN_OR_RETURN(fio.version, FioVersion());
  const int64_t per_path =
      AlignUp(o.fio_size > 0 ? o.fio_size : 12 * o.n / int64_t(o.paths.size()), o.engine.block_size_bytes);
  for (const std::string& path : o.paths) {
    FioRun run = probe;
    run.huge_pages = fio.pages->active();
    run.file = JoinPath(path, "zinf-bench-swap.fio");
    run.size_bytes = per_path;
    run.op = aio::IoOp::kWrite;
    fio.files.Add(run.file);
    fio.runs.push_back(run);
    ZINF_ASSIGN_OR_RETURN(const double w, RunFio(run));  // also lays the file out for the reads
    run.op = aio::IoOp::kRead;
    ZINF_ASSIGN_OR_RETURN(const double r, RunFio(run));
    fio.write_gbps += w;
    fio.read_gbps += r;
    fio.runs.back().read_percent = read_percent;
  }
  return fio;
}

// Per repetition: one timed step and, right after it, fio's mixed job, so
// both see the same machine.
struct StepTimes {
  std::vector<double> step_s, io_bound_s, mixed_gbps;  // the last two empty without fio
  aio::IoQueueTime queue;                              // the engine's queues over the timed steps
};

StatusOr<StepTimes> MeasureSteps(const Options& o, Rig& rig, State& state, const Fio& fio, int64_t bytes_moved) {
  StepTimes t;
  optim::AdamStepArgs step_args;
  step_args.lr = 1e-3;
  for (int64_t i = 0; i < o.steps; ++i) {
    step_args.step = 2 + i;
    const aio::IoQueueTime q0 = rig.engine->queue_time();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = rig.swapper->Step(*rig.adam, step_args, state.Io());
    t.step_s.push_back(Seconds(t0));
    ZINF_RETURN_IF_ERROR(st);
    t.queue += rig.engine->queue_time() - q0;
    ZINF_ASSIGN_OR_RETURN(const double mixed_gbps, RunFioSum(fio.runs));
    if (o.use_fio) {
      t.mixed_gbps.push_back(mixed_gbps);
      t.io_bound_s.push_back(static_cast<double>(bytes_moved) / (mixed_gbps * 1e9));
    }
    std::fprintf(stderr, "  rep %lld: step %.3f s, fio mixed %.2f GB/s -> %.3f s\n", static_cast<long long>(i + 1),
                 t.step_s.back(), mixed_gbps, o.use_fio ? t.io_bound_s.back() : 0.0);
  }
  return t;
}

// The Adam bound: the same update over the same parameters in RAM, --steps
// times (its seconds per step).
StatusOr<std::vector<double>> MeasureAdamBound(const Options& o, Rig& rig, State& state) {
  std::vector<double> adam_times;
  std::vector<float> m(static_cast<size_t>(o.n), 0.0f), v(static_cast<size_t>(o.n), 0.0f);
  optim::AdamStepArgs step_args;
  step_args.lr = 1e-3;
  for (int64_t i = 0; i < o.steps; ++i) {
    optim::AdamSpan span{state.master.data(), m.data(),           v.data(),           state.grads.data(),
                         ElementType::kF32,   state.out16.data(), ElementType::kBf16, o.n};
    step_args.step = 1 + i;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = rig.adam->Update(span, step_args);
    adam_times.push_back(Seconds(t0));
    ZINF_RETURN_IF_ERROR(st);
  }
  return adam_times;
}

// A step's NVMe traffic: every sub-group's master, m and v are read
// (12 B/param) and written back (12 B/param).
struct Traffic {
  int64_t bytes_read = 0, bytes_written = 0;
  int read_percent = 0;  // of the bytes moved
  int64_t bytes_moved() const { return bytes_read + bytes_written; }
};

Traffic StepTraffic(int64_t n) {
  Traffic t{12 * n, 12 * n, 0};
  t.read_percent = static_cast<int>(std::lround(100.0 * double(t.bytes_read) / double(t.bytes_moved())));
  return t;
}

// The figures: medians, and per repetition step / max(io bound, adam bound).
struct Summary {
  double step_s = 0, io_bound_s = 0, mixed_gbps = 0, adam_bound_s = 0;
  std::vector<double> ratios;
};

Summary Summarize(const Options& o, const StepTimes& t, const std::vector<double>& adam_times) {
  Summary s;
  s.step_s = Median(t.step_s);
  s.io_bound_s = Median(t.io_bound_s);
  s.mixed_gbps = Median(t.mixed_gbps);
  s.adam_bound_s = Median(adam_times);
  for (size_t i = 0; i < t.step_s.size(); ++i) {
    const double bound = std::max(o.use_fio ? t.io_bound_s[i] : 0.0, s.adam_bound_s);
    s.ratios.push_back(t.step_s[i] / bound);
  }
  return s;
}

// How the engine's rings were kept busy over the timed steps, as fractions
// of their time (rings x the steps' wall time): with pieces in flight, with
// queue_depth of them, and by direction. Full and mixed near 1 mean the
// pipeline kept the disk as busy as fio's job does; the rest of the gap to
// the bound is the disk serving this pattern more slowly.
nlohmann::json QueueJson(const aio::IoQueueTime& q, int rings, const std::vector<double>& step_s) {
  double wall = 0;
  for (double x : step_s) wall += x;
  const double ring_s = wall * rings;
  const auto frac = [&](int64_t ns) { return ring_s > 0 ? static_cast<double>(ns) * 1e-9 / ring_s : 0.0; };
  nlohmann::json j;
  j["busy"] = frac(q.busy_ns());
  j["full"] = frac(q.full_ns);
  j["mixed"] = frac(q.mixed_ns);
  j["read_only"] = frac(q.read_only_ns);
  j["write_only"] = frac(q.write_only_ns);
  return j;
}

nlohmann::json ToJson(const Options& o, const Rig& rig, const Fio& fio, const Traffic& traffic, const StepTimes& t,
                      const Summary& s) {
  nlohmann::json j;
  j["params"] = o.n;
  j["sub_group"] = o.sub_group;
  j["paths"] = o.paths;
  j["engine"] = std::string(rig.engine->name());
  j["isa"] = std::string(optim::IsaName(o.isa));
  j["threads"] = rig.pool->num_threads();
  j["pipeline_read"] = o.pipeline;
  j["pipeline_write"] = o.pipeline;
  j["steps"] = o.steps;
  j["step_s"] = s.step_s;
  j["adam_bound_s"] = s.adam_bound_s;
  j["io_bound_s"] = s.io_bound_s;
  j["fio"] = fio.version;
  j["fio_buffers"] = o.use_fio ? fio.pages->description() : "";
  j["fio_mixed_read_percent"] = traffic.read_percent;
  j["fio_mixed_gbps"] = s.mixed_gbps;
  j["fio_read_gbps"] = fio.read_gbps;
  j["fio_write_gbps"] = fio.write_gbps;
  j["compared"] =
      "Each repetition times one pipelined optimizer step (state read, Adam, state written) and right "
      "after it fio's mixed job; ratio_to_bound is the median of step / max(io bound, adam bound) "
      "over repetitions. step_s: median step wall time. "
      "io_bound_s: bytes_read + bytes_written over fio's sequential mixed read/write bandwidth "
      "(rw=rw at the step's read share, io_uring, O_DIRECT, same block size and queue depth) on "
      "a file as large as the state on each path. adam_bound_s: the same Adam update in RAM. "
      "queue: the engine's rings over the timed steps, as fractions of their time: with pieces in "
      "flight (busy), with queue_depth of them (full), with reads and writes together (mixed), one "
      "direction only (read_only, write_only).";
  j["bytes_read"] = traffic.bytes_read;
  j["bytes_written"] = traffic.bytes_written;
  j["ratio_to_bound"] = Median(s.ratios);
  j["step_s_runs"] = t.step_s;
  j["queue"] = QueueJson(t.queue, rig.engine->options().thread_count, t.step_s);
  j["io_bound_s_runs"] = t.io_bound_s;
  return j;
}

// "96% / 90% / 85%": QueueJson's busy, full and mixed.
std::string QueueText(const nlohmann::json& q) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.0f%% / %.0f%% / %.0f%%", 100 * q["busy"].get<double>(),
                100 * q["full"].get<double>(), 100 * q["mixed"].get<double>());
  return text;
}

HtmlReport MakeReport(const Options& o, const nlohmann::json& j, const Traffic& traffic, const StepTimes& t,
                      const Summary& s) {
  HtmlReport report("zinf bench swap: " + FormatCount(o.n) + " params on " + std::to_string(o.paths.size()) +
                    " path(s), sub-groups of " + FormatCount(o.sub_group));
  report.AddParagraph(j["compared"].get<std::string>());
  report.AddTable("Key figures (medians)", {"figure", "value"},
                  {{"step s", FormatFigure(s.step_s)},
                   {"io bound s", o.use_fio ? FormatFigure(s.io_bound_s) : "not run"},
                   {"adam bound s", FormatFigure(s.adam_bound_s)},
                   {"ratio_to_bound", FormatFigure(Median(s.ratios))},
                   {"fio mixed GB/s", o.use_fio ? FormatFigure(s.mixed_gbps) : "not run"},
                   {"bytes read + written per step", FormatBytes(traffic.bytes_moved())},
                   {"engine queues busy / full / mixed", QueueText(j["queue"])}});
  BarChart chart;
  chart.title = "Per repetition: optimizer step vs. its bounds (s)";
  chart.x_label = "repetition";
  chart.y_label = "seconds";
  chart.series = {{"step", t.step_s},
                  {"io bound (fio)", t.io_bound_s},
                  {"adam bound", std::vector<double>(t.step_s.size(), s.adam_bound_s)}};
  for (size_t i = 0; i < t.step_s.size(); ++i) {
    chart.categories.push_back("rep " + std::to_string(i + 1) + " (ratio " + FormatFigure(s.ratios[i]) + ")");
  }
  report.AddBarChart(chart);
  return report;
}

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) return cli::Fail(kName, options.status(), 2);
  const Options& o = *options;
  auto rig = CreateRig(o);
  if (!rig.ok()) return cli::Fail(kName, rig.status());
  auto state = FirstStep(o, *rig);
  if (!state.ok()) return cli::Fail(kName, state.status());

  const Traffic traffic = StepTraffic(o.n);
  auto fio = PrepareFio(o, traffic.read_percent);
  if (!fio.ok()) return cli::Fail(kName, fio.status());
  auto times = MeasureSteps(o, *rig, *state, *fio, traffic.bytes_moved());
  if (!times.ok()) return cli::Fail(kName, times.status());
  fio->files.RemoveAll();
  // The swapper's pinned buffers go before the in-RAM bound.
  rig->swapper.reset();
  rig->buffers.reset();
  auto adam_times = MeasureAdamBound(o, *rig, *state);
  if (!adam_times.ok()) return cli::Fail(kName, adam_times.status());
  const Summary summary = Summarize(o, *times, *adam_times);

  const nlohmann::json j = ToJson(o, *rig, *fio, traffic, *times, summary);
  HtmlReport report = MakeReport(o, j, traffic, *times, summary);
  if (Status e = EmitResult(j.dump(2), o.json_path, o.html_path, report); !e.ok()) {
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
              "  max(io_bound_s, adam_bound_s), bytes_read, bytes_written (per step), queue (how full\n"
              "  the engine kept its queues, and in which directions). --html writes a\n"
              "  page with the figures and a chart per repetition; --json a copy of the JSON.",
              Run});

}  // namespace
}  // namespace zinf::perf
