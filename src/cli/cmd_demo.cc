// zinf demo: the built-in default job, what `make demo` runs.
//
// Until the GPT trainer exists (issue 7) the most complete path is this: a
// small two-layer MLP (tanh) learns a fixed random "teacher" MLP of the same
// shape. Its 16-bit working parameters live in RAM; its optimizer state
// (fp32 master weights, Adam m and v, fp32 gradients) lives on NVMe under a
// temporary directory and is streamed through pinned buffers in sub-groups,
// read ahead and written behind, by the same OptimizerSwapper the engine
// uses. Gradients are clipped by their global norm; AdamW runs on the CPU
// (AVX-512/AVX2). At the end the state is checkpointed crash-safely, loaded
// back and compared bit for bit. The job fails unless the loss falls clearly.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include "aio/io_engine.h"
#include "aio/nvme_check.h"
#include "aio/pinned_pool.h"
#include "cli/command.h"
#include "core/units.h"
#include "optim/array_ops.h"
#include "optim/cpu_adam.h"
#include "optim/dtype.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "swap/checkpoint.h"
#include "core/fs.h"
#include "swap/optimizer_swapper.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

constexpr char kName[] = "demo";

// The built-in default config; "@NVME@" becomes the demo's nvme directory.
constexpr char kDefaultConfig[] = R"({
  "train_micro_batch_size_per_gpu": 64,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 0.0}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3,
                                               "warmup_num_steps": 10, "warmup_type": "linear"}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 131072,
    "offload_param": {"device": "cpu", "pin_memory": true},
    "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@", "pin_memory": true,
                          "buffer_count": 12, "pipeline_read": true, "pipeline_write": true}
  },
  "aio": {"block_size": 1048576, "queue_depth": 32, "thread_count": 1, "overlap_events": true}
})";

// A two-layer tanh MLP, in -> hidden -> out, weights flattened as [W1 | W2]
// (row-major, W1 is hidden x in, W2 is out x hidden).
struct Mlp {
  int in = 256, hidden = 1024, out = 256;
  int64_t params() const { return int64_t{in} * hidden + int64_t{hidden} * out; }

  // h = tanh(W1 x), y = W2 h for `batch` inputs (rows of x).
  void Forward(const float* w, const std::vector<float>& x, int batch, std::vector<float>& h,
               std::vector<float>& y) const {
    const float* w1 = w;
    const float* w2 = w + int64_t{in} * hidden;
    h.assign(size_t(batch) * hidden, 0.0f);
    y.assign(size_t(batch) * out, 0.0f);
    for (int b = 0; b < batch; ++b) {
      for (int j = 0; j < hidden; ++j) {
        float z = 0;
        for (int i = 0; i < in; ++i) z += w1[int64_t{j} * in + i] * x[size_t(b) * in + i];
        h[size_t(b) * hidden + j] = std::tanh(z);
      }
      for (int k = 0; k < out; ++k) {
        float acc = 0;
        for (int j = 0; j < hidden; ++j) acc += w2[int64_t{k} * hidden + j] * h[size_t(b) * hidden + j];
        y[size_t(b) * out + k] = acc;
      }
    }
  }

  // Mean over batch and outputs of (y - t)^2 / 2; fills `grad` when not null.
  double LossAndGrad(const float* w, const std::vector<float>& x, const std::vector<float>& t, int batch,
                     float* grad) const {
    const float* w2 = w + int64_t{in} * hidden;
    std::vector<float> h, y, dy(size_t(batch) * out);
    Forward(w, x, batch, h, y);
    double loss = 0;
    const float inv = 1.0f / float(batch * out);
    for (int b = 0; b < batch; ++b) {
      for (int k = 0; k < out; ++k) {
        float d = y[size_t(b) * out + k] - t[size_t(b) * out + k];
        loss += 0.5 * double(d) * d;
        dy[size_t(b) * out + k] = d * inv;
      }
    }
    loss *= inv;
    if (grad == nullptr) return loss;
    float* g1 = grad;
    float* g2 = grad + int64_t{in} * hidden;
    std::fill(grad, grad + params(), 0.0f);
    std::vector<float> dz(size_t(batch) * hidden, 0.0f);
    for (int b = 0; b < batch; ++b) {
      for (int k = 0; k < out; ++k) {
        const float d = dy[size_t(b) * out + k];
        float* g2row = g2 + int64_t{k} * hidden;
        const float* w2row = w2 + int64_t{k} * hidden;
        float* dzrow = &dz[size_t(b) * hidden];
        const float* hrow = &h[size_t(b) * hidden];
        for (int j = 0; j < hidden; ++j) {
          g2row[j] += d * hrow[j];
          dzrow[j] += d * w2row[j];
        }
      }
      for (int j = 0; j < hidden; ++j) {
        const float hv = h[size_t(b) * hidden + j];
        dz[size_t(b) * hidden + j] *= 1.0f - hv * hv;
      }
    }
    for (int j = 0; j < hidden; ++j) {
      float* g1row = g1 + int64_t{j} * in;
      for (int b = 0; b < batch; ++b) {
        const float d = dz[size_t(b) * hidden + j];
        const float* xrow = &x[size_t(b) * in];
        for (int i = 0; i < in; ++i) g1row[i] += d * xrow[i];
      }
    }
    return loss;
  }
};

