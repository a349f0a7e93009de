// zinf train: the reference GPT trained through the ZeRO-3 engine on the
// tiers a DeepSpeed config names. Under `mpirun -np N` every rank runs this
// command; MPI is initialised when the launcher's environment says there are
// several ranks, and only rank 0 prints.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "cli/monitors.h"
#include "cli/mpi_scope.h"
#include "cli/train_loop.h"
#include "cli/trainer_args.h"
#include "comm/mpi_communicator.h"
#include "core/file_lock.h"
#include "core/fs.h"
#include "core/progress.h"
#include "core/units.h"
#include "device/device.h"
#include "model/fetch_layout.h"
#include "model/gpt.h"
#include "model/hf_checkpoint.h"
#include "model/plan.h"
#include "model/safetensors.h"
#include "model/trainer.h"
#include "swap/checkpoint_dirs.h"
#include "swap/swap_store.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

constexpr char kName[] = "train";

int RunRank(const std::vector<std::string>& args, MpiScope& mpi);

// --data-order and --holdout into `topt`.
Status ParseDataFlags(const Flags& flags, model::TrainerOptions& topt) {
  auto order = model::ParseDataOrder(flags.GetOr("data-order", "shuffled"));
  if (!order.ok()) return order.status().WithContext("--data-order");
  auto holdout = flags.GetDouble("holdout", 0.05);
  if (!holdout.ok()) return holdout.status();
  if (!(*holdout >= 0.0 && *holdout <= 0.5)) return Status::InvalidArgument("--holdout: expected a fraction 0..0.5");
  topt.data_order = *order;
  topt.eval_fraction = *holdout;
  return Status::Ok();
}

// With --nvme-path P, the user gave the swap path by the flag, not by a config
// key: errors name the flag ("--nvme-path P") where the engine names the key
// it read the path from ("zero_optimization.offload_param.nvme_path [P]").
Status NameNvmeFlag(const Status& status, const std::optional<std::string>& nvme_path) {
  if (status.ok() || !nvme_path) return status;
  std::string msg = status.message();
  for (const char* section : {"offload_param", "offload_optimizer"}) {
    const std::string key = "zero_optimization." + std::string(section) + ".nvme_path [" + *nvme_path + "]";
    for (size_t at = msg.find(key); at != std::string::npos; at = msg.find(key, at)) {
      msg.replace(at, key.size(), "--nvme-path " + *nvme_path);
    }
  }
  return Status(status.code(), std::move(msg), status.sys_errno());
}

// Several ranks: a rank that fails alone (its checkpoint damaged, its disk
// full) takes the whole job down (RunOnEveryRank).
int Run(const std::vector<std::string>& args) {
  return RunOnEveryRank([&](MpiScope& mpi) { return RunRank(args, mpi); });
}

// The directories a run writes, locked for its duration: a second run on
// the save dir would delete this one's save in progress as an orphan, and
// one on a swap path would replace this one's swap files as stale.
struct RunLocks {
  FileLock save_dir;
  std::vector<FileLock> swap_dirs;
};

Status LockRunDirectories(const Flags& flags, const Config& config, int rank, RunLocks& locks) {
  if (const auto save_dir = flags.Get("save-dir")) {
    auto lock = swap::LockRankDirectory(*save_dir, rank);
    if (!lock.ok()) return lock.status().WithContext("--save-dir");
    locks.save_dir = std::move(*lock);
  }
  const auto nvme_flag = flags.Get("nvme-path");
  for (const auto& [section, offload] :
       {std::pair{"offload_param", std::pair{config.zero.offload_param.device, config.zero.offload_param.nvme_paths}},
        std::pair{"offload_optimizer",
                  std::pair{config.zero.offload_optimizer.device, config.zero.offload_optimizer.nvme_paths}}}) {
    if (offload.first != OffloadDevice::kNvme) continue;
    for (const std::string& dir : offload.second) {
      const bool held = std::any_of(locks.swap_dirs.begin(), locks.swap_dirs.end(),
                                    [&](const FileLock& l) { return ParentPath(l.path()) == dir; });
      if (held) continue;
      auto lock = swap::LockSwapDirectory(dir, rank);
      if (!lock.ok()) {
        const std::string origin =
            nvme_flag ? "--nvme-path" : "zero_optimization." + std::string(section) + ".nvme_path";
        return lock.status().WithContext(origin);
      }
      locks.swap_dirs.push_back(std::move(*lock));
    }
  }
  return Status::Ok();
}

