// zinf demo: the built-in default job, what `make demo` runs.
//
// The reference GPT ("demo" size) learns the built-in generated corpus
// through the ZeRO-3 engine with everything offloaded: the 16-bit parameters
// live on NVMe and are fetched to the device (the GPU, or the host standing
// in for one) block by block, prefetched once the order is known; the fp32
// master weights, Adam moments and gradients live on NVMe too and are
// stepped by CPU AdamW in sub-groups read ahead and written behind. The
// device gets a memory budget of a third of the model's training state
// (less when --budget-ratio says so), so the run only works because of the
// offload. At the end the state is checkpointed crash-safely, a second
// trainer resumes from the checkpoint and must reproduce the held-out loss
// exactly, and the job fails unless the loss fell clearly.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "aio/nvme_check.h"
#include "cli/command.h"
#include "cli/demo_config.h"
#include "cli/train_loop.h"
#include "core/fs.h"
#include "core/units.h"
#include "device/device.h"
#include "model/gpt.h"
#include "model/plan.h"
#include "model/trainer.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

constexpr char kName[] = "demo";

// The demo's device: a budget of the training state / `ratio`; prints it
// and where each part of the state lives.
StatusOr<std::unique_ptr<Device>> DemoDevice(int64_t state_bytes, double ratio, const Config& config) {
  const int64_t budget = static_cast<int64_t>(static_cast<double>(state_bytes) / ratio);
  DeviceOptions dopt;
  dopt.host_budget_bytes = static_cast<size_t>(budget);
  dopt.cuda_budget_bytes = static_cast<size_t>(budget);
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(dopt));
  std::printf("  device: %s; training state %s = %.1fx the device budget\n", device->name().c_str(),
              FormatBytes(state_bytes).c_str(), double(state_bytes) / double(budget));
  std::printf(
      "  tiers:  16-bit params on NVMe (prefetched to the device), fp32 master + Adam m, v on NVMe "
      "(sub-groups of %s, read ahead, written behind), fp32 grads accumulated in those sub-groups "
      "through a few pinned buffers, AdamW on the CPU under the next forward pass\n",
      FormatCount(config.zero.sub_group_size).c_str());
  return device;
}

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, {"dir", "steps", "threads", "model", "budget-ratio"}, {"keep"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  auto steps = flags->GetInt("steps", 100);
  auto threads = flags->GetInt("threads", 0);
  auto ratio = flags->GetDouble("budget-ratio", 3.0);
  if (!steps.ok()) return Fail(kName, steps.status(), 2);
  if (!threads.ok()) return Fail(kName, threads.status(), 2);
  if (!ratio.ok()) return Fail(kName, ratio.status(), 2);
  if (*steps < 1) return Fail(kName, Status::InvalidArgument("--steps must be positive"), 2);
  if (*ratio < 1.0) return Fail(kName, Status::InvalidArgument("--budget-ratio must be at least 1"), 2);
  const std::string model_name = flags->GetOr("model", "demo");
  auto model = model::LoadGptConfig(model_name);
  if (!model.ok()) return Fail(kName, model.status(), 2);

  std::string dir = flags->GetOr("dir", "");
  // A directory the user named is theirs: it is kept (only a temporary one
  // made here is removed).
  const bool keep = flags->Has("keep") || !dir.empty();
  if (dir.empty()) {
    char tmpl[] = "/tmp/zinf-demo.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail(kName, ErrnoStatus(errno, "mkdtemp", tmpl));
    dir = tmpl;
  } else if (Status st = MakeDirectories(dir); !st.ok()) {
    return Fail(kName, st);
  }

  auto result = [&]() -> int {
    const std::string nvme_dir = JoinPath(dir, "nvme");
    if (Status st = MakeDirectories(nvme_dir); !st.ok()) return Fail(kName, st);
    // 1. The built-in config, resolved like any user's.
    auto parsed = ParseConfig(DemoConfigJson(nvme_dir), "built-in demo config");
    if (!parsed.ok()) return Fail(kName, parsed.status());
    Config config = *parsed;
    AutoContext ctx;
    ctx.hidden_size = model->n_embd;
    ctx.total_steps = *steps;
    if (Status st = ResolveAuto(config, ctx); !st.ok()) return Fail(kName, st);

    const int64_t n = model->NumParameters();
    const int64_t state_bytes = n * (16 + 2);  // fp32 master, m, v, grad + 16-bit params
    std::printf(
        "zinf demo: GPT '%s' (%s params: %d layers, width %d, %d heads, context %d) learns the built-in "
        "corpus through the ZeRO-3 engine\n",
        model_name.c_str(), FormatCount(n).c_str(), model->n_layer, model->n_embd, model->n_head, model->seq_len);

    // 2. The NVMe path, checked before use.
    aio::NvmeCheckOptions check;
    check.required_bytes = 2 * state_bytes;  // the swap files and one checkpoint
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
    auto device = DemoDevice(state_bytes, *ratio, config);
    if (!device.ok()) return Fail(kName, device.status());

    // 4. Train.
    model::TrainerOptions topt;
    topt.model = *model;
    topt.corpus_bytes = 2 << 20;
    topt.hooks.device = device->get();
    topt.engine.run_id = "zinf-demo";
    topt.engine.optimizer_threads = static_cast<int>(*threads);
    // As zinf train's --activations auto under this budget (whole layers).
    auto activations = model::LayerActivationsForDevice("auto", *model, config, **device, topt.gpu_compute16, 0);
    if (!activations.ok()) return Fail(kName, activations.status());
    topt.activations = *activations;
    auto trainer = model::Trainer::Create(config, topt);
    if (!trainer.ok()) return Fail(kName, trainer.status());
    std::printf("  memory: activations and scratch %s on the device (%d sequences of %d tokens; activations: %s)\n",
                FormatBytes((*trainer)->activation_bytes()).c_str(),
                static_cast<int>(config.train_micro_batch_size_per_gpu), model->seq_len,
                model::LayerActivationsDescription(topt.activations));
    std::fflush(stdout);
    TrainRun run;
    run.steps = *steps;
    run.steps_per_print = config.steps_per_print;
    run.save_dir = JoinPath(dir, "checkpoints");
    run.eval_batches = 8;
    run.export_path = JoinPath(dir, "demo.safetensors");
    run.progress = stdout;
    auto summary = RunTraining(**trainer, run);
    if (!summary.ok()) return Fail(kName, summary.status());
    trainer->reset();

    // 5. The checkpoint resumes to the same model.
    model::TrainerOptions again = topt;
    again.engine.run_id = "zinf-demo-resume";
    Config config2 = config;
    const std::string nvme2 = JoinPath(dir, "nvme-resume");
    if (Status st = MakeDirectories(nvme2); !st.ok()) return Fail(kName, st);
    config2.zero.offload_param.nvme_paths = {nvme2};
    config2.zero.offload_optimizer.nvme_paths = {nvme2};
    auto resumed = model::Trainer::Create(config2, again);
    if (!resumed.ok()) return Fail(kName, resumed.status());
    if (Status st = (*resumed)->Resume(run.save_dir); !st.ok()) return Fail(kName, st);
    auto eval = (*resumed)->Evaluate(run.eval_batches);
    if (!eval.ok()) return Fail(kName, eval.status());
    const bool same = *eval == summary->eval_after;
    std::printf("  checkpoint: %s; resumed at step %lld, held-out loss %.6f (%s)\n", summary->last_checkpoint.c_str(),
                static_cast<long long>((*resumed)->step()), *eval, same ? "identical" : "DIFFERENT");
    std::printf("  export:     %s (bf16 safetensors)\n", run.export_path.c_str());
    const EngineCounters& c = summary->moved;
    std::printf(
        "  moved:      nvme param reads %s, writes %s; optimizer state %s; h2d %s; prefetch hits %lld of "
        "%lld fetches\n",
        FormatBytes(c.nvme_read_bytes).c_str(), FormatBytes(c.nvme_write_bytes).c_str(),
        FormatBytes(c.optimizer_nvme_bytes).c_str(), FormatBytes(c.h2d_bytes).c_str(),
        static_cast<long long>(c.prefetch_hits), static_cast<long long>(c.fetches));
    std::printf("  time:       %s\n", FormatTimeShares(*summary).c_str());
    std::printf("  result:     held-out loss %.4f -> %.4f (%.1fx lower), training loss %.4f -> %.4f, %s tok/s\n",
                summary->eval_before, summary->eval_after, summary->eval_before / summary->eval_after,
                summary->first_loss, summary->last_loss,
                FormatCount(static_cast<int64_t>(summary->tokens_per_second)).c_str());
    // "Clearly": the held-out loss at most 60% of where it started (from
    // about ln 257 = 5.55 for a uniform guess).
    if (!(summary->eval_after < 0.6 * summary->eval_before)) {
      return Fail(kName, Status::Internal("the loss did not fall clearly: " + std::to_string(summary->eval_before) +
                                          " -> " + std::to_string(summary->eval_after)));
    }
    if (!same) return Fail(kName, Status::Internal("the resumed model's loss differs from the saved one's"));
    std::printf("zinf demo: OK\n");
    return 0;
  }();

  if (keep) {
    std::printf("  kept %s\n", dir.c_str());
  } else {
    RemoveTree(dir).IgnoreError();
  }
  return result;
}

ZINF_COMMAND(Command{kName, "train a small GPT with parameters and optimizer state on NVMe (the default job)",
                     "demo [--steps N] [--model NAME] [--budget-ratio R] [--dir DIR] [--keep] [--threads N]\n\n"
                     "Trains the reference GPT (default 'demo') on the built-in corpus for N steps (default\n"
                     "100) with ZeRO-3, 16-bit parameters and fp32 optimizer state on NVMe under DIR (default\n"
                     "a temporary directory, removed at the end unless --keep; a DIR you name is kept), on a\n"
                     "device whose memory budget is 1/R of the training state (default R 3). Checkpoints,\n"
                     "resumes from the checkpoint and checks the model is the same, exports safetensors, and\n"
                     "fails unless the held-out loss falls below 60% of its start.",
                     Run});

}  // namespace
}  // namespace zinf::cli