std::vector<float> Gaussian(int64_t n, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, {"dir", "steps", "threads"}, {"keep"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  auto steps_flag = flags->GetInt("steps", 60);
  auto threads = flags->GetInt("threads", 0);
  if (!steps_flag.ok()) return Fail(kName, steps_flag.status(), 2);
  if (!threads.ok()) return Fail(kName, threads.status(), 2);
  const int64_t steps = *steps_flag;
  if (steps < 1) return Fail(kName, Status::InvalidArgument("--steps must be positive"), 2);

  std::string dir = flags->GetOr("dir", "");
  if (dir.empty()) {
    char tmpl[] = "/tmp/zinf-demo.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail(kName, ErrnoStatus(errno, "mkdtemp", tmpl));
    dir = tmpl;
  } else if (Status st = MakeDirectories(dir); !st.ok()) {
    return Fail(kName, st);
  }
  const bool keep = flags->Has("keep");
  const std::string nvme_dir = dir + "/nvme";
  if (Status st = MakeDirectories(nvme_dir); !st.ok()) return Fail(kName, st);

  auto result = [&]() -> int {
    // 1. The built-in config, resolved like any user's.
    std::string text = kDefaultConfig;
    text.replace(text.find("@NVME@"), 6, nvme_dir);
    auto parsed = ParseConfig(text, "built-in demo config");
    if (!parsed.ok()) return Fail(kName, parsed.status());
    Config config = *parsed;
    AutoContext ctx;
    ctx.total_steps = steps;
    if (Status st = ResolveAuto(config, ctx); !st.ok()) return Fail(kName, st);

    Mlp model;
    const int64_t n = model.params();
    const int batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
    std::printf("zinf demo: a %d-%d-%d tanh MLP (%s params) learns a random teacher; optimizer state on NVMe\n",
                model.in, model.hidden, model.out, FormatCount(n).c_str());
    std::printf("  state:  %s fp32 master + Adam m, v + fp32 grads in %s (sub-groups of %s, read ahead, written behind)\n",
                FormatBytes(16 * n).c_str(), nvme_dir.c_str(), FormatCount(config.zero.sub_group_size).c_str());

    // 2. The NVMe path, checked before use.
    aio::NvmeCheckOptions check;
    check.required_bytes = 16 * n;
    check.test_bytes = 16 * kMiB;
    aio::NvmeCheckReport report = aio::CheckNvmePath(nvme_dir, check);
    std::printf("  nvme:   %s: %s, O_DIRECT %s, align %lld B, free %s, write %.2f GB/s, read %.2f GB/s\n",
                nvme_dir.c_str(), report.filesystem.c_str(), report.direct_io ? "yes" : "no",
                static_cast<long long>(report.alignment_bytes), FormatBytes(report.free_bytes).c_str(),
                report.write_gbps, report.read_gbps);
    if (!report.ok()) {
      return Fail(kName, Status::FailedPrecondition("nvme path " + nvme_dir + ": " + report.problems.front()));
    }

    // 3. The data plane: io_uring engine, CPU Adam, the sub-group pipeline.
    auto engine = aio::CreateIoEngine(aio::FromAioConfig(config.aio));
    if (!engine.ok()) return Fail(kName, engine.status());
    optim::ThreadPool::Options tpo;
    tpo.num_threads = static_cast<int>(*threads);
    auto threads_pool = optim::ThreadPool::Create(tpo);
    if (!threads_pool.ok()) return Fail(kName, threads_pool.status());
    auto isa = optim::DefaultIsa();
    if (!isa.ok()) return Fail(kName, isa.status());
    auto adam = optim::CpuAdam::Create(config.optimizer, threads_pool->get(), *isa);
    if (!adam.ok()) return Fail(kName, adam.status());
    auto schedule = optim::LrSchedule::Create(config.scheduler, config.optimizer.lr);
    if (!schedule.ok()) return Fail(kName, schedule.status());

    swap::OptimizerSwapperOptions so = swap::OptimizerSwapperOptionsFromConfig(config.zero, n);
    so.store.file_prefix = "zinf-demo";
    aio::PinnedPoolOptions po;
    po.buffer_count = std::max<int64_t>(swap::OptimizerSwapper::RequiredBuffers(so),
                                        config.zero.offload_optimizer.buffer_count);
    po.buffer_bytes = swap::OptimizerSwapper::RequiredBufferBytes(so, so.store.alignment_bytes);
    po.name = "demo optimizer pipeline";
    auto buffers = aio::PinnedPool::Create(po);
    if (!buffers.ok()) return Fail(kName, buffers.status());
    auto swapper = swap::OptimizerSwapper::Create(so, engine->get(), buffers->get());
    if (!swapper.ok()) return Fail(kName, swapper.status());
    std::printf("  engine: %s, Adam %s on %d thread(s), %lld sub-groups, %lld pinned buffers of %s\n",
                std::string((*engine)->name()).c_str(), std::string(optim::IsaName(*isa)).c_str(),
                (*threads_pool)->num_threads(), static_cast<long long>((*swapper)->num_sub_groups()),
                static_cast<long long>(po.buffer_count), FormatBytes(po.buffer_bytes).c_str());

    // 4. Train.
    std::mt19937_64 rng(20261122);
    std::vector<float> teacher = Gaussian(int64_t{model.in} * model.hidden, 1.0f / std::sqrt(float(model.in)), rng);
    {
      std::vector<float> w2 = Gaussian(int64_t{model.hidden} * model.out, 1.0f / std::sqrt(float(model.hidden)), rng);
      teacher.insert(teacher.end(), w2.begin(), w2.end());
    }
    std::vector<float> master = Gaussian(n, 0.02f, rng);
    if (Status st = (*swapper)->Initialize(master.data()); !st.ok()) return Fail(kName, st);
    std::vector<uint16_t> params16(static_cast<size_t>(n));
    if (Status st = optim::CastFromF32(**threads_pool, *isa, master.data(), optim::DType::kBf16, params16.data(), n);
        !st.ok()) {
      return Fail(kName, st);
    }
    std::vector<float> work(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
    // A batch of inputs and the teacher's outputs for them.
    auto batch_of = [&](std::mt19937_64& r, std::vector<float>& x, std::vector<float>& t) {
      x = Gaussian(int64_t{batch} * model.in, 1.0f, r);
      std::vector<float> h;
      model.Forward(teacher.data(), x, batch, h, t);
    };
    std::mt19937_64 eval_rng(7);
    std::vector<float> eval_x, eval_t;
    batch_of(eval_rng, eval_x, eval_t);
    auto eval_loss = [&]() {
      Status st = optim::CastToF32(**threads_pool, *isa, params16.data(), optim::DType::kBf16, work.data(), n);
      return st.ok() ? model.LossAndGrad(work.data(), eval_x, eval_t, batch, nullptr) : NAN;
    };
    const double first_loss = eval_loss();
    std::printf("  step %4d  eval loss %.5f\n", 0, first_loss);

    double compute_s = 0, optimizer_s = 0;
    const auto t_train = std::chrono::steady_clock::now();
    std::vector<float> x, t;
    for (int64_t step = 1; step <= steps; ++step) {
      batch_of(rng, x, t);
      auto t0 = std::chrono::steady_clock::now();
      Status st = optim::CastToF32(**threads_pool, *isa, params16.data(), optim::DType::kBf16, work.data(), n);
      if (!st.ok()) return Fail(kName, st);
      const double loss = model.LossAndGrad(work.data(), x, t, batch, grads.data());
      compute_s += Since(t0);

      t0 = std::chrono::steady_clock::now();
      auto sum_squares = optim::SumSquares(**threads_pool, *isa, grads.data(), optim::DType::kF32, n);
      if (!sum_squares.ok()) return Fail(kName, sum_squares.status());
      optim::GradNormAccumulator norm;
      norm.Add(*sum_squares);
      if (norm.has_inf_or_nan()) return Fail(kName, Status::Internal("gradient overflow at step " + std::to_string(step)));
      optim::AdamStepArgs step_args;
      step_args.step = step;
      step_args.lr = (*schedule).LrAt(step - 1);
      step_args.grad_scale = optim::GradScaleFactor(norm.norm(), 1.0, config.gradient_clipping);
      st = (*swapper)->SetGradients(grads.data());
      if (st.ok()) st = (*swapper)->Step(*adam, step_args, params16.data(), optim::DType::kBf16);
      if (!st.ok()) return Fail(kName, st.WithContext("step " + std::to_string(step)));
      optimizer_s += Since(t0);
      if (step % config.steps_per_print == 0 || step == steps) {
        std::printf("  step %4lld  train loss %.5f  eval loss %.5f  lr %.2e  grad norm %.3f\n",
                    static_cast<long long>(step), loss, eval_loss(), step_args.lr, norm.norm());
        std::fflush(stdout);
      }
    }
    const double train_s = Since(t_train);
    const double last_loss = eval_loss();

    // 5. Checkpoint the NVMe state crash-safely, load it back, compare.
    swap::SwapStore* store = (*swapper)->store();
    std::vector<swap::BlobRef> blobs;
    for (int id = 0; id < store->tensor_count(); ++id) {
      if (store->tensor(id).name.find(".grad.") != std::string::npos) continue;  // not state
      blobs.push_back(swap::BlobRef::Swap(store->tensor(id).name, store, id));
    }
    const std::string ckpt = dir + "/checkpoints/step-" + std::to_string(steps);
    if (Status st = MakeDirectories(dir + "/checkpoints"); !st.ok()) return Fail(kName, st);
    aio::PinnedPoolOptions cpo;
    cpo.buffer_count = 2;
    cpo.buffer_bytes = 4 * kMiB;
    cpo.name = "demo checkpoint";
    auto ckpt_pool = aio::PinnedPool::Create(cpo);
    if (!ckpt_pool.ok()) return Fail(kName, ckpt_pool.status());
    auto t0 = std::chrono::steady_clock::now();
    Status st = swap::SaveCheckpoint(**engine, **ckpt_pool, ckpt, {{"step", std::to_string(steps)}}, blobs);
    if (!st.ok()) return Fail(kName, st);
    const double save_s = Since(t0);
    std::vector<float> saved_master(static_cast<size_t>(n)), loaded(static_cast<size_t>(n));
    if (st = (*swapper)->ReadState(saved_master.data(), nullptr, nullptr, nullptr); !st.ok()) return Fail(kName, st);
    std::vector<swap::BlobRef> targets;
    for (int64_t k = 0; k < (*swapper)->num_sub_groups(); ++k) {
      auto* dst = reinterpret_cast<std::byte*>(loaded.data() + (*swapper)->sub_group_begin(k));
      targets.push_back(swap::BlobRef::Ram(so.prefix + ".master." + std::to_string(k),
                                           std::span<std::byte>(dst, size_t((*swapper)->sub_group_elems(k)) * 4)));
    }
    auto latest = swap::ResolveLatest(**engine, **ckpt_pool, dir + "/checkpoints");
    if (!latest.ok()) return Fail(kName, latest.status());
    auto meta = swap::LoadCheckpoint(**engine, **ckpt_pool, *latest, targets);
    if (!meta.ok()) return Fail(kName, meta.status());
    const bool same = std::memcmp(saved_master.data(), loaded.data(), size_t(n) * 4) == 0;

    const double tokens = double(batch) * double(steps);
    const double nvme_bytes = double(steps) * double(n) * (4 + 16 + 12);  // grads in, state read, state written
    std::printf("zinf demo: eval loss %.5f -> %.5f (%.1fx lower) in %lld steps, %.1f s\n", first_loss, last_loss,
                first_loss / last_loss, static_cast<long long>(steps), train_s);
    std::printf("  throughput: %.1f samples/s, %.2f steps/s; model compute %.1f s, optimizer + NVMe %.1f s "
                "(%s moved, %.2f GB/s)\n",
                tokens / train_s, double(steps) / train_s, compute_s, optimizer_s,
                FormatBytes(static_cast<int64_t>(nvme_bytes)).c_str(), nvme_bytes / optimizer_s / 1e9);
    std::printf("  checkpoint: %s saved in %.2f s, loaded back %s\n", latest->c_str(), save_s,
                same ? "bit-identical" : "DIFFERENT");
    if (!same) return Fail(kName, Status::Corruption("the reloaded checkpoint differs from the saved state"));
    if (!(last_loss < 0.5 * first_loss)) {
      return Fail(kName, Status::Internal("the loss did not fall clearly: " + std::to_string(first_loss) + " -> " +
                                          std::to_string(last_loss)));
    }
    std::printf("zinf demo: OK\n");
    return 0;
  }();

  if (keep) {
    std::printf("  kept: %s\n", dir.c_str());
  } else if (Status st = RemoveTree(dir); !st.ok()) {
    std::fprintf(stderr, "zinf demo: could not remove %s: %s\n", dir.c_str(), st.ToString().c_str());
  }
  return result;
}

ZINF_COMMAND({"demo", "the built-in default job: a small model trained with its optimizer state on NVMe",
              "demo [--dir DIR] [--steps N] [--threads T] [--keep]\n"
              "  Trains a small MLP for N steps (default 60) with its optimizer state on NVMe under DIR\n"
              "  (default: a new /tmp/zinf-demo.* directory, removed at the end unless --keep).",
              Run});

}  // namespace
}  // namespace zinf::cli
