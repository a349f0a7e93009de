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
// The run: both trainers take one warm-up step (it records the prefetch
// order); their losses must be finite and equal (the engine is
// bit-identical across tiers), else the bench fails before timing. Then
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
#include <unistd.h>

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

#include "aio/io_engine.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "core/fs.h"
#include "core/units.h"
#include "device/device.h"
#include "model/gpt.h"
#include "model/trainer.h"
#if __has_include("model/plan.h")
#include "model/plan.h"
#endif
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "cli/demo_config.h"
#include "report.h"
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
        ZINF_RETURN_IF_ERROR(to_device ? stream_->CopyAsync(d, h, static_cast<size_t>(n), CopyDirection::kHostToDevice)
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

// CpuAdam over n parameters in RAM, as the engine runs it (fp32 state and
// gradient, 16-bit output, the engine's thread count, unbound threads).
class AdamAlone {
 public:
  static StatusOr<std::unique_ptr<AdamAlone>> Create(const OptimizerConfig& config, int threads, int64_t n,
                                                     ElementType out_dtype) {
    auto a = std::unique_ptr<AdamAlone>(new AdamAlone());
    optim::ThreadPool::Options to;
    to.num_threads = threads;
    to.bind_threads = false;
    to.name = "bench-adam";
    ZINF_ASSIGN_OR_RETURN(a->pool_, optim::ThreadPool::Create(to));
    ZINF_ASSIGN_OR_RETURN(optim::Isa isa, optim::DefaultIsa());
    ZINF_ASSIGN_OR_RETURN(optim::CpuAdam adam, optim::CpuAdam::Create(config, a->pool_.get(), isa));
    a->adam_ = std::make_unique<optim::CpuAdam>(std::move(adam));
    a->n_ = n;
    a->out_dtype_ = out_dtype;
    const size_t un = static_cast<size_t>(n);
    a->p_.assign(un, 0.01f);
    a->m_.assign(un, 0.0f);
    a->v_.assign(un, 0.0f);
    a->g_.resize(un);
    for (size_t i = 0; i < un; ++i) a->g_[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 17) - 8);
    a->out_.assign(un, 0);
    return a;
  }
  StatusOr<double> TimeUpdate() {
    optim::AdamSpan span{p_.data(), m_.data(), v_.data(), g_.data(), ElementType::kF32, out_.data(), out_dtype_, n_};
    optim::AdamStepArgs args;
    args.step = ++step_;
    args.lr = 1e-4;
    const auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(adam_->Update(span, args));
    return SecondsSince(t0);
  }
  int threads() const { return pool_->num_threads(); }

 private:
  AdamAlone() = default;
  std::unique_ptr<optim::ThreadPool> pool_;
  std::unique_ptr<optim::CpuAdam> adam_;
  int64_t n_ = 0;
  int64_t step_ = 0;
  ElementType out_dtype_ = ElementType::kBf16;
  std::vector<float> p_, m_, v_, g_;
  std::vector<uint16_t> out_;
};

