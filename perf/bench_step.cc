// zinf bench step: whole training steps of the reference GPT (model::Trainer
// over the ZeRO-3 engine, the config's tiers) against the resources a step
// needs, each measured on its own in the same run.
//
// The parts of the bound. Each is the time one resource needs for the
// step's work when it runs alone:
//   * cpu_s (host device): the model's kernels and CPU Adam share the same
//     cores, so they are one resource: compute_s + adam_s, where
//       compute_s is the compute-only time: a second Trainer on the same
//         model, config, batch, data and threads with every tier resident
//         (offload_param and offload_optimizer "none", no device budget)
//         runs the same steps; compute_s is its step wall time minus its
//         optimizer time. That is more than its kernel time
//         (StepReport::compute_seconds, reported as compute_kernels_s):
//         every step also zeroes gradient buffers, copies gradients into
//         the flat buffer and accumulates them into the fp32 gradient,
//         loads the batch, casts parameters. On the host device that is
//         work for the same cores whatever the tiers, so it belongs to the
//         resource; ratio_to_bound_kernel_time_only shows the ratio with
//         the kernels alone, for comparison;
//       adam_s: optim::CpuAdam::Update over the same parameter count held
//         in RAM (fp32 master, m, v, fp32 gradient, 16-bit output), with the
//         engine's thread count and ISA (what `zinf bench adam` times).
//     On a GPU the kernels run on the device, so compute_s and adam_s are
//     separate parts (the engine does not yet overlap them, which the ratio
//     then shows).
//   * nvme_s: the step's NVMe bytes (EngineCounters: parameter shard reads
//     and writes + optimizer state read and written) over fio's sequential
//     mixed read/write bandwidth (rw=rw at the step's read share, io_uring,
//     O_DIRECT, the config's aio block size and queue depth) on a file in
//     the same directory, as large as the step's traffic (aio_perf.h).
//   * pcie_s: the step's h2d + d2h bytes copied in the engine's transfer
//     sizes (bytes per fetch; bytes per gradient shard): on the host device
//     memcpy between rings of buffers larger than the caches; on CUDA
//     cudaMemcpyAsync from and to page-locked memory through Device/Stream.
//   * comm_s: the step's all-gather + reduce-scatter time (this bench runs
//     one rank: no collective, ~0; the engine's reduce_scatter_ns is then
//     the gradient shard's device-to-host copy, counted as PCIe wait).
// bound_s = max(parts); ratio_to_bound = step_s / bound_s, 1.0 meaning the
// step takes as long as its busiest resource needs. The bound assumes the
// resources all work at once; whatever the engine leaves serial (today:
// the optimizer step after the backward pass, with its NVMe traffic)
// shows up as ratio above 1.
//
// The run: both trainers take two warm-up steps (the first records the
// prefetch order; the second, whose optimizer reads m and v as every later
// one does, sizes the fio job); their losses must be finite and equal (the
// engine is bit-identical across tiers), else the bench fails before timing. Then
// each of --reps repetitions runs --steps offloaded steps back to back and
// --steps resident steps back to back (which goes first alternates per
// repetition; each trainer's optimizer update runs under its own next
// forward pass, and its last update is waited for and counted in its last
// step, so neither trainer's work lands in the other's timed steps), then
// three in-RAM Adam updates, the copies and one fio mixed job, back to back
// so that noise on the shared machine hits all of them alike; a
// repetition's ratio is its median offloaded step over the bound from its
// medians. Reported: the median over repetitions of every figure, the
// per-repetition ratios and their median, the median of per-step ratios
// (the i-th offloaded step against the i-th resident step of the same
// repetition), and the offloaded step split
// into compute, NVMe wait, PCIe wait, comm, optimizer and the rest;
// waiting_s = step - compute - optimizer. OMP_WAIT_POLICY is recorded: on
// a busy host with few cores, spinning OpenMP threads (the default) made
// kernel times swing several-fold; measure with it set to passive there.
//
// The default job is `zinf demo`'s: the "demo" model with its built-in
// config (parameters and optimizer state on NVMe, a device budget of a
// third of the training state plus the activations).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam_arrays.h"
#include "aio/io_engine.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "cli/demo_config.h"
#include "core/fs.h"
#include "core/units.h"
#include "device/device.h"
#include "model/gpt.h"
#include "model/plan.h"
#include "model/trainer.h"
#include "report.h"
#include "scratch.h"
#include "zinf/config.h"

namespace zinf::perf {
namespace {

constexpr char kName[] = "bench step";

// The default config is `zinf demo`'s (cli/demo_config.h), its "@NVME@"
// paths replaced by the bench's nvme directory.
using cli::kDemoConfig;

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double Ns(int64_t ns) { return static_cast<double>(ns) / 1e9; }

struct Sample {
  double seconds = 0, compute = 0, nvme_wait = 0, fetch_wait = 0, comm = 0, optimizer = 0, loss = 0;
  EngineCounters c;
};

// On one rank there is no collective: the engine's reduce_scatter_ns is
// then the gradient shard's device-to-host copy and its wait, so it counts
// as PCIe wait, not comm.
Sample FromReport(const model::StepReport& r, int world) {
  Sample s;
  s.seconds = r.seconds;
  s.compute = r.compute_seconds;
  s.nvme_wait = Ns(r.engine.nvme_wait_ns);
  s.fetch_wait = Ns(r.engine.fetch_wait_ns + (world > 1 ? 0 : r.engine.reduce_scatter_ns));
  s.comm = Ns(r.engine.allgather_ns + (world > 1 ? r.engine.reduce_scatter_ns : 0));
  s.optimizer = Ns(r.engine.optimizer_ns);
  s.loss = r.loss;
  s.c = r.engine;
  return s;
}

template <typename F>
double MedianOf(const std::vector<Sample>& v, F f) {
  std::vector<double> x;
  for (const Sample& s : v) x.push_back(f(s));
  return Median(x);
}

// Seconds to copy `bytes` in `chunk`-byte pieces the way the device moves
// host<->device data (see the file comment), rotating through rings of
// buffers larger than the caches so no piece is copied hot.
class Copier {
 public:
  static StatusOr<std::unique_ptr<Copier>> Create(Device* device, int64_t max_chunk) {
    auto c = std::unique_ptr<Copier>(new Copier());
    c->device_ = device;
    c->ring_bytes_ = AlignUp(std::max<int64_t>(64 * kMiB, 4 * max_chunk), 4096);
    void* h = std::aligned_alloc(4096, static_cast<size_t>(c->ring_bytes_));
    if (h == nullptr) return Status::OutOfMemory("bench step: cannot allocate the copy ring");
    c->host_.reset(static_cast<char*>(h));
    std::memset(h, 1, static_cast<size_t>(c->ring_bytes_));
    if (device->kind() == DeviceKind::kCuda) {
      c->pinned_ = PinHostMemory(h, static_cast<size_t>(c->ring_bytes_)).ok();
      ZINF_ASSIGN_OR_RETURN(c->device_ring_, device->Allocate(static_cast<size_t>(c->ring_bytes_)));
      ZINF_ASSIGN_OR_RETURN(c->stream_, device->CreateStream());
    } else {
      void* d = std::aligned_alloc(4096, static_cast<size_t>(c->ring_bytes_));
      if (d == nullptr) return Status::OutOfMemory("bench step: cannot allocate the copy ring");
      c->other_.reset(static_cast<char*>(d));
      std::memset(d, 2, static_cast<size_t>(c->ring_bytes_));
    }
    return c;
  }
  ~Copier() {
    if (pinned_) UnpinHostMemory(host_.get(), static_cast<size_t>(ring_bytes_)).IgnoreError();
    if (device_ring_ != nullptr) device_->Free(device_ring_);
  }

