// zinf demo: the built-in default job, what `make demo` runs.
//
// Until the GPT trainer exists (issue 7) the most complete path is this: a
// two-layer MLP (tanh) learns a fixed random "teacher" MLP of the same shape,
// trained through the ZeRO-3 Engine exactly as a model would be: each layer
// is a block whose 16-bit parameters live on NVMe and are fetched to the
// device (the GPU, or the host standing in for one under a memory budget
// smaller than the model's training state) when acquired, prefetched once
// the order is known; gradients go back through ReduceGradients; Step runs
// AdamW on the CPU over the optimizer state (fp32 master weights, m, v,
// gradient), which also lives on NVMe, in sub-groups read ahead and written
// behind. At the end the master weights are checkpointed crash-safely,
// loaded back and compared bit for bit. The job fails unless the loss falls
// clearly.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/nvme_check.h"
#include "aio/pinned_pool.h"
#include "cli/command.h"
#include "core/fs.h"
#include "core/units.h"
#include "device/device.h"
#include "optim/dtype.h"
#include "swap/checkpoint.h"
#include "zinf/config.h"
#include "zinf/engine.h"

namespace zinf::cli {
namespace {

constexpr char kName[] = "demo";

// The built-in default config; "@NVME@" becomes the demo's nvme directory.
// max_in_cpu 0: released parameter shards are not cached in RAM, so every
// fetch that prefetching does not hide really reads NVMe.
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
    "sub_group_size": 262144,
    "stage3_prefetch_bucket_size": 524288,
    "stage3_max_live_parameters": 1048576,
    "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "@NVME@", "pin_memory": true,
                      "buffer_count": 4, "buffer_size": 524288, "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@", "pin_memory": true,
                          "buffer_count": 12, "pipeline_read": true, "pipeline_write": true}
  },
  "aio": {"block_size": 1048576, "queue_depth": 32, "thread_count": 1, "overlap_events": true}
})";

// The device budget: the model's training state is several times this.
constexpr int64_t kDeviceBudgetBytes = 6 * kMiB;

// A two-layer tanh MLP, in -> hidden -> out: y = W2 tanh(W1 x), W1 is
// hidden x in and W2 out x hidden (row-major), computed on the host in fp32.
struct Mlp {
  int in = 256, hidden = 2048, out = 256;
  int64_t w1_numel() const { return int64_t{in} * hidden; }
  int64_t w2_numel() const { return int64_t{hidden} * out; }