// --metrics, --report and the config's monitor sections (rank 0).
MonitorOptions MakeMonitorOptions(const Flags& flags, const Config& config, const model::GptConfig& model,
                                  const std::string& device_name, int world, int64_t steps, int64_t resumed_at) {
  MonitorOptions mopt;
  mopt.metrics_path = flags.GetOr("metrics", "");
  mopt.config = &config;
  const auto report = flags.Get("report");
  if (!report) return mopt;
  const std::string model_name = flags.GetOr("model", "small");
  const std::string config_path = flags.GetOr("config", "");
  mopt.report.path = *report;
  mopt.report.title = "zinf train: model " + model_name + ", " + config_path;
  mopt.report.facts = {
      {"model", model_name + ": " + FormatCount(model.NumParameters()) + " parameters, " +
                    std::to_string(model.n_layer) + " layers, width " + std::to_string(model.n_embd) + ", context " +
                    std::to_string(model.seq_len)},
      {"device", device_name + ", " + std::to_string(world) + " rank(s)"},
      {"batch", "micro-batch " + std::to_string(config.train_micro_batch_size_per_gpu) + " x accumulation " +
                    std::to_string(config.gradient_accumulation_steps) + " x " + std::to_string(world) + " rank(s) x " +
                    std::to_string(model.seq_len) + " tokens"},
      {"steps", std::to_string(steps) + (resumed_at > 0 ? " (resumed at " + std::to_string(resumed_at) + ")" : "")},
      {"data", flags.GetOr("data", "built-in corpus")},
      {"config", config_path}};
  mopt.report.config_json = ConfigToJson(config);
  return mopt;
}

// What the run is about to do (rank 0): ignored keys, resolved "auto"
// values, the model's notes, the model and the device.
void PrintRunHeader(FILE* out, const Config& config, const std::vector<AutoResolution>& resolutions,
                    const model::ModelSource& source, const std::string& device_name, int world) {
  if (!config.ignored_keys.empty()) {
    std::string keys;
    for (const std::string& k : config.ignored_keys) {
      const std::string_view why = IgnoredKeyReason(k);
      keys += (keys.empty() ? "" : ", ") + k + (why.empty() ? "" : " (" + std::string(why) + ")");
    }
    std::fprintf(out, "zinf train: %s: keys zinf does not act on: %s\n", config.source.c_str(), keys.c_str());
  }
  for (const AutoResolution& r : resolutions) std::fprintf(out, "zinf train: %s\n", FormatResolution(r).c_str());
  if (source.hf != nullptr) {
    std::string notes;
    for (const std::string& n : source.hf->notes) notes += (notes.empty() ? "" : "; ") + n;
    if (!notes.empty()) std::fprintf(out, "zinf train: %s: %s\n", source.hf->dir.c_str(), notes.c_str());
  }
  const model::GptConfig& m = source.model;
  std::string window;
  if (m.moe()) {
    window = "; " + std::to_string(m.experts_per_token) + " of " + std::to_string(m.n_experts) + " experts a token" +
             (m.shared_expert() ? " and a shared one" : "") +
             (m.dense_layers.empty() ? "" : " in " + std::to_string(m.routed_layers()) + " layers") + ", " +
             FormatCount(m.ActiveParameters()) + " parameters active";
  }
  if (m.sliding_window > 0) {
    window += "; sliding window " + std::to_string(m.sliding_window) + " in " +
              std::to_string(m.sliding_layers.size()) + " of the layers";
  }
  std::fprintf(out, "zinf train: model %s: %s parameters (%d layers, %d heads%s, width %d, context %d, vocab %d%s)\n",
               source.description.c_str(), FormatCount(m.NumParameters()).c_str(), m.n_layer, m.n_head,
               model::AttentionNote(m).c_str(), m.n_embd, m.seq_len, m.vocab_size, window.c_str());
  std::fprintf(out, "zinf train: device %s, %d rank(s), micro-batch %lld x %d tokens, accumulation %lld\n",
               device_name.c_str(), world, static_cast<long long>(config.train_micro_batch_size_per_gpu), m.seq_len,
               static_cast<long long>(config.gradient_accumulation_steps));
}