  StatusOr<double> Seconds(int64_t bytes, int64_t chunk, bool to_device) {
    if (bytes <= 0) return 0.0;
    chunk = std::clamp<int64_t>(chunk, 1, ring_bytes_);
    const auto t0 = Clock::now();
    int64_t off = 0;
    for (int64_t done = 0; done < bytes; done += chunk) {
      const int64_t n = std::min(chunk, bytes - done);
      if (off + n > ring_bytes_) off = 0;
      if (stream_) {
        char* d = static_cast<char*>(device_ring_) + off;
        char* h = host_.get() + off;
        ZINF_RETURN_IF_ERROR(to_device
                                 ? stream_->CopyAsync(d, h, static_cast<size_t>(n), CopyDirection::kHostToDevice)
                                 : stream_->CopyAsync(h, d, static_cast<size_t>(n), CopyDirection::kDeviceToHost));
      } else if (to_device) {
        std::memcpy(other_.get() + off, host_.get() + off, static_cast<size_t>(n));
      } else {
        std::memcpy(host_.get() + off, other_.get() + off, static_cast<size_t>(n));
      }
      off += n;
    }
    if (stream_) ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    return SecondsSince(t0);
  }
  bool pinned() const { return pinned_; }

 private:
  Copier() = default;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  Device* device_ = nullptr;
  int64_t ring_bytes_ = 0;
  std::unique_ptr<char, Free> host_, other_;
  void* device_ring_ = nullptr;
  std::unique_ptr<Stream> stream_;
  bool pinned_ = false;
};

// What `zinf plan`'s estimator (model/plan.h) predicts for this model and
// config when given the rates this run measured: Adam params/s from adam_s,
// NVMe read and write GB/s both fio's mixed rate, PCIe GB/s the copy rate,
// and its FLOP/s calibrated so that its compute term equals the resident
// run's compute time (the estimator's FLOP count is 6 P per token, 8 with
// a recompute; a host device has no FLOP/s of its own to quote). What is
// then compared is the estimator's byte counts and how it combines the
// parts. An error object when the estimator refuses the config.
nlohmann::ordered_json PlanPrediction(const model::GptConfig& gpt, const Config& config, int world, bool on_gpu,
                                      int64_t tokens_per_rank, int64_t params, double compute_s, double adam_s,
                                      double nvme_gbps, double copy_gbps, double measured_step_s,
                                      model::LayerActivations activations) {
  model::PlanInputs in;
  in.model = gpt;
  in.world_size = world;
  in.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  in.grad_accum = static_cast<int>(config.gradient_accumulation_steps);
  in.cuda = on_gpu;
  in.activations = activations;  // both runs'
  if (compute_s > 0) {           // the plan's FLOPs per token and parameter: 6, and 2 more for a recompute
    const double flops = activations == model::LayerActivations::kKeep ? 6.0 : 8.0;
    in.speeds.gpu_flops =
        flops * static_cast<double>(params) / world * static_cast<double>(tokens_per_rank) / compute_s;
  }
  if (adam_s > 0) in.speeds.adam_params_per_s = static_cast<double>(params) / adam_s;
  if (nvme_gbps > 0) in.speeds.nvme_read_gbps = in.speeds.nvme_write_gbps = nvme_gbps;
  if (copy_gbps > 0) in.speeds.pcie_gbps = copy_gbps;
  StatusOr<model::PlanOption> o = model::EstimateOption(in, config);
  if (!o.ok()) return {{"error", o.status().ToString()}};
  nlohmann::ordered_json p;
  p["step_s"] = o->step_s;
  p["measured_over_predicted"] = o->step_s > 0 ? measured_step_s / o->step_s : 0.0;
  p["bound_by"] = o->bound_by;
  p["compute_s"] = o->compute_s;
  p["param_nvme_s"] = o->param_nvme_s;
  p["pcie_s"] = o->pcie_s;
  p["adam_s"] = o->adam_s;
  p["optimizer_nvme_s"] = o->optimizer_nvme_s;
  p["write_home_s"] = o->write_home_s;
  p["nvme_read_bytes"] = o->nvme_read_bytes;
  p["nvme_write_bytes"] = o->nvme_write_bytes;
  p["h2d_bytes"] = o->h2d_bytes;
  p["d2h_bytes"] = o->d2h_bytes;
  p["rates"] = "measured in this run; gpu_flops calibrated to the resident compute time";
  return p;
}

// What the flags ask for (a bad one is a usage error, exit code 2) and the
// config they name.
struct Options {
  int64_t steps = 0, reps = 0, threads = 0;
  std::string model_name;
  model::GptConfig model;
  DeviceOptions::Choice choice = DeviceOptions::Choice::kAuto;
  bool use_fio = true;
  std::string html_path, json_path;
  std::optional<std::string> config_path;
  std::optional<std::string> nvme_path;  // --nvme-path: one scratch directory serves both sections
  // -1: a third of the training state (zinf demo's budget) plus the
  // activations and scratch (known once a trainer exists), so that small
  // models whose activations outweigh their state still run.
  int64_t device_budget = -1;
  // As loaded; MakeScratch puts its NVMe paths into scratch directories and
  // ResolveConfig resolves its "auto" values.
  Config config;
};

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  ZINF_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args,
                                                            {"config", "model", "steps", "reps", "nvme-path",
                                                             "device-budget", "html", "json", "threads", "device"},
                                                            {"no-fio"}));
  auto steps = flags.GetInt("steps", 5);
  auto reps = flags.GetInt("reps", 3);
  auto threads = flags.GetInt("threads", 0);
  for (const auto* v : {&steps, &reps, &threads}) {
    if (!v->ok()) return v->status();
  }
  if (*steps < 1 || *reps < 1 || *threads < 0) {
    return Status::InvalidArgument("--steps and --reps must be positive, --threads >= 0");
  }
  Options o;
  o.steps = *steps;
  o.reps = *reps;
  o.threads = *threads;
  o.model_name = flags.GetOr("model", "demo");
  ZINF_ASSIGN_OR_RETURN(o.model, model::LoadGptConfig(o.model_name));
  ZINF_ASSIGN_OR_RETURN(o.choice, cli::ParseDeviceChoice(flags.GetOr("device", "auto")));
  o.use_fio = !flags.Has("no-fio");
  o.html_path = flags.GetOr("html", "");
  o.json_path = flags.GetOr("json", "");
  o.config_path = flags.Get("config");
  ZINF_ASSIGN_OR_RETURN(
      o.config, o.config_path ? LoadConfigFile(*o.config_path) : ParseConfig(kDemoConfig, "zinf demo's config"));
  o.nvme_path = flags.Get("nvme-path");
  auto budget = flags.GetInt("device-budget", -1);
  if (!budget.ok() || *budget < -1) {
    return budget.ok() ? Status::InvalidArgument("--device-budget must be >= 0") : budget.status();
  }
  o.device_budget = *budget;
  return o;
}

