// zinf eval: the mean cross-entropy of a model's weights over a token file,
// every window in file order (llm.c's convention), forward only, through
// the same engine and kernels as zinf train. Under `mpirun -np N` every rank
// runs it (each scores its share of the windows; rank 0 prints), as a
// checkpoint of N ranks needs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "cli/mpi_scope.h"
#include "cli/trainer_args.h"
#include "core/file_lock.h"
#include "core/fs.h"
#include "core/units.h"
#include "device/device.h"
#include "model/fetch_layout.h"
#include "model/gpt.h"
#include "model/hf_checkpoint.h"
#include "model/plan.h"
#include "model/trainer.h"
#include "swap/swap_store.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

constexpr char kName[] = "eval";

int RunRank(const std::vector<std::string>& args, MpiScope& mpi) {
  auto flags = Flags::Parse(args,
                            {"model", "data", "batch", "seq-len", "config", "resume", "init-from", "device",
                             "device-budget", "threads", "seed", "nvme-path", "fetch-unit"},
                            {"quiet", "from-config"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  const auto data = flags->Get("data");
  if (!data || !flags->positionals().empty()) {
    return Fail(kName, Status::InvalidArgument("--data TOKENS.bin is required (see `zinf data encode`)"), 2);
  }
  if (flags->Has("resume") && flags->Has("init-from")) {
    return Fail(kName, Status::InvalidArgument("give --resume or --init-from, not both"), 2);
  }
  if (Status s = mpi.Start(); !s.ok()) return Fail(kName, s);
  const int rank = comm::MpiWorldRank();
  const int world = comm::MpiWorldSize();
  const std::string model_name = flags->GetOr("model", "small");
  auto budget = flags->GetInt("device-budget", 0);
  auto threads = flags->GetInt("threads", 0);
  auto seed = flags->GetInt("seed", 1234);
  auto seq_len = flags->GetInt("seq-len", 0);
  for (const auto* v : {&budget, &threads, &seed, &seq_len}) {
    if (!v->ok()) return Fail(kName, v->status(), 2);
  }
  if (*seq_len < 0 || *seq_len > (1 << 20)) {
    return Fail(kName, Status::InvalidArgument("--seq-len: expected a length in 1..2^20"), 2);
  }
  // As zinf train resolves it: a built-in, a JSON model config or a HF
  // folder (with its weights, or --from-config its config alone), at the
  // model's length unless --seq-len says.
  auto source = ModelFromFlags(*flags, model_name, static_cast<int>(*seq_len));
  if (!source.ok()) return Fail(kName, source.status(), 2);
  const model::GptConfig* model = &source->model;

  // The engine's config (where the weights live, their type), else
  // everything resident in fp32. The engine is forward-only: it holds the
  // working parameters alone, and reads only a checkpoint's master weights,
  // which load under any config.
  Config config;
  if (const auto path = flags->Get("config")) {
    auto loaded = LoadConfigFile(*path);
    if (!loaded.ok()) return Fail(kName, loaded.status(), 2);
    config = *loaded;
    if (const auto nvme = flags->Get("nvme-path")) {
      config.zero.offload_param.nvme_paths = {*nvme};
      config.zero.offload_optimizer.nvme_paths = {*nvme};
    }
  } else {
    config.zero.stage = 3;
    config.train_micro_batch_size_per_gpu = 4;
    // Each block gathered for its forward and let go: the device holds the
    // model once (its home) and a block, not a second gathered copy.
    config.zero.stage3_max_live_parameters = 0;
    config.zero.stage3_max_reuse_distance = 0;
  }
  auto batch = flags->GetInt("batch", config.train_micro_batch_size_per_gpu);
  if (!batch.ok()) return Fail(kName, batch.status(), 2);
  if (*batch < 1 || *batch > (1 << 20)) return Fail(kName, Status::InvalidArgument("--batch must be in 1..2^20"), 2);
  // The batch is --batch sequences, one micro-batch each: the config's own
  // batch keys give way.
  config.train_micro_batch_size_per_gpu = *batch;
  config.gradient_accumulation_steps = 1;
  config.batch_given[0] = false;
  config.batch_given[1] = config.batch_given[2] = true;
  AutoContext ctx;
  ctx.world_size = world;
  ctx.hidden_size = model->n_embd;
  ctx.total_steps = 1;
  if (Status s = ResolveAuto(config, ctx); !s.ok()) return Fail(kName, s, 2);

  // A swap path in use by a zinf train would have its files replaced as
  // another run's: hold each path's lock, as zinf train does (the
  // parameters' only: a forward-only engine writes no optimizer state).
  std::vector<FileLock> swap_dir_locks;
  if (config.zero.offload_param.device == OffloadDevice::kNvme) {
    for (const std::string& dir : config.zero.offload_param.nvme_paths) {
      if (std::any_of(swap_dir_locks.begin(), swap_dir_locks.end(),
                      [&](const FileLock& l) { return ParentPath(l.path()) == dir; })) {
        continue;
      }
      auto lock = swap::LockSwapDirectory(dir, rank);
      if (!lock.ok()) return Fail(kName, lock.status());
      swap_dir_locks.push_back(std::move(*lock));
    }
  }

  auto choice = ParseDeviceChoice(flags->GetOr("device", "auto"));
  if (!choice.ok()) return Fail(kName, choice.status(), 2);
  DeviceOptions dopt;
  dopt.choice = *choice;
  dopt.host_budget_bytes = static_cast<size_t>(*budget);
  dopt.cuda_budget_bytes = static_cast<size_t>(*budget);
  dopt.cuda_ordinal = CudaDeviceCount() > 0 ? rank % CudaDeviceCount() : 0;
  auto device = CreateDevice(dopt);
  if (!device.ok()) return Fail(kName, device.status());

  model::TrainerOptions topt;
  topt.model = *model;
  topt.initial_weights = source->InitialWeights();
  topt.data_path = *data;
  topt.eval_fraction = 0.0;  // every token is scored
  topt.data_order = model::DataOrder::kSequential;
  topt.seed = static_cast<uint64_t>(*seed);
  topt.hooks.device = device->get();
  topt.engine.optimizer_threads = static_cast<int>(*threads);
  topt.engine.run_id = "eval";
  topt.engine.forward_only = true;
  // As zinf train's auto on the same device and batch, or the cut of the
  // checkpoint in --resume.
  auto fetch_unit =
      model::FetchUnitForDevice(FetchUnitText(*flags, rank, world), *model, config, **device, topt.gpu_compute16);
  if (!fetch_unit.ok()) return Fail(kName, fetch_unit.status(), 2);
  topt.fetch_unit = *fetch_unit;
  // The layer inputs where train's auto puts them (pinned host memory with
  // the config's cpu_checkpointing or when the device cannot hold them);
  // never every layer's activations: there is no backward.
  auto activations =
      model::LayerActivationsForDevice("auto", *model, config, **device, topt.gpu_compute16, *fetch_unit);
  if (!activations.ok()) return Fail(kName, activations.status(), 2);
  topt.activations =
      *activations == model::LayerActivations::kKeep ? model::LayerActivations::kRecompute : *activations;
  auto trainer = model::Trainer::Create(config, topt);
  if (!trainer.ok()) return Fail(kName, source->HintSeqLen(trainer.status()));
  std::string weights = topt.initial_weights ? "its weights" : "initial weights (seed " + std::to_string(*seed) + ")";
  if (const auto ckpt = flags->Get("resume")) {
    if (Status s = (*trainer)->LoadWeights(*ckpt); !s.ok()) return Fail(kName, s.WithContext("--resume"));
    weights = "checkpoint " + *ckpt;
  } else if (const auto file = flags->Get("init-from")) {
    if (Status s = (*trainer)->InitFromSafetensors(*file); !s.ok()) return Fail(kName, s.WithContext("--init-from"));
    weights = *file;
  }
  FILE* out = rank == 0 && !flags->Has("quiet") ? stderr : nullptr;
  if (out) {
    std::fprintf(out, "zinf eval: model %s (%s parameters), %s, device %s\n", model_name.c_str(),
                 FormatCount(model->NumParameters()).c_str(), weights.c_str(), (*device)->name().c_str());
  }
  auto result = (*trainer)->EvaluateInOrder();
  if (!result.ok()) return Fail(kName, source->HintSeqLen(result.status()));
  if (out) {
    std::fprintf(out, "zinf eval: %s: %lld windows of %lld x %d tokens, %lld tokens scored\n", data->c_str(),
                 static_cast<long long>(result->windows), static_cast<long long>(*batch), model->seq_len,
                 static_cast<long long>(result->tokens));
  }
  if (rank != 0) return 0;
  std::printf("loss %.9g\n", result->loss);
  std::printf("perplexity %.9g\n", std::exp(result->loss));
  return 0;
}

int Run(const std::vector<std::string>& args) {
  return RunOnEveryRank([&](MpiScope& mpi) { return RunRank(args, mpi); });
}

ZINF_COMMAND(Command{
    kName, "mean cross-entropy and perplexity of a model over a token file, in order",
    "eval --data TOKENS [--model M] [--batch B] [--seq-len T] [--resume CKPT | --init-from FILE.safetensors]\n"
    "               [--config C [--nvme-path P]] [--device auto|cuda|host] [--device-budget SIZE] [--threads N]\n"
    "               [--seed N] [--fetch-unit auto|layer|ELEMS] [--from-config] [--quiet]\n\n"
    "  Scores every window of the token file in order, as llm.c evaluates: a batch is B*T+1\n"
    "  consecutive tokens, inputs the first B*T, targets the same shifted by one, the next batch\n"
    "  starting B*T later; tokens after the last whole batch are not scored. Prints `loss X`\n"
    "  (the mean cross-entropy in nats, 9 significant digits) and `perplexity exp(X)` on stdout.\n\n"
    "  --model M         as zinf train takes it: a built-in, a JSON model config or a Hugging Face\n"
    "                    model folder (its weights) (default small)\n"
    "  --from-config     with a Hugging Face folder: its config.json alone (the weights random, or\n"
    "                    --resume's: a checkpoint of a zinf train --from-config run)\n"
    "  --data TOKENS     a token file (zinf data encode); every id must be below the vocabulary\n"
    "  --batch B         sequences per batch (default 4, or the config's micro-batch)\n"
    "  --seq-len T       sequence length (default: the model's context length)\n"
    "  --resume CKPT     the weights of a zinf train checkpoint (a save dir or a step directory),\n"
    "                    its fp32 master weights read alone, under any --config\n"
    "  --init-from F     the weights of a safetensors file zinf train --export wrote\n"
    "                    (neither: the seeded initial weights, for a baseline)\n"
    "  --config C        the engine's DeepSpeed JSON (default: fp32 weights on the device, each block\n"
    "                    gathered for its forward and let go): where the weights\n"
    "                    live (offload_param) and their type; no optimizer state is held\n"
    "  --nvme-path P     overrides both offload sections' nvme_path, as for zinf train\n"
    "  --fetch-unit U    as zinf train's (layers fetched in pieces); a checkpoint loads only under its\n"
    "                    training run's cut, which auto (the default) takes with --resume\n\n"
    "  Under mpirun -np N every rank scores its share of each batch of N windows (a last partial one\n"
    "  is not scored) and rank 0 prints; a checkpoint of N ranks is evaluated with N ranks.",
    Run});

}  // namespace
}  // namespace zinf::cli