// --fetch-unit and --activations into `topt` (topt.model and
// topt.gpu_compute16 set): auto for
// this device (the fetch unit: the resumed checkpoint's, FetchUnitText),
// the cut first (it does not depend on the activations, so a checkpoint
// resumes whichever they are).
Status SetFetchUnitAndActivations(const Flags& flags, const std::string& fetch_unit_text, const Config& config,
                                  const Device& device, model::TrainerOptions& topt) {
  ZINF_ASSIGN_OR_RETURN(topt.fetch_unit,
                        model::FetchUnitForDevice(fetch_unit_text, topt.model, config, device, topt.gpu_compute16));
  ZINF_ASSIGN_OR_RETURN(topt.activations,
                        model::LayerActivationsForDevice(flags.GetOr("activations", "auto"), topt.model, config, device,
                                                         topt.gpu_compute16, topt.fetch_unit));
  return Status::Ok();
}

// How the layers are cut into engine blocks and what the backward finds
// of their activations (rank 0). `fetch_unit_text`: what was resolved.
void PrintFetchLine(FILE* out, const Flags& flags, const std::string& fetch_unit_text, const model::Trainer& trainer) {
  const model::FetchLayout& layout = trainer.layout();
  const std::string given = flags.GetOr("fetch-unit", "auto");
  std::fprintf(
      out, "zinf train: fetch unit %s: %s (largest engine block %s parameters)\n",
      (fetch_unit_text == given ? given : given + " (the resumed checkpoint's, " + fetch_unit_text + ")").c_str(),
      layout.Describe().c_str(), FormatCount(layout.max_piece_elems()).c_str());
  const int64_t host = trainer.host_activation_bytes();
  std::fprintf(out, "zinf train: activations %s: %s (%s with the scratch, on the device%s)\n",
               flags.GetOr("activations", "auto").c_str(), model::LayerActivationsDescription(trainer.activations()),
               FormatBytes(trainer.activation_bytes()).c_str(),
               host > 0 ? ("; " + FormatBytes(host) + " pinned").c_str() : "");
  const std::string compute = trainer.compute_name();
  std::fprintf(out, "zinf train: compute %s: %s\n", compute.c_str(),
               compute == "cuda-16" ? "linear layers on tensor cores in the parameters' 16-bit type, fp32 elsewhere"
                                    : "fp32 (16-bit parameters are read as fp32)");
}