// Where the scratch directories go: --nvme-path, else the config's distinct
// NVMe paths ("@NVME@": zinf demo's placeholder), else $TMPDIR or /tmp.
std::vector<std::string> ScratchBases(const Options& o) {
  if (o.nvme_path) return {*o.nvme_path};
  std::vector<std::string> bases;
  std::set<std::string> seen;
  for (const auto* list : {&o.config.zero.offload_param.nvme_paths, &o.config.zero.offload_optimizer.nvme_paths}) {
    for (const std::string& p : *list) {
      if (p != "@NVME@" && seen.insert(p).second) bases.push_back(p);
    }
  }
  if (bases.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    bases.push_back(tmp && *tmp ? tmp : "/tmp");
  }
  return bases;
}

// Makes a scratch directory inside each base and points the config's NVMe
// paths at them: with several configured paths each keeps its place; one
// --nvme-path (or the placeholder) serves both sections.
StatusOr<std::vector<ScratchDir>> MakeScratch(Options& o) {
  const std::vector<std::string> bases = ScratchBases(o);
  std::vector<ScratchDir> scratch;
  for (const std::string& b : bases) {
    ZINF_ASSIGN_OR_RETURN(ScratchDir d, ScratchDir::Create(b, "zinf-bench-step"));
    scratch.push_back(std::move(d));
  }
  auto remap = [&](std::vector<std::string>& list) {
    if (o.nvme_path || list.empty() || list.front() == "@NVME@") {
      list = {scratch.front().path()};
      return;
    }
    for (std::string& p : list) {
      p = scratch[static_cast<size_t>(std::find(bases.begin(), bases.end(), p) - bases.begin())].path();
    }
  };
  remap(o.config.zero.offload_param.nvme_paths);
  remap(o.config.zero.offload_optimizer.nvme_paths);
  return scratch;
}

// Resolves the config's "auto" values for this model and run length (after
// MakeScratch: the aio thread count follows the number of paths).
Status ResolveConfig(Options& o) {
  AutoContext ctx;
  ctx.hidden_size = o.model.n_embd;
  ctx.total_steps = 1 + o.steps * o.reps;
  return ResolveAuto(o.config, ctx);
}

// The distinct directories the offloaded run's NVMe tiers use.
std::vector<std::string> NvmeDirs(const Config& config) {
  std::vector<std::string> dirs;
  std::set<std::string> seen;
  auto add = [&](OffloadDevice device, const std::vector<std::string>& paths) {
    if (device != OffloadDevice::kNvme) return;
    for (const auto& p : paths) {
      if (seen.insert(p).second) dirs.push_back(p);
    }
  };
  add(config.zero.offload_param.device, config.zero.offload_param.nvme_paths);
  add(config.zero.offload_optimizer.device, config.zero.offload_optimizer.nvme_paths);
  return dirs;
}

// The two trainers and their devices, after the warm-up steps.
struct Trainers {
  // Declared in creation order, so that each trainer goes before its device.
  std::unique_ptr<Device> rdevice;      // the resident run's: no budget
  std::unique_ptr<model::Trainer> res;  // every tier on the device
  std::unique_ptr<Device> device;       // the offloaded run's, under the budget
  std::unique_ptr<model::Trainer> off;  // the config's tiers
  bool on_gpu = false;
  int64_t device_budget = 0;
  int world = 1;
  model::StepReport warm_up;  // the offloaded run's step 2 (the last warm-up step)
  double step1_loss = 0;
};