// What `zinf plan`'s estimator (model/plan.h) predicts for this model and
// config when given the rates this run measured: Adam params/s from adam_s,
// NVMe read and write GB/s both fio's mixed rate, PCIe GB/s the copy rate,
// and its FLOP/s calibrated so that its compute term equals the resident
// run's compute time (the estimator's FLOP count is 8 P per token; a host
// device has no FLOP/s of its own to quote). What is then compared is the
// estimator's byte counts and how it combines the parts. null when the
// estimator is not built in or refuses the config.
nlohmann::ordered_json PlanPrediction(const model::GptConfig& gpt, const Config& config, int world, bool on_gpu,
                                      int64_t tokens_per_rank, int64_t params, double compute_s, double adam_s,
                                      double nvme_gbps, double copy_gbps, double measured_step_s) {
#if __has_include("model/plan.h")
  model::PlanInputs in;
  in.model = gpt;
  in.world_size = world;
  in.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  in.grad_accum = static_cast<int>(config.gradient_accumulation_steps);
  in.cuda = on_gpu;
  if (compute_s > 0) {
    in.speeds.gpu_flops = 8.0 * static_cast<double>(params) / world * static_cast<double>(tokens_per_rank) / compute_s;
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
#else
  (void)gpt, (void)config, (void)world, (void)on_gpu, (void)tokens_per_rank, (void)params, (void)compute_s,
      (void)adam_s, (void)nvme_gbps, (void)copy_gbps, (void)measured_step_s;
  return nullptr;
#endif
}

StatusOr<DeviceOptions::Choice> ParseDeviceChoice(const std::string& s) {
  if (s == "auto") return DeviceOptions::Choice::kAuto;
  if (s == "cuda") return DeviceOptions::Choice::kCuda;
  if (s == "host") return DeviceOptions::Choice::kHost;
  return Status::InvalidArgument("--device must be auto, cuda or host, got '" + s + "'");
}

// A per-run scratch directory inside `base` (removed at the end).
StatusOr<std::string> MakeScratchDir(const std::string& base) {
  ZINF_RETURN_IF_ERROR(MakeDirectories(base));
  std::string tmpl = JoinPath(base, "zinf-bench-step.XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus(errno, "mkdtemp", tmpl);
  return tmpl;
}

int Run(const std::vector<std::string>& args) {
  auto flags = cli::Flags::Parse(args,
                                 {"config", "model", "steps", "reps", "nvme-path", "device-budget", "html", "json",
                                  "threads", "device"},
                                 {"no-fio"});
  if (!flags.ok()) return cli::Fail(kName, flags.status(), 2);
  auto steps = flags->GetInt("steps", 5);
  auto reps = flags->GetInt("reps", 3);
  auto threads = flags->GetInt("threads", 0);
  for (const auto* v : {&steps, &reps, &threads}) {
    if (!v->ok()) return cli::Fail(kName, v->status(), 2);
  }
  if (*steps < 1 || *reps < 1 || *threads < 0) {
    return cli::Fail(kName, Status::InvalidArgument("--steps and --reps must be positive, --threads >= 0"), 2);
  }
  const std::string model_name = flags->GetOr("model", "demo");
  auto model = model::LoadGptConfig(model_name);
  if (!model.ok()) return cli::Fail(kName, model.status(), 2);
  auto choice = ParseDeviceChoice(flags->GetOr("device", "auto"));
  if (!choice.ok()) return cli::Fail(kName, choice.status(), 2);
  const bool use_fio = !flags->Has("no-fio");
  const std::string html_path = flags->GetOr("html", "");
  const std::string json_path = flags->GetOr("json", "");

  // The config, its nvme paths replaced by scratch directories inside them.
  const auto config_path = flags->Get("config");
  StatusOr<Config> parsed = config_path ? LoadConfigFile(*config_path) : ParseConfig(kDemoConfig, "zinf demo's config");
  if (!parsed.ok()) return cli::Fail(kName, parsed.status(), 2);
  Config config = *parsed;
  std::vector<std::string> bases;
  if (const auto given = flags->Get("nvme-path")) {
    bases = {*given};
  } else {
    std::set<std::string> seen;
    for (const auto* list : {&config.zero.offload_param.nvme_paths, &config.zero.offload_optimizer.nvme_paths}) {
      for (const std::string& p : *list) {
        if (p != "@NVME@" && seen.insert(p).second) bases.push_back(p);
      }
    }
    if (bases.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      bases.push_back(tmp && *tmp ? tmp : "/tmp");
    }
  }
  std::vector<std::string> scratch;
  auto cleanup = [&] {
    for (const std::string& d : scratch) RemoveTree(d).IgnoreError();
  };
  for (const std::string& b : bases) {
    auto d = MakeScratchDir(b);
    if (!d.ok()) {
      cleanup();
      return cli::Fail(kName, d.status());
    }
    scratch.push_back(*d);
  }
  // With several configured paths each keeps its place; one --nvme-path serves both sections.
  auto remap = [&](std::vector<std::string>& list) {
    if (flags->Has("nvme-path") || list.empty() || list.front() == "@NVME@") {
      list = {scratch.front()};
      return;
    }
    for (std::string& p : list) p = scratch[static_cast<size_t>(std::find(bases.begin(), bases.end(), p) - bases.begin())];
  };
  remap(config.zero.offload_param.nvme_paths);
  remap(config.zero.offload_optimizer.nvme_paths);
  AutoContext ctx;
  ctx.hidden_size = model->n_embd;
  ctx.total_steps = 1 + *steps * *reps;
  if (Status s = ResolveAuto(config, ctx); !s.ok()) {
    cleanup();
    return cli::Fail(kName, s, 2);
  }
  const bool nvme_used = config.zero.offload_param.device == OffloadDevice::kNvme ||
                         config.zero.offload_optimizer.device == OffloadDevice::kNvme;
  std::vector<std::string> nvme_dirs;
  {
    std::set<std::string> seen;
    if (config.zero.offload_param.device == OffloadDevice::kNvme) {
      for (const auto& p : config.zero.offload_param.nvme_paths) {
        if (seen.insert(p).second) nvme_dirs.push_back(p);
      }
    }
    if (config.zero.offload_optimizer.device == OffloadDevice::kNvme) {
      for (const auto& p : config.zero.offload_optimizer.nvme_paths) {
        if (seen.insert(p).second) nvme_dirs.push_back(p);
      }
    }
  }

  const int64_t n = model->NumParameters();
  const int64_t state_bytes = n * (16 + 2);
  // -1: a third of the training state (zinf demo's budget) plus the
  // activations and scratch (known once a trainer exists), so that small
  // models whose activations outweigh their state still run.
  auto budget = flags->GetInt("device-budget", -1);
  if (!budget.ok() || *budget < -1) {
    cleanup();
    return cli::Fail(kName, budget.ok() ? Status::InvalidArgument("--device-budget must be >= 0") : budget.status(), 2);
  }

  auto result = [&]() -> int {
    // The resident run first, on a device without a budget: it must fit.
    DeviceOptions ropt;
    ropt.choice = *choice;
    auto rdevice = CreateDevice(ropt);
    if (!rdevice.ok()) return cli::Fail(kName, rdevice.status());
    const bool on_gpu = (*rdevice)->kind() == DeviceKind::kCuda;
    Config resident = config;
    resident.zero.offload_param.device = OffloadDevice::kNone;
    resident.zero.offload_optimizer.device = OffloadDevice::kNone;
    model::TrainerOptions topt;
    topt.model = *model;
    topt.engine.run_id = "zinf-bench-step";
    topt.engine.optimizer_threads = static_cast<int>(*threads);
    model::TrainerOptions ropts = topt;
    ropts.engine.device = rdevice->get();
    ropts.engine.run_id = "zinf-bench-step-resident";
    auto res = model::Trainer::Create(resident, ropts);
    if (!res.ok()) {
      return cli::Fail(kName, res.status().WithContext("the resident trainer (every tier on the device: the "
                                                       "compute-only reference needs the model to fit)"));
    }
    // The offloaded run's device, under the budget.
    const int64_t device_budget = *budget >= 0 ? *budget : state_bytes / 3 + (*res)->activation_bytes();
    DeviceOptions dopt;
    dopt.choice = on_gpu ? DeviceOptions::Choice::kCuda : DeviceOptions::Choice::kHost;
    dopt.host_budget_bytes = static_cast<size_t>(device_budget);
    dopt.cuda_budget_bytes = static_cast<size_t>(device_budget);
    auto device = CreateDevice(dopt);
    if (!device.ok()) return cli::Fail(kName, device.status());
    topt.engine.device = device->get();
    std::fprintf(stderr, "bench step: model %s (%s params), device %s, %lld rep(s) of %lld step(s)\n",
                 model_name.c_str(), FormatCount(n).c_str(), (*device)->name().c_str(),
                 static_cast<long long>(*reps), static_cast<long long>(*steps));
    auto off = model::Trainer::Create(config, topt);
    if (!off.ok()) return cli::Fail(kName, off.status().WithContext("the offloaded trainer"));

    // Warm-up: records the prefetch order; the losses must agree bit for bit.
    auto w_off = (*off)->Step();
    if (!w_off.ok()) return cli::Fail(kName, w_off.status());
    if (Status w = (*off)->engine().WaitForUpdate(); !w.ok()) return cli::Fail(kName, w);
    auto w_res = (*res)->Step();
    if (!w_res.ok()) return cli::Fail(kName, w_res.status());
    if (Status w = (*res)->engine().WaitForUpdate(); !w.ok()) return cli::Fail(kName, w);
    if (!std::isfinite(w_off->loss) || !std::isfinite(w_res->loss)) {
      return cli::Fail(kName, Status::Internal("step 1 loss is not finite (offloaded " + std::to_string(w_off->loss) +
                                               ", resident " + std::to_string(w_res->loss) + ")"));
    }
    if (w_off->loss != w_res->loss) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "step 1 loss differs between the offloaded (%.9g) and resident (%.9g) runs",
                    w_off->loss, w_res->loss);
      return cli::Fail(kName, Status::Internal(buf));
    }
    const EngineCounters& wc = w_off->engine;
    const int world = (*off)->engine().world_size();

    // fio's files: laid out once, as large as a step's traffic on each path.
    // Of the optimizer's bytes per parameter: master, m, v 12 read and 12 written.
    const double opt_read_share = 0.5;
    auto nvme_bytes = [](const EngineCounters& c) {
      return c.nvme_read_bytes + c.nvme_write_bytes + c.optimizer_nvme_bytes;
    };
    const double step_read_bytes = static_cast<double>(wc.nvme_read_bytes) +
                                   opt_read_share * static_cast<double>(wc.optimizer_nvme_bytes);
    const int read_percent = nvme_bytes(wc) > 0
                                 ? static_cast<int>(std::lround(100.0 * step_read_bytes / static_cast<double>(nvme_bytes(wc))))
                                 : 50;
    std::vector<FioRun> fio_runs;
    std::string fio_version = "not run";
    aio::IoEngineOptions eo = aio::FromAioConfig(config.aio);
    if (nvme_dirs.size() > 1) eo.thread_count = 1;
    FioRun probe;
    probe.engine = eo;
    std::optional<FioHugePages> fio_pages;  // like the pinned pool's buffers; see aio_perf.h
    if (use_fio && nvme_used) fio_pages.emplace(FioBufferBytes(probe));
    auto remove_fio = [&] {
      for (const FioRun& r : fio_runs) RemoveFile(r.file).IgnoreError();
    };
    if (use_fio && nvme_used) {
      auto version = FioVersion();
      if (!version.ok()) return cli::Fail(kName, version.status().WithContext("(or pass --no-fio)"));
      fio_version = *version;
      const int64_t per_path = AlignUp(
          std::max<int64_t>(64 * kMiB, nvme_bytes(wc) / static_cast<int64_t>(nvme_dirs.size())),
          eo.block_size_bytes * eo.thread_count);
      for (const std::string& dir : nvme_dirs) {
        FioRun run = probe;
        run.huge_pages = fio_pages->active();
        run.file = JoinPath(dir, "bench-step.fio");
        run.size_bytes = per_path;
        run.op = aio::IoOp::kWrite;
        fio_runs.push_back(run);
        auto w = RunFio(run);
        if (!w.ok()) {
          remove_fio();
          return cli::Fail(kName, w.status());
        }
        fio_runs.back().read_percent = read_percent;
      }
    }

    // Transfer sizes as the engine moves them: a block's shard per fetch,
    // a block's gradient shard per ReduceGradients.
    const int64_t h2d_chunk = wc.fetches > 0 ? std::max<int64_t>(1, wc.h2d_bytes / wc.fetches) : kMiB;
    const int64_t reduces = static_cast<int64_t>((*off)->engine().num_blocks()) * config.gradient_accumulation_steps;
    const int64_t d2h_chunk = std::max<int64_t>(1, wc.d2h_bytes / std::max<int64_t>(1, reduces));
    // On the resident run's device: no budget to squeeze the copy rings into.
    auto copier = Copier::Create(rdevice->get(), std::max(h2d_chunk, d2h_chunk));
    if (!copier.ok()) return cli::Fail(kName, copier.status());
    auto adam = AdamAlone::Create(config.optimizer, static_cast<int>(*threads), n,
                                  config.fp16.enabled ? ElementType::kF16 : ElementType::kBf16);
    if (!adam.ok()) return cli::Fail(kName, adam.status());
    if (auto t = (*adam)->TimeUpdate(); !t.ok()) return cli::Fail(kName, t.status());  // pages touched

    struct Rep {
      std::vector<Sample> off, res;
      double step = 0, compute = 0, kernels = 0, adam = 0, cpu = 0, nvme = 0, pcie = 0, comm = 0, bound = 0,
             ratio = 0, ratio_kernels = 0;
      double fio_gbps = 0, nvme_bytes = 0, pcie_bytes = 0;
      std::string bound_by;
    };
    std::vector<Rep> out;
    std::vector<double> pair_ratios;
    bool same_losses = true;
    for (int64_t r = 0; r < *reps; ++r) {
      Rep rep;
      // Each trainer runs its steps back to back (which goes first
      // alternates per repetition, so that other work on the machine slows
      // both alike): a step's optimizer update runs under the next step's
      // forward pass, so interleaving the trainers would let one's update
      // run inside the other's timed step. The last step's update is waited
      // for and counted in that step.
      for (int k = 0; k < 2; ++k) {
        const bool offloaded = (k == 0) == (r % 2 == 0);
        model::Trainer& t = **(offloaded ? off : res);
        std::vector<Sample>& out_steps = offloaded ? rep.off : rep.res;
        for (int64_t i = 0; i < *steps; ++i) {
          auto s = t.Step();
          if (!s.ok()) {
            remove_fio();
            return cli::Fail(kName, s.status());
          }
          out_steps.push_back(FromReport(*s, world));
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (Status w = t.engine().WaitForUpdate(); !w.ok()) {
          remove_fio();
          return cli::Fail(kName, w);
        }
        const double tail = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out_steps.back().seconds += tail;
        out_steps.back().optimizer += tail;
      }
      for (int64_t i = 0; i < *steps; ++i) {
        const double a = rep.off[static_cast<size_t>(i)].loss, b = rep.res[static_cast<size_t>(i)].loss;
        if (!std::isfinite(a) || a != b) same_losses = false;
      }
      std::vector<double> adam_s;
      for (int k = 0; k < 3; ++k) {
        auto t = (*adam)->TimeUpdate();
        if (!t.ok()) {
          remove_fio();
          return cli::Fail(kName, t.status());
        }
        adam_s.push_back(*t);
      }
      const double h2d = MedianOf(rep.off, [](const Sample& s) { return double(s.c.h2d_bytes); });
      const double d2h = MedianOf(rep.off, [](const Sample& s) { return double(s.c.d2h_bytes); });
      auto up = (*copier)->Seconds(static_cast<int64_t>(h2d), h2d_chunk, true);
      auto down = up.ok() ? (*copier)->Seconds(static_cast<int64_t>(d2h), d2h_chunk, false) : up;
      if (!down.ok()) {
        remove_fio();
        return cli::Fail(kName, down.status());
      }
      auto fio_gbps = RunFioSum(fio_runs);
      if (!fio_gbps.ok()) {
        remove_fio();
        return cli::Fail(kName, fio_gbps.status());
      }
      const double gbps = *fio_gbps;
      rep.step = MedianOf(rep.off, [](const Sample& s) { return s.seconds; });
      rep.compute = MedianOf(rep.res, [](const Sample& s) { return s.seconds - s.optimizer; });
      rep.kernels = MedianOf(rep.res, [](const Sample& s) { return s.compute; });
      rep.adam = Median(adam_s);
      rep.cpu = rep.compute + rep.adam;
      rep.nvme_bytes = MedianOf(rep.off, [&](const Sample& s) { return double(nvme_bytes(s.c)); });
      rep.fio_gbps = gbps;
      rep.nvme = gbps > 0 ? rep.nvme_bytes / (gbps * 1e9) : 0.0;
      rep.pcie_bytes = h2d + d2h;
      rep.pcie = *up + *down;
      rep.comm = MedianOf(rep.off, [](const Sample& s) { return s.comm; });
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
      {
        // The same with the compute part cut to the model's kernel time.
        const double k = on_gpu ? std::max(rep.kernels, rep.adam) : rep.kernels + rep.adam;
        const double b = std::max({k, rep.nvme, rep.pcie, rep.comm});
        rep.ratio_kernels = b > 0 ? rep.step / b : 0.0;
      }
      // The i-th offloaded step against the i-th resident step's parts.
      for (size_t i = 0; i < rep.off.size(); ++i) {
        const Sample& o = rep.off[i];
        const double compute_i = rep.res[i].seconds - rep.res[i].optimizer;
        const double cpu_i = on_gpu ? std::max(compute_i, rep.adam) : compute_i + rep.adam;
        const double nvme_i = gbps > 0 ? static_cast<double>(nvme_bytes(o.c)) / (gbps * 1e9) : 0.0;
        const double b = std::max({cpu_i, nvme_i, rep.pcie, o.comm});
        if (b > 0) pair_ratios.push_back(o.seconds / b);
      }
      std::fprintf(stderr,
                   "  rep %lld: step %.3f s (compute %.3f, optimizer %.3f) | parts: compute %.3f + adam %.4f, "
                   "nvme %.4f (%.0f MB at %.2f GB/s), pcie %.4f, comm %.4f -> bound %.3f (%s), ratio %.3f\n",
                   static_cast<long long>(r + 1), rep.step,
                   MedianOf(rep.off, [](const Sample& s) { return s.compute; }),
                   MedianOf(rep.off, [](const Sample& s) { return s.optimizer; }), rep.compute, rep.adam, rep.nvme,
                   rep.nvme_bytes / 1e6, gbps, rep.pcie, rep.comm, rep.bound, rep.bound_by.c_str(), rep.ratio);
      out.push_back(std::move(rep));
    }
    remove_fio();
    if (!same_losses) {
      std::fprintf(stderr, "bench step: warning: a timed step's loss differs between the offloaded and resident "
                           "runs (step 1 agreed)\n");
    }

    // Medians over repetitions.
    auto med = [&](auto f) {
      std::vector<double> v;
      for (const Rep& r : out) v.push_back(f(r));
      return Median(v);
    };
    std::vector<Sample> all_off, all_res;
    for (const Rep& r : out) {
      all_off.insert(all_off.end(), r.off.begin(), r.off.end());
      all_res.insert(all_res.end(), r.res.begin(), r.res.end());
    }
    const double step_s = med([](const Rep& r) { return r.step; });
    const double bound_s = med([](const Rep& r) { return r.bound; });
    std::vector<double> ratios;
    for (const Rep& r : out) ratios.push_back(r.ratio);
    const double off_compute = MedianOf(all_off, [](const Sample& s) { return s.compute; });
    const double off_optimizer = MedianOf(all_off, [](const Sample& s) { return s.optimizer; });

    nlohmann::ordered_json j;
    j["bench"] = "step";
    j["model"] = model_name;
    j["params"] = n;
    j["config"] = config_path ? *config_path : "zinf demo's built-in config";
    j["offload_param"] = config.zero.offload_param.device == OffloadDevice::kNvme  ? "nvme"
                         : config.zero.offload_param.device == OffloadDevice::kCpu ? "cpu"
                                                                                   : "none";
    j["offload_optimizer"] = config.zero.offload_optimizer.device == OffloadDevice::kNvme  ? "nvme"
                             : config.zero.offload_optimizer.device == OffloadDevice::kCpu ? "cpu"
                                                                                           : "none";
    j["device"] = (*device)->name();
    j["device_budget_bytes"] = device_budget;
    j["nvme_paths"] = nvme_dirs;
    j["micro_batch"] = config.train_micro_batch_size_per_gpu;
    j["gradient_accumulation_steps"] = config.gradient_accumulation_steps;
    j["tokens_per_step"] = (*off)->tokens_per_step();
    j["optimizer_threads"] = (*adam)->threads();
    // OpenMP's wait policy decides how the model's kernel threads share a
    // few cores with the engine's threads and other work: spinning (the
    // default) on a busy 2-core host made steps several times slower.
    const char* omp_wait = std::getenv("OMP_WAIT_POLICY");
    j["omp_wait_policy"] = omp_wait ? omp_wait : "unset (OpenMP default: spin, then sleep)";
    j["steps_per_rep"] = *steps;
    j["reps"] = *reps;
    j["check"] = "step 1 (warm-up) losses finite and bit-identical between the offloaded and resident runs";
    j["losses_identical_all_steps"] = same_losses;
    j["step1_loss"] = w_off->loss;
    j["ratio_to_bound"] = Median(ratios);
    j["ratio_to_bound_runs"] = ratios;
    j["ratio_to_bound_pairwise_median"] = Median(pair_ratios);
    j["ratio_to_bound_kernel_time_only"] = med([](const Rep& r) { return r.ratio_kernels; });
    j["step_s"] = step_s;
    j["bound_s"] = bound_s;
    j["bound_by"] = out[out.size() / 2].bound_by;
    nlohmann::ordered_json parts;
    parts["compute_s"] = med([](const Rep& r) { return r.compute; });
    parts["compute_kernels_s"] = med([](const Rep& r) { return r.kernels; });
    parts["adam_s"] = med([](const Rep& r) { return r.adam; });
    if (!on_gpu) parts["cpu_s"] = med([](const Rep& r) { return r.cpu; });
    parts["nvme_s"] = med([](const Rep& r) { return r.nvme; });
    parts["pcie_s"] = med([](const Rep& r) { return r.pcie; });
    parts["comm_s"] = med([](const Rep& r) { return r.comm; });
    j["parts"] = parts;
    nlohmann::ordered_json br;
    br["step_s"] = step_s;
    br["compute_s"] = off_compute;
    br["nvme_wait_s"] = MedianOf(all_off, [](const Sample& s) { return s.nvme_wait; });
    br["pcie_wait_s"] = MedianOf(all_off, [](const Sample& s) { return s.fetch_wait; });
    br["comm_s"] = MedianOf(all_off, [](const Sample& s) { return s.comm; });
    br["optimizer_s"] = off_optimizer;
    br["waiting_s"] = MedianOf(all_off, [](const Sample& s) { return s.seconds - s.compute - s.optimizer; });
    j["breakdown"] = br;
    nlohmann::ordered_json rs;
    rs["step_s"] = MedianOf(all_res, [](const Sample& s) { return s.seconds; });
    rs["compute_s"] = MedianOf(all_res, [](const Sample& s) { return s.compute; });
    rs["optimizer_s"] = MedianOf(all_res, [](const Sample& s) { return s.optimizer; });
    j["resident"] = rs;
    nlohmann::ordered_json moved;
    moved["nvme_param_read_bytes"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.nvme_read_bytes); });
    moved["nvme_param_write_bytes"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.nvme_write_bytes); });
    moved["nvme_optimizer_bytes"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.optimizer_nvme_bytes); });
    moved["h2d_bytes"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.h2d_bytes); });
    moved["d2h_bytes"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.d2h_bytes); });
    moved["fetches"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.fetches); });
    moved["prefetch_hits"] = MedianOf(all_off, [](const Sample& s) { return double(s.c.prefetch_hits); });
    j["per_step"] = moved;
    j["fio"] = fio_version;
    j["fio_buffers"] = fio_pages ? fio_pages->description() : "";
    j["fio_mixed_read_percent"] = read_percent;
    j["fio_mixed_gbps"] = med([](const Rep& r) { return r.fio_gbps; });
    j["copy"] = on_gpu ? std::string("cudaMemcpyAsync via Device/Stream, host memory ") +
                             ((*copier)->pinned() ? "page-locked" : "pageable (could not pin)")
                       : "memcpy (host device)";
    j["copy_gbps"] = med([](const Rep& r) { return r.pcie > 0 ? r.pcie_bytes / r.pcie / 1e9 : 0.0; });
    nlohmann::ordered_json runs = nlohmann::ordered_json::array();
    for (const Rep& r : out) {
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
      x["step_s_each"] = [&] {
        std::vector<double> v;
        for (const Sample& s : r.off) v.push_back(s.seconds);
        return v;
      }();
      runs.push_back(x);
    }
    j["runs"] = runs;
    j["plan"] = PlanPrediction(*model, config, world, on_gpu, (*off)->tokens_per_step() / world, n,
                               parts["compute_s"].get<double>(), parts["adam_s"].get<double>(),
                               j["fio_mixed_gbps"].get<double>(), j["copy_gbps"].get<double>(), step_s);
    j["compared"] = "ratio_to_bound = median over reps of (median offloaded step) / max(parts); parts measured in "
                    "the same rep: cpu = resident-run step minus its optimizer + in-RAM Adam (host device; separate parts on a "
                    "GPU), "
                    "nvme = step NVMe bytes / fio mixed GB/s on the same path, pcie = the step's h2d + d2h bytes "
                    "copied in the engine's sizes, comm = all-gather + reduce-scatter time";

    // The page.
    HtmlReport report("zinf bench step: " + model_name + ", " + j["offload_param"].get<std::string>() + "/" +
                      j["offload_optimizer"].get<std::string>() + " offload");
    report.AddParagraph("Whole training steps of the reference GPT through the ZeRO-3 engine, against the time each "
                        "resource needs for the step's work when measured alone in the same run. " +
                        j["compared"].get<std::string>() + ".");
    auto f = [](double v) { return FormatFigure(v); };
    report.AddTable("Key figures", {"figure", "value"},
                    {{"ratio_to_bound (median of reps)", f(Median(ratios))},
                     {"ratio_to_bound per rep", [&] {
                        std::string r;
                        for (double x : ratios) r += (r.empty() ? "" : ", ") + f(x);
                        return r;
                      }()},
                     {"ratio_to_bound (pairwise median)", f(Median(pair_ratios))},
                     {"step_s (offloaded, median)", f(step_s)},
                     {"bound_s", f(bound_s) + " (" + j["bound_by"].get<std::string>() + ")"},
                     {"compute_s (resident step - its optimizer)", f(parts["compute_s"].get<double>())},
                     {"compute_kernels_s (resident kernels only)", f(parts["compute_kernels_s"].get<double>())},
                     {"ratio with kernel time only", f(j["ratio_to_bound_kernel_time_only"].get<double>())},
                     {"adam_s (in RAM)", f(parts["adam_s"].get<double>())},
                     {"nvme_s", f(parts["nvme_s"].get<double>())},
                     {"pcie_s", f(parts["pcie_s"].get<double>())},
                     {"comm_s", f(parts["comm_s"].get<double>())},
                     {"waiting_s (step - compute - optimizer)", f(br["waiting_s"].get<double>())},
                     {"fio mixed GB/s", f(j["fio_mixed_gbps"].get<double>())},
                     {"zinf plan's step_s with these rates",
                      j["plan"].is_object() && j["plan"].contains("step_s") ? f(j["plan"]["step_s"].get<double>())
                                                                            : "not available"},
                     {"device", (*device)->name()},
                     {"params", FormatCount(n)}});
    {
      BarChart c;
      c.title = "Per repetition: offloaded step vs. the parts of the bound (s)";
      c.x_label = "repetition";
      c.y_label = "seconds";
      ChartSeries step{"step", {}}, cpu{on_gpu ? "compute" : "cpu (compute + adam)", {}}, nv{"nvme", {}},
          pc{"pcie", {}}, cm{"comm", {}}, ad{"adam", {}};
      for (size_t i = 0; i < out.size(); ++i) {
        c.categories.push_back("rep " + std::to_string(i + 1) + " (ratio " + FormatFigure(out[i].ratio) + ")");
        step.values.push_back(out[i].step);
        cpu.values.push_back(on_gpu ? out[i].compute : out[i].cpu);
        ad.values.push_back(out[i].adam);
        nv.values.push_back(out[i].nvme);
        pc.values.push_back(out[i].pcie);
        cm.values.push_back(out[i].comm);
      }
      c.series = {step, cpu};
      if (on_gpu) c.series.push_back(ad);
      c.series.insert(c.series.end(), {nv, pc, cm});
      report.AddBarChart(c);
    }
    {
      Timeline t;
      t.title = "Offloaded steps: where the time went";
      t.unit = "s";
      t.segment_names = {"compute", "nvme wait", "pcie wait", "comm", "optimizer", "other"};
      int k = 0;
      for (size_t r = 0; r < out.size(); ++r) {
        for (const Sample& s : out[r].off) {
          const double rest = s.seconds - s.compute - s.nvme_wait - s.fetch_wait - s.comm - s.optimizer;
          t.rows.push_back({"rep " + std::to_string(r + 1) + " step " + std::to_string(++k),
                            {s.compute, s.nvme_wait, s.fetch_wait, s.comm, s.optimizer, rest}});
        }
        k = 0;
      }
      t.markers = {{"bound", bound_s}};
      report.AddTimeline(t);
    }
    if (Status s = EmitResult(j.dump(2), json_path, html_path, report); !s.ok()) return cli::Fail(kName, s);
    return 0;
  }();
  cleanup();
  return result;
}

ZINF_COMMAND({kName, "time whole training steps of the reference GPT against the resources they need",
              "bench step [--config C (zinf demo's)] [--model M (demo)] [--steps N (5)] [--reps R (3)]\n"
              "           [--nvme-path P] [--device-budget SIZE] [--device auto|cuda|host]\n"
              "           [--threads T] [--no-fio] [--html OUT.html] [--json OUT.json]\n"
              "  Trains the reference GPT with C's tiers (scratch files in a directory made inside P or\n"
              "  C's nvme paths, removed after), and next to it a run with every tier resident. After a\n"
              "  warm-up step whose losses must agree, each of R repetitions times N offloaded steps and N\n"
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