int RunRank(const std::vector<std::string>& args, MpiScope& mpi) {
  auto flags = TrainerFlags(
      args, {"config",           "model",         "data",       "steps",        "save-dir",   "save-every",
             "keep-checkpoints", "resume",        "export",     "export-dtype", "eval-every", "eval-batches",
             "device",           "device-budget", "seed",       "threads",      "nvme-path",  "corpus-bytes",
             "data-order",       "holdout",       "metrics",    "report",       "seq-len",    "weight-decay-on",
             "fetch-unit",       "activations",   "gpu-compute"},
      {"quiet", "exact-losses", "from-config"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  const auto config_path = flags->Get("config");
  if (!config_path) return Fail(kName, Status::InvalidArgument("--config is required (see configs/)"), 2);

  if (Status s = mpi.Start(); !s.ok()) return Fail(kName, s);
  const int rank = comm::MpiWorldRank();
  const int world = comm::MpiWorldSize();

  auto seq_len = flags->GetInt("seq-len", 0);
  if (!seq_len.ok() || *seq_len < 0 || *seq_len > (1 << 20)) {
    return Fail(kName, Status::InvalidArgument("--seq-len: expected a length in 1..2^20"), 2);
  }
  auto source = ModelFromFlags(*flags, flags->GetOr("model", "small"), static_cast<int>(*seq_len));
  if (!source.ok()) return Fail(kName, source.status(), 2);
  const model::GptConfig* model = &source->model;
  auto steps = flags->GetInt("steps", 100);
  auto save_every = flags->GetInt("save-every", 0);
  auto keep = flags->GetInt("keep-checkpoints", 0);
  auto eval_every = flags->GetInt("eval-every", 0);
  auto eval_batches = flags->GetInt("eval-batches", 8);
  auto budget = flags->GetInt("device-budget", 0);
  auto seed = flags->GetInt("seed", 1234);
  auto threads = flags->GetInt("threads", 0);
  auto corpus = flags->GetInt("corpus-bytes", 2 << 20);
  for (const auto* v : {&steps, &save_every, &keep, &eval_every, &eval_batches, &budget, &seed, &threads, &corpus}) {
    if (!v->ok()) return Fail(kName, v->status(), 2);
  }
  // 0: no training (with --export, the loaded weights written out unchanged).
  if (*steps < 0) return Fail(kName, Status::InvalidArgument("--steps must be 0 or more"), 2);
  if (const std::string d = flags->GetOr("export-dtype", "BF16"); !model::SafetensorsFloatType(d)) {
    return Fail(kName, Status::InvalidArgument("--export-dtype: expected F32, BF16 or F16, got '" + d + "'"), 2);
  }
  if (*keep > (1 << 20)) {
    return Fail(kName, Status::InvalidArgument("--keep-checkpoints: expected a count up to 2^20"), 2);
  }
  if (Status s = swap::CheckKeepCheckpoints(static_cast<int>(*keep), world); !s.ok()) {
    return Fail(kName, s.WithContext("--keep-checkpoints"), 2);
  }
  auto choice = ParseDeviceChoice(flags->GetOr("device", "auto"));
  if (!choice.ok()) return Fail(kName, choice.status(), 2);
  auto decay_on = model::ParseWeightDecayOn(flags->GetOr("weight-decay-on", "matrices"));
  if (!decay_on.ok()) return Fail(kName, decay_on.status().WithContext("--weight-decay-on"), 2);

  auto config = LoadConfigFile(*config_path);
  if (!config.ok()) return Fail(kName, config.status(), 2);
  if (const auto nvme = flags->Get("nvme-path")) {
    config->zero.offload_param.nvme_paths = {*nvme};
    config->zero.offload_optimizer.nvme_paths = {*nvme};
  }
  AutoContext ctx;
  ctx.world_size = world;
  ctx.hidden_size = model->n_embd;
  ctx.total_steps = std::max<int64_t>(*steps, 1);  // --steps 0 runs no schedule: any length resolves
  // HF Trainer arguments (--lr, --micro-batch, ...) fill the "auto" keys.
  auto trainer_args = TrainerArgsFromFlags(*flags);
  if (!trainer_args.ok()) return Fail(kName, trainer_args.status(), 2);
  ctx.trainer = *trainer_args;
  std::vector<AutoResolution> resolutions;
  if (Status s = ResolveAuto(*config, ctx, &resolutions); !s.ok()) return Fail(kName, s, 2);
  // Held to the end of the run (see LockRunDirectories).
  RunLocks locks;
  if (Status st = LockRunDirectories(*flags, *config, rank, locks); !st.ok()) return Fail(kName, st);
  FILE* out = (rank == 0 && !flags->Has("quiet")) ? stderr : nullptr;

  DeviceOptions dopt;
  dopt.choice = *choice;
  dopt.host_budget_bytes = static_cast<size_t>(*budget);
  dopt.cuda_budget_bytes = static_cast<size_t>(*budget);
  dopt.cuda_ordinal = CudaDeviceCount() > 0 ? rank % CudaDeviceCount() : 0;
  auto device = CreateDevice(dopt);
  if (!device.ok()) return Fail(kName, device.status());

  model::TrainerOptions topt;
  if (Status s = ParseDataFlags(*flags, topt); !s.ok()) return Fail(kName, s, 2);
  topt.model = *model;
  topt.initial_weights = source->InitialWeights();
  topt.data_path = flags->GetOr("data", "");
  topt.corpus_bytes = *corpus;
  topt.seed = static_cast<uint64_t>(*seed);
  topt.weight_decay_on = *decay_on;
  const StatusOr<bool> compute16 = model::ParseGpuCompute16(flags->GetOr("gpu-compute", "16"));
  if (!compute16.ok()) return Fail(kName, compute16.status(), 2);
  topt.gpu_compute16 = *compute16;
  const std::string fetch_unit_text = FetchUnitText(*flags, rank, world);
  if (Status s = SetFetchUnitAndActivations(*flags, fetch_unit_text, *config, **device, topt); !s.ok()) {
    return Fail(kName, s, 2);
  }
  topt.hooks.device = device->get();
  topt.engine.optimizer_threads = static_cast<int>(*threads);
  topt.engine.progress = MeterFactory(out);  // checkpoint save, resume and export: bar or lines on rank 0
  if (out) PrintRunHeader(out, *config, resolutions, *source, (*device)->name(), world);
  auto trainer = model::Trainer::Create(*config, topt);
  if (!trainer.ok()) return Fail(kName, source->HintSeqLen(NameNvmeFlag(trainer.status(), flags->Get("nvme-path"))));
  if (out) PrintFetchLine(out, *flags, fetch_unit_text, **trainer);
  if (const auto resume = flags->Get("resume")) {
    if (Status s = (*trainer)->Resume(*resume); !s.ok()) return Fail(kName, NameNvmeFlag(s, flags->Get("nvme-path")));
    if (out) std::fprintf(out, "zinf train: resumed at step %lld\n", static_cast<long long>((*trainer)->step()));
  }

  // Metrics files (rank 0): --metrics and the config's monitor sections.
  RunMonitors monitors;
  if (rank == 0) {
    MonitorOptions mopt =
        MakeMonitorOptions(*flags, *config, *model, (*device)->name(), world, *steps, (*trainer)->step());
    if (flags->Get("resume")) {  // the files go on after the checkpoint's step
      mopt.resumed_step = (*trainer)->step();
      mopt.resumed_samples = SamplesAfter(**trainer);
    }
    auto created = RunMonitors::Create(mopt);
    if (!created.ok()) return Fail(kName, created.status());
    monitors = std::move(*created);
    for (const std::string& d : monitors.destinations()) {
      if (out) std::fprintf(out, "zinf train: %s\n", d.c_str());
    }
  }

  TrainRun run;
  run.monitors = monitors.list();
  run.steps = *steps;
  run.steps_per_print = config->steps_per_print;
  run.save_dir = flags->GetOr("save-dir", "");
  run.save_every = *save_every;
  run.keep_checkpoints = static_cast<int>(*keep);
  run.eval_every = *eval_every;
  run.eval_batches = static_cast<int>(*eval_batches);
  run.export_path = flags->GetOr("export", "");  // every rank: the export gathers collectively
  run.export_dtype = flags->GetOr("export-dtype", "BF16");
  run.export_source = source->hf;
  run.exact_losses = flags->Has("exact-losses");
  run.progress = out;
  auto summary = RunTraining(**trainer, run);
  if (!summary.ok()) return Fail(kName, source->HintSeqLen(NameNvmeFlag(summary.status(), flags->Get("nvme-path"))));
  if (rank == 0) {
    std::printf("zinf train: %lld steps, loss %.4f -> %.4f", static_cast<long long>(summary->steps),
                summary->first_loss, summary->last_loss);
    if (summary->evaluated) std::printf(", eval %.4f -> %.4f", summary->eval_before, summary->eval_after);
    std::printf(", %s tok/s (median)\n", FormatCount(static_cast<int64_t>(summary->tokens_per_second)).c_str());
    std::printf("zinf train: time %s\n", FormatTimeShares(*summary).c_str());
    if (!summary->kernels.by_op.empty()) {
      std::printf("zinf train: kernels %s\n", FormatKernelTimes(summary->kernels, summary->seconds, 8).c_str());
    }
  }
  return 0;
}

ZINF_COMMAND(Command{
    kName, "train the reference GPT with ZeRO-3 offload (DeepSpeed config)",
    "train --config C [--model M] [--data D] [--steps N] [--save-dir S [--save-every K] [--keep-checkpoints N]]\n"
    "                  [--resume S]\n"
    "                  [--export FILE.safetensors|DIR [--export-dtype BF16|F16|F32]] [--nvme-path P]\n"
    "                  [--device auto|cuda|host] [--device-budget SIZE] [--eval-every K] [--eval-batches B]\n"
    "                  [--seed N] [--threads N] [--corpus-bytes SIZE] [--seq-len T]\n"
    "                  [--data-order shuffled|sequential] [--holdout FRACTION] [--metrics FILE.jsonl]\n"
    "                  [--report FILE.html] [--weight-decay-on matrices|all] [--fetch-unit auto|layer|ELEMS]\n"
    "                  [--activations auto|keep|recompute|offload] [--gpu-compute 16|fp32] [--quiet]\n"
    "                  [--exact-losses] [--from-config]\n"
    "                  [--lr X] [--weight-decay X] [--warmup-steps N] [--max-grad-norm X] [--adam-beta1 X]\n"
    "                  [--adam-beta2 X] [--adam-epsilon X] [--micro-batch N] [--grad-accum N]\n\n"
    "  --config C        DeepSpeed JSON (zero_optimization, offload_param/optimizer, aio, optimizer, ...)\n"
    "  --model M         tiny | demo | small | gpt2-124m, a JSON file with vocab_size, seq_len,\n"
    "                    n_layer, n_head, n_embd[, tied_embeddings] (default small), or a Hugging Face\n"
    "                    model folder (GPT-2, Llama, Qwen2, Qwen3, Phi-3, Mistral, SmolLM3, Granite, OLMo 2,\n"
    "                    Gemma, Gemma 2, Gemma 3; config.json + safetensors)\n"
    "  --from-config     with a Hugging Face folder: its config.json alone, the weights random (Llama's\n"
    "                    or GPT-2's scheme, --seed), for training that architecture from scratch; the\n"
    "                    export is a folder of its kind (the folder's config.json and tokenizer copied)\n"
    "  --seq-len T       sequence length (default: the model's; a HF model's positions)\n"
    "  --data D          token file (256 int32 header: 20240520, version, count; then uint16 (version 1)\n"
    "                    or uint32 (2) tokens), e.g. from `zinf data encode`; default: the built-in corpus\n"
    "  --data-order O    shuffled (default: samples in a seeded order per epoch) or sequential (file\n"
    "                    order: each micro-batch B*T+1 consecutive tokens, the next B*T later,\n"
    "                    wrapping at the end); the position is in each checkpoint\n"
    "  --holdout F       the last fraction F (0..0.5, default 0.05) of the tokens is held out for\n"
    "                    evaluation; 0: no held-out tokens and no evaluation\n"
    "  --steps N         optimizer steps to reach (default 100; counts resumed steps; 0: no training)\n"
    "  --save-dir S      checkpoints S/rank-<r>/step-<n>, every --save-every K steps and at the end\n"
    "  --keep-checkpoints N  after each save, remove all but the newest N (default 0: keep all;\n"
    "                    at least 2 with several ranks)\n"
    "  --resume S        a save dir (its latest checkpoint) or one step directory\n"
    "  --export F        the final weights: F.safetensors one file under zinf's names; any other F a\n"
    "                    Hugging Face model folder (config.json, model.safetensors or 5 GB shards,\n"
    "                    the source's tensor names and tokenizer files) for from_pretrained\n"
    "  --nvme-path P     overrides both offload sections' nvme_path\n"
    "  --device-budget   cap on device memory (the host device's budget, or below the GPU's)\n"
    "  --fetch-unit U    layers with more parameters than U are fetched, gathered and released in\n"
    "                    pieces of whole consecutive groups (norm, q/k/v, attention out, norm, MLP in,\n"
    "                    MLP out): layer (whole layers), an element count (300M, 1.5e8), or auto\n"
    "                    (default: whole layers unless their working set exceeds the device; with\n"
    "                    --resume, the checkpoint's cut)\n"
    "  --activations A   keep (every layer's activations stay on the device from the forward to the\n"
    "                    backward), recompute (only each layer's input stays; the backward recomputes\n"
    "                    the rest: activation checkpointing), offload (recompute, with the layer inputs\n"
    "                    in pinned host memory: the config's activation_checkpointing.cpu_checkpointing)\n"
    "                    or auto (default: offload when the config asks; else keep when the L-1 more\n"
    "                    layers take at most half of the device and the working set still fits it,\n"
    "                    recompute when it fits with every layer input, offload when not). All give\n"
    "                    the same bits; when ranks differ, all recompute\n"
    "  --gpu-compute M   on a GPU with bf16 or fp16 enabled: 16 (default: the linear layers' matmuls in\n"
    "                    that type on tensor cores, fp32 accumulation; everything else fp32) or fp32 (the\n"
    "                    16-bit weights cast to fp32: within float rounding of the host device). The host\n"
    "                    device computes in fp32 either way\n"
    "  --weight-decay-on matrices (default: no weight decay on biases and LayerNorm weights, as the\n"
    "                    HF Trainer) or all (every tensor, as plain torch AdamW)\n"
    "  --exact-losses    also a line per step with its loss to 17 digits, for bit-for-bit comparisons\n"
    "  --metrics F       one JSON line per optimizer step (step, loss, lr, grad_norm, tokens, time parts)\n"
    "                    and per evaluation (step, eval_loss)\n"
    "  --report F        a self-contained HTML page of the run (loss, lr, time split and bytes per tier\n"
    "                    per step, config), rewritten at each evaluation and at the end\n" +
        std::string(kTrainerArgsUsage) +
        "\nA progress line every steps_per_print steps: loss, lr, grad norm, tokens/s, the step's time split\n"
        "into compute and waits (nvme, pcie/gather, comm, optimizer) and bytes moved per tier.\n"
        "Several GPUs or nodes: mpirun -np N zinf train ... (one rank per GPU).",
    Run});

}  // namespace
}  // namespace zinf::cli