StatusOr<Trainers> CreateTrainers(const Options& o) {
  Trainers t;
  // The resident run first, on a device without a budget: it must fit.
  DeviceOptions ropt;
  ropt.choice = o.choice;
  ZINF_ASSIGN_OR_RETURN(t.rdevice, CreateDevice(ropt));
  t.on_gpu = t.rdevice->kind() == DeviceKind::kCuda;
  Config resident = o.config;
  resident.zero.offload_param.device = OffloadDevice::kNone;
  resident.zero.offload_optimizer.device = OffloadDevice::kNone;
  model::TrainerOptions topt;
  topt.model = o.model;
  topt.engine.run_id = "zinf-bench-step";
  topt.engine.optimizer_threads = static_cast<int>(o.threads);
  model::TrainerOptions ropts = topt;
  ropts.hooks.device = t.rdevice.get();
  ropts.engine.run_id = "zinf-bench-step-resident";
  // Both runs do the same work: they keep the layers' activations when
  // zinf train's --activations auto would under the offloaded run's budget.
  // The default budget counts the resident run's activations in, so the
  // resident run is made again when that budget says otherwise.
  const int batch = static_cast<int>(o.config.train_micro_batch_size_per_gpu);
  const int64_t state_bytes = o.model.NumParameters() * (16 + 2);
  const int64_t elem_bytes = ElementSizeBytes(zero3::WorkingType(o.config));
  auto auto_for = [&](int64_t device_bytes) {  // whole layers, as the trainers cut them
    return model::AutoLayerActivations(o.model, batch, model::KernelsFor(t.on_gpu, topt.gpu_compute16), device_bytes,
                                       elem_bytes, 0);
  };
  const int64_t sized_by = o.device_budget >= 0 ? o.device_budget : static_cast<int64_t>(t.rdevice->capacity_bytes());
  ropts.activations = auto_for(sized_by);
  for (int attempt = 0; attempt < 2; ++attempt) {
    t.res.reset();
    auto res = model::Trainer::Create(resident, ropts);
    if (!res.ok()) {
      return res.status().WithContext(
          "the resident trainer (every tier on the device: the compute-only reference "
          "needs the model to fit)");
    }
    t.res = std::move(*res);
    t.device_budget = o.device_budget >= 0 ? o.device_budget : state_bytes / 3 + t.res->activation_bytes();
    topt.activations = auto_for(t.device_budget);
    if (topt.activations == ropts.activations) break;
    ropts.activations = topt.activations;
  }
  // Two attempts settle it (a resident run made again with recompute sizes
  // a smaller budget, which auto does not turn back to keep); should they
  // not, the offloaded run does what the resident one does, which auto
  // might not have picked for its budget.
  topt.activations = t.res->activations();
  DeviceOptions dopt;
  dopt.choice = t.on_gpu ? DeviceOptions::Choice::kCuda : DeviceOptions::Choice::kHost;
  dopt.host_budget_bytes = static_cast<size_t>(t.device_budget);
  dopt.cuda_budget_bytes = static_cast<size_t>(t.device_budget);
  ZINF_ASSIGN_OR_RETURN(t.device, CreateDevice(dopt));
  topt.hooks.device = t.device.get();
  std::fprintf(stderr, "bench step: model %s (%s params), device %s, %lld rep(s) of %lld step(s), activations %s\n",
               o.model_name.c_str(), FormatCount(o.model.NumParameters()).c_str(), t.device->name().c_str(),
               static_cast<long long>(o.reps), static_cast<long long>(o.steps),
               model::LayerActivationsName(topt.activations));
  auto off = model::Trainer::Create(o.config, topt);
  if (!off.ok()) return off.status().WithContext("the offloaded trainer");
  t.off = std::move(*off);
  t.world = t.off->engine().world_size();
  return t;
}

// Warm-up: two steps of each trainer, whose losses must agree bit for bit.
// The first records the prefetch order; the second is the steady state
// the fio job is sized from (the first reads no m and v from NVMe: they
// start zero, not on disk).
Status WarmUp(Trainers& t) {
  for (int step = 1; step <= 2; ++step) {
    ZINF_ASSIGN_OR_RETURN(const model::StepReport w_off, t.off->Step());
    ZINF_RETURN_IF_ERROR(t.off->engine().WaitForUpdate());
    ZINF_ASSIGN_OR_RETURN(const model::StepReport w_res, t.res->Step());
    ZINF_RETURN_IF_ERROR(t.res->engine().WaitForUpdate());
    const double a = w_off.loss, b = w_res.loss;
    if (!std::isfinite(a) || !std::isfinite(b)) {
      return Status::Internal("step " + std::to_string(step) + " loss is not finite (offloaded " + std::to_string(a) +
                              ", resident " + std::to_string(b) + ")");
    }
    if (a != b) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "step %d loss differs between the offloaded (%.9g) and resident (%.9g) runs",
                    step, a, b);
      return Status::Internal(buf);
    }
    if (step == 1) t.step1_loss = a;
    t.warm_up = w_off;
  }
  return Status::Ok();
}

int64_t NvmeBytes(const EngineCounters& c) {
  return c.nvme_read_bytes + c.nvme_write_bytes + c.optimizer_nvme_bytes + c.gradient_nvme_bytes;
}

// What measures the parts of the bound besides the resident run: fio's
// mixed jobs on the NVMe paths, the copier, Adam alone.
struct PartTools {
  std::unique_ptr<FioHugePages> fio_pages;  // like the pinned pool's buffers; see aio_perf.h
  ScratchFiles fio_files;
  std::vector<FioRun> fio_runs;  // one per NVMe directory; none without fio or NVMe
  std::string fio_version = "not run";
  int read_percent = 50;
  int64_t h2d_chunk = 0, d2h_chunk = 0;
  std::unique_ptr<Copier> copier;
  std::unique_ptr<AdamAlone> adam;
};

// fio's files: laid out once, as large as a step's traffic on each path,
// for a mixed job at the step's read share.
Status PrepareFio(const Options& o, const EngineCounters& wc, const std::vector<std::string>& nvme_dirs,
                  PartTools& tools) {
  // Of the optimizer's bytes per parameter: master, m, v 12 read and 12
  // written; the gradient (one micro-batch) 4 written and 4 read.
  const double opt_read_share = 0.5;
  const double step_read_bytes = static_cast<double>(wc.nvme_read_bytes) +
                                 opt_read_share * static_cast<double>(wc.optimizer_nvme_bytes + wc.gradient_nvme_bytes);
  if (NvmeBytes(wc) > 0) {
    tools.read_percent = static_cast<int>(std::lround(100.0 * step_read_bytes / static_cast<double>(NvmeBytes(wc))));
  }
  const bool nvme_used = o.config.zero.offload_param.device == OffloadDevice::kNvme ||
                         o.config.zero.offload_optimizer.device == OffloadDevice::kNvme;
  if (!o.use_fio || !nvme_used) return Status::Ok();
  aio::IoEngineOptions eo = aio::FromAioConfig(o.config.aio);
  if (nvme_dirs.size() > 1) eo.thread_count = 1;
  FioRun probe;
  probe.engine = eo;
  tools.fio_pages = std::make_unique<FioHugePages>(FioBufferBytes(probe));
  auto version = FioVersion();
  if (!version.ok()) return version.status().WithContext("(or pass --no-fio)");
  tools.fio_version = *version;
  const int64_t per_path = AlignUp(std::max<int64_t>(64 * kMiB, NvmeBytes(wc) / static_cast<int64_t>(nvme_dirs.size())),
                                   eo.block_size_bytes * eo.thread_count);
  for (const std::string& dir : nvme_dirs) {
    FioRun run = probe;
    run.huge_pages = tools.fio_pages->active();
    run.file = JoinPath(dir, "bench-step.fio");
    run.size_bytes = per_path;
    run.op = aio::IoOp::kWrite;
    tools.fio_files.Add(run.file);
    tools.fio_runs.push_back(run);
    ZINF_RETURN_IF_ERROR(RunFio(run).status());
    tools.fio_runs.back().read_percent = tools.read_percent;
  }
  return Status::Ok();
}