  void Forward(const float* w1, const float* w2, const std::vector<float>& x, int batch, std::vector<float>& h,
               std::vector<float>& y) const {
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

  // Mean over batch and outputs of (y - t)^2 / 2, and dLoss/dy.
  double Loss(const std::vector<float>& y, const std::vector<float>& t, std::vector<float>* dy) const {
    double loss = 0;
    const float inv = 1.0f / float(y.size());
    if (dy) dy->resize(y.size());
    for (size_t i = 0; i < y.size(); ++i) {
      const float d = y[i] - t[i];
      loss += 0.5 * double(d) * d;
      if (dy) (*dy)[i] = d * inv;
    }
    return loss * inv;
  }

  // dW2 = dy h^T, and dz = (W2^T dy) * (1 - h^2), the gradient at layer 1's output.
  void BackwardLayer2(const float* w2, const std::vector<float>& h, const std::vector<float>& dy, int batch,
                      float* g2, std::vector<float>& dz) const {
    std::fill(g2, g2 + w2_numel(), 0.0f);
    dz.assign(size_t(batch) * hidden, 0.0f);
    for (int b = 0; b < batch; ++b) {
      const float* hrow = &h[size_t(b) * hidden];
      float* dzrow = &dz[size_t(b) * hidden];
      for (int k = 0; k < out; ++k) {
        const float d = dy[size_t(b) * out + k];
        float* g2row = g2 + int64_t{k} * hidden;
        const float* w2row = w2 + int64_t{k} * hidden;
        for (int j = 0; j < hidden; ++j) {
          g2row[j] += d * hrow[j];
          dzrow[j] += d * w2row[j];
        }
      }
      for (int j = 0; j < hidden; ++j) dzrow[j] *= 1.0f - hrow[j] * hrow[j];
    }
  }

  // dW1 = dz x^T.
  void BackwardLayer1(const std::vector<float>& x, const std::vector<float>& dz, int batch, float* g1) const {
    std::fill(g1, g1 + w1_numel(), 0.0f);
    for (int j = 0; j < hidden; ++j) {
      float* g1row = g1 + int64_t{j} * in;
      for (int b = 0; b < batch; ++b) {
        const float d = dz[size_t(b) * hidden + j];
        const float* xrow = &x[size_t(b) * in];
        for (int i = 0; i < in; ++i) g1row[i] += d * xrow[i];
      }
    }
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

// Moves one layer's weights and gradients between the device and the host's
// fp32 compute, as bf16 (the engine's working type with bf16 enabled).
class DeviceIo {
 public:
  explicit DeviceIo(Stream& stream) : stream_(stream) {}

  // The acquired device tensor `src` (n elements) as fp32 on the host.
  Status Download(const void* src, int64_t n, std::vector<float>& out) {
    raw_.resize(size_t(n) * 2);
    ZINF_RETURN_IF_ERROR(stream_.CopyAsync(raw_.data(), src, raw_.size(), CopyDirection::kDeviceToHost));
    ZINF_RETURN_IF_ERROR(stream_.Synchronize());
    out.resize(size_t(n));
    const auto* h = reinterpret_cast<const uint16_t*>(raw_.data());
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = optim::Bf16ToFloat(h[i]);
    return Status::Ok();
  }

  // Host fp32 gradients to the device buffer `dst`, rounded to the engine's type.
  Status Upload(const float* src, int64_t n, void* dst) {
    raw_.resize(size_t(n) * 2);
    auto* h = reinterpret_cast<uint16_t*>(raw_.data());
    for (int64_t i = 0; i < n; ++i) h[i] = optim::FloatToBf16(src[i]);
    ZINF_RETURN_IF_ERROR(stream_.CopyAsync(dst, raw_.data(), raw_.size(), CopyDirection::kHostToDevice));
    return stream_.Synchronize();
  }

 private:
  Stream& stream_;
  std::vector<char> raw_;
};

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
    for (size_t at; (at = text.find("@NVME@")) != std::string::npos;) text.replace(at, 6, nvme_dir);
    auto parsed = ParseConfig(text, "built-in demo config");
    if (!parsed.ok()) return Fail(kName, parsed.status());
    Config config = *parsed;
    AutoContext ctx;
    ctx.total_steps = steps;
    if (Status st = ResolveAuto(config, ctx); !st.ok()) return Fail(kName, st);

    Mlp model;
    const int64_t n = model.w1_numel() + model.w2_numel();
    const int batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
    const int64_t state_bytes = n * (16 + 2);  // fp32 master, m, v, grad + 16-bit params
    std::printf("zinf demo: a %d-%d-%d tanh MLP (%s params, 2 blocks) learns a random teacher through the "
                "ZeRO-3 engine\n",
                model.in, model.hidden, model.out, FormatCount(n).c_str());

    // 2. The NVMe path, checked before use.
    aio::NvmeCheckOptions check;
    check.required_bytes = state_bytes;
    check.test_bytes = 16 * kMiB;
    aio::NvmeCheckReport report = aio::CheckNvmePath(nvme_dir, check);
    std::printf("  nvme:   %s: %s, O_DIRECT %s, align %lld B, free %s, write %.2f GB/s, read %.2f GB/s\n",
                nvme_dir.c_str(), report.filesystem.c_str(), report.direct_io ? "yes" : "no",
                static_cast<long long>(report.alignment_bytes), FormatBytes(report.free_bytes).c_str(),
                report.write_gbps, report.read_gbps);
    if (!report.ok()) {
      return Fail(kName, Status::FailedPrecondition("nvme path " + nvme_dir + ": " + report.problems.front()));
    }

    // 3. The device, under a budget the training state does not fit in.
    DeviceOptions dopt;
    dopt.host_budget_bytes = kDeviceBudgetBytes;
    dopt.cuda_budget_bytes = kDeviceBudgetBytes;
    auto device = CreateDevice(dopt);
    if (!device.ok()) return Fail(kName, device.status());
    std::printf("  device: %s; training state %s = %.1fx the device budget\n", (*device)->name().c_str(),
                FormatBytes(state_bytes).c_str(), double(state_bytes) / double(kDeviceBudgetBytes));
    std::printf("  tiers:  16-bit params on NVMe (prefetched to the device), fp32 master + Adam m, v + grads on "
                "NVMe (sub-groups of %s, read ahead, written behind), AdamW on the CPU\n",
                FormatCount(config.zero.sub_group_size).c_str());

    // 4. The engine.
    std::vector<BlockSpec> blocks = {{"layer1", {{"weight", {model.hidden, model.in}}}},
                                     {"layer2", {{"weight", {model.out, model.hidden}}}}};
    EngineOptions eopt;
    eopt.device = device->get();
    eopt.run_id = "zinf-demo";
    eopt.optimizer_threads = static_cast<int>(*threads);
    eopt.grad_type = ElementType::kBf16;
    auto created = Engine::Create(config, blocks, eopt);
    if (!created.ok()) return Fail(kName, created.status());
    Engine& engine = **created;

    std::mt19937_64 rng(20261122);
    std::vector<float> t1 = Gaussian(model.w1_numel(), 1.0f / std::sqrt(float(model.in)), rng);
    std::vector<float> t2 = Gaussian(model.w2_numel(), 1.0f / std::sqrt(float(model.hidden)), rng);
    {
      std::vector<float> w1 = Gaussian(model.w1_numel(), 0.02f, rng);
      std::vector<float> w2 = Gaussian(model.w2_numel(), 0.02f, rng);
      Status st = engine.SetParameters(0, {w1.data()});
      if (st.ok()) st = engine.SetParameters(1, {w2.data()});
      if (!st.ok()) return Fail(kName, st);
    }
    auto stream = engine.device().CreateStream();
    if (!stream.ok()) return Fail(kName, stream.status());
    DeviceIo io(**stream);
    auto grad_dev = engine.device().Allocate(size_t(std::max(model.w1_numel(), model.w2_numel())) * 2);
    if (!grad_dev.ok()) return Fail(kName, grad_dev.status());

    // A batch of inputs and the teacher's outputs for them.
    auto batch_of = [&](std::mt19937_64& r, std::vector<float>& x, std::vector<float>& t) {
      x = Gaussian(int64_t{batch} * model.in, 1.0f, r);
      std::vector<float> h;
      model.Forward(t1.data(), t2.data(), x, batch, h, t);
    };
    std::mt19937_64 eval_rng(7);
    std::vector<float> eval_x, eval_t;
    batch_of(eval_rng, eval_x, eval_t);

    std::vector<float> w1, w2, h, y, dy, dz, x, t;
    std::vector<float> g1(size_t(model.w1_numel())), g2(size_t(model.w2_numel()));
    auto fetch = [&](BlockId b, int64_t numel, std::vector<float>& w) -> Status {
      ZINF_ASSIGN_OR_RETURN(std::vector<void*> ptrs, engine.Acquire(b));
      Status st = io.Download(ptrs[0], numel, w);
      Status released = engine.Release(b);
      return st.ok() ? released : st;
    };
    // One training step; returns the loss of its batch (eval: no update).
    double compute_s = 0;
    auto train_step = [&](bool update, double* loss) -> Status {
      ZINF_RETURN_IF_ERROR(fetch(0, model.w1_numel(), w1));
      ZINF_RETURN_IF_ERROR(fetch(1, model.w2_numel(), w2));
      auto t0 = std::chrono::steady_clock::now();
      model.Forward(w1.data(), w2.data(), update ? x : eval_x, batch, h, y);
      *loss = model.Loss(y, update ? t : eval_t, update ? &dy : nullptr);
      compute_s += update ? Since(t0) : 0.0;
      if (!update) return Status::Ok();
      // Backward, last block first: acquire, compute, hand the gradient back.
      ZINF_ASSIGN_OR_RETURN(std::vector<void*> p2, engine.Acquire(1));
      Status st = io.Download(p2[0], model.w2_numel(), w2);
      t0 = std::chrono::steady_clock::now();
      if (st.ok()) model.BackwardLayer2(w2.data(), h, dy, batch, g2.data(), dz);
      compute_s += Since(t0);
      if (st.ok()) st = io.Upload(g2.data(), model.w2_numel(), *grad_dev);
      if (st.ok()) st = engine.ReduceGradients(1, {*grad_dev});
      Status released = engine.Release(1);
      ZINF_RETURN_IF_ERROR(st.ok() ? released : st);
      ZINF_ASSIGN_OR_RETURN(std::vector<void*> p1, engine.Acquire(0));
      t0 = std::chrono::steady_clock::now();
      model.BackwardLayer1(update ? x : eval_x, dz, batch, g1.data());
      compute_s += Since(t0);
      (void)p1;
      st = io.Upload(g1.data(), model.w1_numel(), *grad_dev);
      if (st.ok()) st = engine.ReduceGradients(0, {*grad_dev});
      released = engine.Release(0);
      return st.ok() ? released : st;
    };

    double first_loss = 0;
    if (Status st = train_step(false, &first_loss); !st.ok()) return Fail(kName, st);
    std::printf("  step %4d  eval loss %.5f\n", 0, first_loss);
    const auto t_train = std::chrono::steady_clock::now();
    for (int64_t step = 1; step <= steps; ++step) {
      batch_of(rng, x, t);
      double loss = 0;
      Status st = train_step(true, &loss);
      if (!st.ok()) return Fail(kName, st.WithContext("step " + std::to_string(step)));
      auto result_or = engine.Step();
      if (!result_or.ok()) return Fail(kName, result_or.status().WithContext("step " + std::to_string(step)));
      if (step % config.steps_per_print == 0 || step == steps) {
        double eval = 0;
        if (Status e = train_step(false, &eval); !e.ok()) return Fail(kName, e);
        std::printf("  step %4lld  train loss %.5f  eval loss %.5f  lr %.2e  grad norm %.3f\n",
                    static_cast<long long>(step), loss, eval, result_or->lr, result_or->grad_norm);
      }
    }
    const double train_s = Since(t_train);
    double last_loss = 0;
    if (Status st = train_step(false, &last_loss); !st.ok()) return Fail(kName, st);
    const EngineCounters c = engine.counters();

    // 5. Checkpoint the master weights crash-safely, load them back, compare.
    std::vector<float> m1(size_t(model.w1_numel())), m2(size_t(model.w2_numel()));
    Status st = engine.GetMasterParameters(0, {m1.data()});
    if (st.ok()) st = engine.GetMasterParameters(1, {m2.data()});
    if (!st.ok()) return Fail(kName, st);
    aio::IoEngineOptions io_options = aio::FromAioConfig(config.aio);
    auto io_engine = aio::CreateIoEngine(io_options);
    if (!io_engine.ok()) return Fail(kName, io_engine.status());
    aio::PinnedPoolOptions cpo;
    cpo.buffer_count = 2;
    cpo.buffer_bytes = 4 * kMiB;
    cpo.name = "demo checkpoint";
    auto ckpt_pool = aio::PinnedPool::Create(cpo);
    if (!ckpt_pool.ok()) return Fail(kName, ckpt_pool.status());
    auto as_bytes = [](std::vector<float>& v) {
      return std::span<std::byte>(reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(float));
    };
    const std::string root = dir + "/checkpoints";
    if (st = MakeDirectories(root); !st.ok()) return Fail(kName, st);
    const std::string ckpt = root + "/step-" + std::to_string(steps);
    auto t0 = std::chrono::steady_clock::now();
    st = swap::SaveCheckpoint(**io_engine, **ckpt_pool, ckpt, {{"step", std::to_string(steps)}},
                              {swap::BlobRef::Ram("layer1.weight", as_bytes(m1)),
                               swap::BlobRef::Ram("layer2.weight", as_bytes(m2))});
    if (!st.ok()) return Fail(kName, st);
    const double save_s = Since(t0);
    std::vector<float> l1(m1.size()), l2(m2.size());
    auto latest = swap::ResolveLatest(**io_engine, **ckpt_pool, root);
    if (!latest.ok()) return Fail(kName, latest.status());
    auto meta = swap::LoadCheckpoint(**io_engine, **ckpt_pool, *latest,
                                     {swap::BlobRef::Ram("layer1.weight", as_bytes(l1)),
                                      swap::BlobRef::Ram("layer2.weight", as_bytes(l2))});
    if (!meta.ok()) return Fail(kName, meta.status());
    const bool same = l1 == m1 && l2 == m2;

    std::printf("zinf demo: eval loss %.5f -> %.5f (%.1fx lower) in %lld steps, %.1f s\n", first_loss, last_loss,
                first_loss / last_loss, static_cast<long long>(steps), train_s);
    std::printf("  throughput: %.1f samples/s; model compute %.1f s, optimizer %.1f s, waiting for NVMe %.2f s, "
                "for fetches %.2f s\n",
                double(batch) * double(steps) / train_s, compute_s, double(c.optimizer_ns) / 1e9,
                double(c.nvme_wait_ns) / 1e9, double(c.fetch_wait_ns) / 1e9);
    std::printf("  moved: params %s read + %s written on NVMe, optimizer state %s on NVMe, %s to the device; "
                "%lld fetches, %lld prefetch hits, peak %s params live on the device\n",
                FormatBytes(c.nvme_read_bytes).c_str(), FormatBytes(c.nvme_write_bytes).c_str(),
                FormatBytes(c.optimizer_nvme_bytes).c_str(), FormatBytes(c.h2d_bytes).c_str(),
                static_cast<long long>(c.fetches), static_cast<long long>(c.prefetch_hits),
                FormatCount(c.peak_live_elems).c_str());
    std::printf("  checkpoint: %s saved in %.2f s, loaded back %s\n", latest->c_str(), save_s,
                same ? "bit-identical" : "DIFFERENT");
    if (Status freed = (*stream)->Synchronize(); !freed.ok()) return Fail(kName, freed);
    engine.device().Free(*grad_dev);
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

ZINF_COMMAND({"demo", "the built-in default job: a small model trained through the engine with NVMe offload",
              "demo [--dir DIR] [--steps N] [--threads T] [--keep]\n"
              "  Trains a small MLP for N steps (default 60) through the ZeRO-3 engine, parameters and\n"
              "  optimizer state on NVMe under DIR (default: a new /tmp/zinf-demo.* directory, removed at\n"
              "  the end unless --keep), on a device budget smaller than the training state.",
              Run});

}  // namespace
}  // namespace zinf::cli