StatusOr<PartTools> PrepareParts(const Options& o, const Trainers& t, const std::vector<std::string>& nvme_dirs) {
  PartTools tools;
  const EngineCounters& wc = t.warm_up.engine;
  ZINF_RETURN_IF_ERROR(PrepareFio(o, wc, nvme_dirs, tools));
  // Transfer sizes as the engine moves them: a block's shard per fetch,
  // a block's gradient shard per ReduceGradients.
  tools.h2d_chunk = wc.fetches > 0 ? std::max<int64_t>(1, wc.h2d_bytes / wc.fetches) : kMiB;
  const int64_t reduces = static_cast<int64_t>(t.off->engine().num_blocks()) * o.config.gradient_accumulation_steps;
  tools.d2h_chunk = std::max<int64_t>(1, wc.d2h_bytes / std::max<int64_t>(1, reduces));
  // On the resident run's device: no budget to squeeze the copy rings into.
  ZINF_ASSIGN_OR_RETURN(tools.copier, Copier::Create(t.rdevice.get(), std::max(tools.h2d_chunk, tools.d2h_chunk)));
  const ElementType out_dtype = o.config.fp16.enabled ? ElementType::kF16 : ElementType::kBf16;
  ZINF_ASSIGN_OR_RETURN(tools.adam, AdamAlone::Create(o.config.optimizer, static_cast<int>(o.threads),
                                                      o.model.NumParameters(), out_dtype));
  ZINF_RETURN_IF_ERROR(tools.adam->TimeUpdate().status());  // pages touched
  return tools;
}

// One repetition: its steps and the parts of the bound measured beside them.
struct Rep {
  std::vector<Sample> off, res;
  double step = 0, compute = 0, kernels = 0, adam = 0, cpu = 0, nvme = 0, pcie = 0, comm = 0, bound = 0, ratio = 0,
         ratio_kernels = 0;
  double fio_gbps = 0, nvme_bytes = 0, pcie_bytes = 0;
  std::string bound_by;
};

// `steps` steps of `t` back to back; the last step's update is waited for
// and counted in that step.
Status RunSteps(model::Trainer& t, int64_t steps, int world, std::vector<Sample>& out) {
  for (int64_t i = 0; i < steps; ++i) {
    ZINF_ASSIGN_OR_RETURN(const model::StepReport s, t.Step());
    out.push_back(FromReport(s, world));
  }
  const auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(t.engine().WaitForUpdate());
  const double tail = SecondsSince(t0);
  out.back().seconds += tail;
  out.back().optimizer += tail;
  return Status::Ok();
}

// The bound from the parts: on the host device compute and Adam share the
// cores and count as one part ("cpu").
void SetBound(Rep& rep, bool on_gpu) {
  std::vector<std::pair<std::string, double>> parts;
  if (on_gpu) {
    parts = {{"compute", rep.compute}, {"adam", rep.adam}};
  } else {
    parts = {{"cpu", rep.cpu}};
  }
  parts.insert(parts.end(), {{"nvme", rep.nvme}, {"pcie", rep.pcie}, {"comm", rep.comm}});
  for (const auto& [name, v] : parts) {
    if (v > rep.bound) {
      rep.bound = v;
      rep.bound_by = name;
    }
  }
  rep.ratio = rep.bound > 0 ? rep.step / rep.bound : 0.0;
  // The same with the compute part cut to the model's kernel time.
  const double k = on_gpu ? std::max(rep.kernels, rep.adam) : rep.kernels + rep.adam;
  const double b = std::max({k, rep.nvme, rep.pcie, rep.comm});
  rep.ratio_kernels = b > 0 ? rep.step / b : 0.0;
}

// Repetition r: each trainer runs its steps back to back (which goes first
// alternates per repetition, so that other work on the machine slows both
// alike): a step's optimizer update runs under the next step's forward
// pass, so interleaving the trainers would let one's update run inside the
// other's timed step. Then three in-RAM Adam updates, the copies and one
// fio mixed job.
StatusOr<Rep> MeasureRep(const Options& o, Trainers& t, PartTools& tools, int64_t r) {
  Rep rep;
  for (int k = 0; k < 2; ++k) {
    const bool offloaded = (k == 0) == (r % 2 == 0);
    ZINF_RETURN_IF_ERROR(RunSteps(offloaded ? *t.off : *t.res, o.steps, t.world, offloaded ? rep.off : rep.res));
  }
  std::vector<double> adam_s;
  for (int k = 0; k < 3; ++k) {
    ZINF_ASSIGN_OR_RETURN(const double s, tools.adam->TimeUpdate());
    adam_s.push_back(s);
  }
  const double h2d = MedianOf(rep.off, [](const Sample& s) { return double(s.c.h2d_bytes); });
  const double d2h = MedianOf(rep.off, [](const Sample& s) { return double(s.c.d2h_bytes); });
  ZINF_ASSIGN_OR_RETURN(const double up, tools.copier->Seconds(static_cast<int64_t>(h2d), tools.h2d_chunk, true));
  ZINF_ASSIGN_OR_RETURN(const double down, tools.copier->Seconds(static_cast<int64_t>(d2h), tools.d2h_chunk, false));
  ZINF_ASSIGN_OR_RETURN(const double gbps, RunFioSum(tools.fio_runs));
  rep.step = MedianOf(rep.off, [](const Sample& s) { return s.seconds; });
  rep.compute = MedianOf(rep.res, [](const Sample& s) { return s.seconds - s.optimizer; });
  rep.kernels = MedianOf(rep.res, [](const Sample& s) { return s.compute; });
  rep.adam = Median(adam_s);
  rep.cpu = rep.compute + rep.adam;
  rep.nvme_bytes = MedianOf(rep.off, [](const Sample& s) { return double(NvmeBytes(s.c)); });
  rep.fio_gbps = gbps;
  rep.nvme = gbps > 0 ? rep.nvme_bytes / (gbps * 1e9) : 0.0;
  rep.pcie_bytes = h2d + d2h;
  rep.pcie = up + down;
  rep.comm = MedianOf(rep.off, [](const Sample& s) { return s.comm; });
  SetBound(rep, t.on_gpu);
  return rep;
}

// Every repetition, the per-step ratios (the i-th offloaded step against
// the i-th resident step's parts) and whether all timed losses agreed.
struct Measured {
  std::vector<Rep> reps;
  std::vector<double> pair_ratios;
  bool same_losses = true;
};

StatusOr<Measured> Measure(const Options& o, Trainers& t, PartTools& tools) {
  Measured m;
  for (int64_t r = 0; r < o.reps; ++r) {
    ZINF_ASSIGN_OR_RETURN(Rep rep, MeasureRep(o, t, tools, r));
    for (size_t i = 0; i < static_cast<size_t>(o.steps); ++i) {
      const double a = rep.off[i].loss, b = rep.res[i].loss;
      if (!std::isfinite(a) || a != b) m.same_losses = false;
    }
    for (size_t i = 0; i < rep.off.size(); ++i) {
      const Sample& s = rep.off[i];
      const double compute_i = rep.res[i].seconds - rep.res[i].optimizer;
      const double cpu_i = t.on_gpu ? std::max(compute_i, rep.adam) : compute_i + rep.adam;
      const double nvme_i = rep.fio_gbps > 0 ? static_cast<double>(NvmeBytes(s.c)) / (rep.fio_gbps * 1e9) : 0.0;
      const double b = std::max({cpu_i, nvme_i, rep.pcie, s.comm});
      if (b > 0) m.pair_ratios.push_back(s.seconds / b);
    }
    std::fprintf(stderr,
                 "  rep %lld: step %.3f s (compute %.3f, optimizer %.3f) | parts: compute %.3f + adam %.4f, "
                 "nvme %.4f (%.0f MB at %.2f GB/s), pcie %.4f, comm %.4f -> bound %.3f (%s), ratio %.3f\n",
                 static_cast<long long>(r + 1), rep.step, MedianOf(rep.off, [](const Sample& s) { return s.compute; }),
                 MedianOf(rep.off, [](const Sample& s) { return s.optimizer; }), rep.compute, rep.adam, rep.nvme,
                 rep.nvme_bytes / 1e6, rep.fio_gbps, rep.pcie, rep.comm, rep.bound, rep.bound_by.c_str(), rep.ratio);
    m.reps.push_back(std::move(rep));
  }
  return m;
}

// The medians over repetitions (of each repetition's figure) and over all
// timed steps (of each step's).
struct Summary {
  std::vector<Sample> all_off, all_res;
  std::vector<double> ratios;  // per repetition
  double step_s = 0, bound_s = 0, ratio_kernels = 0, pairwise = 0;
  std::string bound_by;
  double compute_s = 0, kernels_s = 0, adam_s = 0, cpu_s = 0, nvme_s = 0, pcie_s = 0, comm_s = 0;
  double fio_gbps = 0, copy_gbps = 0;
};

Summary Summarize(const Measured& m) {
  auto med = [&](auto f) {
    std::vector<double> v;
    for (const Rep& r : m.reps) v.push_back(f(r));
    return Median(v);
  };
  Summary s;
  for (const Rep& r : m.reps) {
    s.all_off.insert(s.all_off.end(), r.off.begin(), r.off.end());
    s.all_res.insert(s.all_res.end(), r.res.begin(), r.res.end());
    s.ratios.push_back(r.ratio);
  }
  s.step_s = med([](const Rep& r) { return r.step; });
  s.bound_s = med([](const Rep& r) { return r.bound; });
  s.bound_by = m.reps[m.reps.size() / 2].bound_by;
  s.ratio_kernels = med([](const Rep& r) { return r.ratio_kernels; });
  s.pairwise = Median(m.pair_ratios);
  s.compute_s = med([](const Rep& r) { return r.compute; });
  s.kernels_s = med([](const Rep& r) { return r.kernels; });
  s.adam_s = med([](const Rep& r) { return r.adam; });
  s.cpu_s = med([](const Rep& r) { return r.cpu; });
  s.nvme_s = med([](const Rep& r) { return r.nvme; });
  s.pcie_s = med([](const Rep& r) { return r.pcie; });
  s.comm_s = med([](const Rep& r) { return r.comm; });
  s.fio_gbps = med([](const Rep& r) { return r.fio_gbps; });
  s.copy_gbps = med([](const Rep& r) { return r.pcie > 0 ? r.pcie_bytes / r.pcie / 1e9 : 0.0; });
  return s;
}

const char* OffloadName(OffloadDevice d) {
  return d == OffloadDevice::kNvme ? "nvme" : d == OffloadDevice::kCpu ? "cpu" : "none";
}

// The offloaded step split into compute, waits, comm and optimizer (medians
// over all offloaded steps).
nlohmann::ordered_json BreakdownJson(const Summary& s) {
  nlohmann::ordered_json br;
  br["step_s"] = s.step_s;
  br["compute_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.compute; });
  br["nvme_wait_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.nvme_wait; });
  br["pcie_wait_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.fetch_wait; });
  br["comm_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.comm; });
  br["optimizer_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.optimizer; });
  br["waiting_s"] = MedianOf(s.all_off, [](const Sample& x) { return x.seconds - x.compute - x.optimizer; });
  return br;
}

// What an offloaded step moved (medians over all offloaded steps).
nlohmann::ordered_json PerStepJson(const Summary& s) {
  auto med = [&](auto f) { return MedianOf(s.all_off, f); };
  nlohmann::ordered_json moved;
  moved["nvme_param_read_bytes"] = med([](const Sample& x) { return double(x.c.nvme_read_bytes); });
  moved["nvme_param_write_bytes"] = med([](const Sample& x) { return double(x.c.nvme_write_bytes); });
  moved["nvme_optimizer_bytes"] = med([](const Sample& x) { return double(x.c.optimizer_nvme_bytes); });
  moved["nvme_gradient_bytes"] = med([](const Sample& x) { return double(x.c.gradient_nvme_bytes); });
  moved["h2d_bytes"] = med([](const Sample& x) { return double(x.c.h2d_bytes); });
  moved["d2h_bytes"] = med([](const Sample& x) { return double(x.c.d2h_bytes); });
  moved["fetches"] = med([](const Sample& x) { return double(x.c.fetches); });
  moved["prefetch_hits"] = med([](const Sample& x) { return double(x.c.prefetch_hits); });
  return moved;
}

nlohmann::ordered_json RunsJson(const std::vector<Rep>& reps) {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const Rep& r : reps) {
    nlohmann::ordered_json x;
    x["step_s"] = r.step;
    x["compute_s"] = r.compute;
    x["compute_kernels_s"] = r.kernels;
    x["adam_s"] = r.adam;
    x["nvme_s"] = r.nvme;
    x["pcie_s"] = r.pcie;
    x["comm_s"] = r.comm;
    x["bound_s"] = r.bound;
    x["bound_by"] = r.bound_by;
    x["ratio"] = r.ratio;
    x["ratio_kernel_time_only"] = r.ratio_kernels;
    std::vector<double> each;
    for (const Sample& s : r.off) each.push_back(s.seconds);
    x["step_s_each"] = each;
    runs.push_back(x);
  }
  return runs;
}

nlohmann::ordered_json ToJson(const Options& o, const std::vector<std::string>& nvme_dirs, const Trainers& t,
                              const PartTools& tools, const Measured& m, const Summary& s) {
  const Config& config = o.config;
  nlohmann::ordered_json j;
  j["bench"] = "step";
  j["model"] = o.model_name;
  j["params"] = o.model.NumParameters();
  j["config"] = o.config_path ? *o.config_path : "zinf demo's built-in config";
  j["offload_param"] = OffloadName(config.zero.offload_param.device);
  j["offload_optimizer"] = OffloadName(config.zero.offload_optimizer.device);
  j["device"] = t.device->name();
  j["device_budget_bytes"] = t.device_budget;
  j["nvme_paths"] = nvme_dirs;
  j["micro_batch"] = config.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = config.gradient_accumulation_steps;
  j["tokens_per_step"] = t.off->tokens_per_step();
  j["optimizer_threads"] = tools.adam->threads();
  // OpenMP's wait policy decides how the model's kernel threads share a
  // few cores with the engine's threads and other work: spinning (the
  // default) on a busy 2-core host made steps several times slower.
  const char* omp_wait = std::getenv("OMP_WAIT_POLICY");
  j["omp_wait_policy"] = omp_wait ? omp_wait : "unset (OpenMP default: spin, then sleep)";
  j["steps_per_rep"] = o.steps;
  j["reps"] = o.reps;
  j["check"] = "steps 1 and 2 (warm-up) losses finite and bit-identical between the offloaded and resident runs";
  j["losses_identical_all_steps"] = m.same_losses;
  j["step1_loss"] = t.step1_loss;
  j["ratio_to_bound"] = Median(s.ratios);
  j["ratio_to_bound_runs"] = s.ratios;
  j["ratio_to_bound_pairwise_median"] = s.pairwise;
  j["ratio_to_bound_kernel_time_only"] = s.ratio_kernels;
  j["step_s"] = s.step_s;
  j["bound_s"] = s.bound_s;
  j["bound_by"] = s.bound_by;
  nlohmann::ordered_json parts;
  parts["compute_s"] = s.compute_s;
  parts["compute_kernels_s"] = s.kernels_s;
  parts["adam_s"] = s.adam_s;
  if (!t.on_gpu) parts["cpu_s"] = s.cpu_s;
  parts["nvme_s"] = s.nvme_s;
  parts["pcie_s"] = s.pcie_s;
  parts["comm_s"] = s.comm_s;
  j["parts"] = parts;
  j["breakdown"] = BreakdownJson(s);
  nlohmann::ordered_json rs;
  rs["step_s"] = MedianOf(s.all_res, [](const Sample& x) { return x.seconds; });
  rs["compute_s"] = MedianOf(s.all_res, [](const Sample& x) { return x.compute; });
  rs["optimizer_s"] = MedianOf(s.all_res, [](const Sample& x) { return x.optimizer; });
  j["resident"] = rs;
  j["per_step"] = PerStepJson(s);
  j["fio"] = tools.fio_version;
  j["fio_buffers"] = tools.fio_pages ? tools.fio_pages->description() : "";
  j["fio_mixed_read_percent"] = tools.read_percent;
  j["fio_mixed_gbps"] = s.fio_gbps;
  j["copy"] = t.on_gpu ? std::string("cudaMemcpyAsync via Device/Stream, host memory ") +
                             (tools.copier->pinned() ? "page-locked" : "pageable (could not pin)")
                       : "memcpy (host device)";
  j["copy_gbps"] = s.copy_gbps;
  j["runs"] = RunsJson(m.reps);
  j["plan"] =
      PlanPrediction(o.model, config, t.world, t.on_gpu, t.off->tokens_per_step() / t.world, o.model.NumParameters(),
                     s.compute_s, s.adam_s, s.fio_gbps, s.copy_gbps, s.step_s, t.off->activations());
  j["activations"] = {{"resident", model::LayerActivationsName(t.res->activations())},
                      {"offloaded", model::LayerActivationsName(t.off->activations())}};
  j["compared"] =
      "ratio_to_bound = median over reps of (median offloaded step) / max(parts); parts measured in "
      "the same rep: cpu = resident-run step minus its optimizer + in-RAM Adam (host device; separate parts on a "
      "GPU), "
      "nvme = step NVMe bytes / fio mixed GB/s on the same path, pcie = the step's h2d + d2h bytes "
      "copied in the engine's sizes, comm = all-gather + reduce-scatter time";
  return j;
}

// The page: key figures, the parts per repetition, the timeline of every
// offloaded step.
HtmlReport MakeReport(const nlohmann::ordered_json& j, const Trainers& t, const Measured& m, const Summary& s) {
  HtmlReport report("zinf bench step: " + j["model"].get<std::string>() + ", " + j["offload_param"].get<std::string>() +
                    "/" + j["offload_optimizer"].get<std::string>() + " offload");
  report.AddParagraph(
      "Whole training steps of the reference GPT through the ZeRO-3 engine, against the time each "
      "resource needs for the step's work when measured alone in the same run. " +
      j["compared"].get<std::string>() + ".");
  auto f = [](double v) { return FormatFigure(v); };
  std::string per_rep;
  for (double x : s.ratios) per_rep += (per_rep.empty() ? "" : ", ") + f(x);
  const nlohmann::ordered_json& plan = j["plan"];
  report.AddTable("Key figures", {"figure", "value"},
                  {{"ratio_to_bound (median of reps)", f(Median(s.ratios))},
                   {"ratio_to_bound per rep", per_rep},
                   {"ratio_to_bound (pairwise median)", f(s.pairwise)},
                   {"step_s (offloaded, median)", f(s.step_s)},
                   {"bound_s", f(s.bound_s) + " (" + s.bound_by + ")"},
                   {"compute_s (resident step - its optimizer)", f(s.compute_s)},
                   {"compute_kernels_s (resident kernels only)", f(s.kernels_s)},
                   {"ratio with kernel time only", f(s.ratio_kernels)},
                   {"adam_s (in RAM)", f(s.adam_s)},
                   {"nvme_s", f(s.nvme_s)},
                   {"pcie_s", f(s.pcie_s)},
                   {"comm_s", f(s.comm_s)},
                   {"waiting_s (step - compute - optimizer)", f(j["breakdown"]["waiting_s"].get<double>())},
                   {"fio mixed GB/s", f(s.fio_gbps)},
                   {"zinf plan's step_s with these rates",
                    plan.is_object() && plan.contains("step_s") ? f(plan["step_s"].get<double>()) : "not available"},
                   {"device", t.device->name()},
                   {"params", FormatCount(j["params"].get<int64_t>())}});
  BarChart c;
  c.title = "Per repetition: offloaded step vs. the parts of the bound (s)";
  c.x_label = "repetition";
  c.y_label = "seconds";
  ChartSeries step{"step", {}}, cpu{t.on_gpu ? "compute" : "cpu (compute + adam)", {}}, nv{"nvme", {}}, pc{"pcie", {}},
      cm{"comm", {}}, ad{"adam", {}};
  for (size_t i = 0; i < m.reps.size(); ++i) {
    const Rep& r = m.reps[i];
    c.categories.push_back("rep " + std::to_string(i + 1) + " (ratio " + FormatFigure(r.ratio) + ")");
    step.values.push_back(r.step);
    cpu.values.push_back(t.on_gpu ? r.compute : r.cpu);
    ad.values.push_back(r.adam);
    nv.values.push_back(r.nvme);
    pc.values.push_back(r.pcie);
    cm.values.push_back(r.comm);
  }
  c.series = {step, cpu};
  if (t.on_gpu) c.series.push_back(ad);
  c.series.insert(c.series.end(), {nv, pc, cm});
  report.AddBarChart(c);
  Timeline tl;
  tl.title = "Offloaded steps: where the time went";
  tl.unit = "s";
  tl.segment_names = {"compute", "nvme wait", "pcie wait", "comm", "optimizer", "other"};
  for (size_t r = 0; r < m.reps.size(); ++r) {
    int k = 0;
    for (const Sample& x : m.reps[r].off) {
      const double rest = x.seconds - x.compute - x.nvme_wait - x.fetch_wait - x.comm - x.optimizer;
      tl.rows.push_back({"rep " + std::to_string(r + 1) + " step " + std::to_string(++k),
                         {x.compute, x.nvme_wait, x.fetch_wait, x.comm, x.optimizer, rest}});
    }
  }
  tl.markers = {{"bound", s.bound_s}};
  report.AddTimeline(tl);
  return report;
}

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) return cli::Fail(kName, options.status(), 2);
  Options& o = *options;
  // Declared before the trainers: the directories go after the trainers close their files.
  auto scratch = MakeScratch(o);
  if (!scratch.ok()) return cli::Fail(kName, scratch.status());
  if (Status s = ResolveConfig(o); !s.ok()) return cli::Fail(kName, s, 2);
  const std::vector<std::string> nvme_dirs = NvmeDirs(o.config);

  auto trainers = CreateTrainers(o);
  if (!trainers.ok()) return cli::Fail(kName, trainers.status());
  if (Status s = WarmUp(*trainers); !s.ok()) return cli::Fail(kName, s);
  auto tools = PrepareParts(o, *trainers, nvme_dirs);
  if (!tools.ok()) return cli::Fail(kName, tools.status());
  auto measured = Measure(o, *trainers, *tools);
  if (!measured.ok()) return cli::Fail(kName, measured.status());
  tools->fio_files.RemoveAll();
  if (!measured->same_losses) {
    std::fprintf(stderr,
                 "bench step: warning: a timed step's loss differs between the offloaded and resident "
                 "runs (step 1 agreed)\n");
  }

  const Summary summary = Summarize(*measured);
  const nlohmann::ordered_json j = ToJson(o, nvme_dirs, *trainers, *tools, *measured, summary);
  HtmlReport report = MakeReport(j, *trainers, *measured, summary);
  if (Status s = EmitResult(j.dump(2), o.json_path, o.html_path, report); !s.ok()) return cli::Fail(kName, s);
  return 0;
}

ZINF_COMMAND({kName, "time whole training steps of the reference GPT against the resources they need",
              "bench step [--config C (zinf demo's)] [--model M (demo)] [--steps N (5)] [--reps R (3)]\n"
              "           [--nvme-path P] [--device-budget SIZE] [--device auto|cuda|host]\n"
              "           [--threads T] [--no-fio] [--html OUT.html] [--json OUT.json]\n"
              "  Trains the reference GPT with C's tiers (scratch files in a directory made inside P or\n"
              "  C's nvme paths, removed after), and next to it a run with every tier resident. After a\n"
              "  two warm-up steps whose losses must agree, each of R repetitions times N offloaded steps and N\n"
              "  resident steps (each run's back to back, its last update waited for) and the other\n"
              "  parts of the bound: compute (the resident\n"
              "  step minus its optimizer), Adam over the same parameters in RAM, the step's NVMe bytes\n"
              "  over fio's mixed bandwidth on the same path, the step's h2d/d2h bytes copied, and\n"
              "  all-gather/reduce-scatter time. On the host\n"
              "  device compute and Adam share the cores and count as one part. --device-budget caps the\n"
              "  offloaded run's device memory (default: a third of the training state, zinf demo's, plus\n"
              "  the activations; 0: none).\n"
              "  Prints JSON: ratio_to_bound = step / max(parts) (median over reps, and per rep), parts,\n"
              "  the offloaded step's breakdown (compute, nvme wait, pcie wait, comm, optimizer,\n"
              "  waiting = step - compute - optimizer). --html writes a page with charts, --json a copy.",
              Run});

}  // namespace
}  // namespace zinf::perf
