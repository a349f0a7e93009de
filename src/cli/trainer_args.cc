#include "cli/trainer_args.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "swap/checkpoint_dirs.h"

namespace zinf::cli {
namespace {

// A number flag within its key's range (`range`, as printed, for example
// "[0, 1)"); unset when absent.
StatusOr<std::optional<double>> Number(const Flags& flags, const char* name, const char* range, double min, double max,
                                       bool min_open = false, bool max_open = false) {
  if (!flags.Has(name)) return std::optional<double>();
  ZINF_ASSIGN_OR_RETURN(double v, flags.GetDouble(name, 0.0));
  if ((min_open ? v <= min : v < min) || (max_open ? v >= max : v > max)) {
    return Status::InvalidArgument(std::string("--") + name + ": expected a number in " + range + ", got " +
                                   *flags.Get(name));
  }
  return std::optional<double>(v);
}

StatusOr<std::optional<int64_t>> Count(const Flags& flags, const char* name, int64_t min) {
  if (!flags.Has(name)) return std::optional<int64_t>();
  ZINF_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(name, 0));
  if (v < min) {
    return Status::InvalidArgument(std::string("--") + name + ": expected an integer >= " + std::to_string(min) +
                                   ", got " + *flags.Get(name));
  }
  return std::optional<int64_t>(v);
}

}  // namespace

std::set<std::string> WithTrainerArgFlags(std::set<std::string> flags) {
  for (const char* f : {"lr", "weight-decay", "warmup-steps", "max-grad-norm", "adam-beta1", "adam-beta2",
                        "adam-epsilon", "micro-batch", "grad-accum"}) {
    flags.insert(f);
  }
  return flags;
}

StatusOr<Flags> TrainerFlags(const std::vector<std::string>& args, std::set<std::string> value_flags,
                             std::set<std::string> switches) {
  return Flags::Parse(args, WithTrainerArgFlags(std::move(value_flags)), std::move(switches));
}

StatusOr<TrainerArgs> TrainerArgsFromFlags(const Flags& flags) {
  constexpr double kMax = std::numeric_limits<double>::max();
  TrainerArgs a;
  // The ranges are those ParseConfig takes for each key, so a resolved
  // config prints as one that parses.
  ZINF_ASSIGN_OR_RETURN(a.lr, Number(flags, "lr", "[0, inf)", 0.0, kMax));
  ZINF_ASSIGN_OR_RETURN(a.weight_decay, Number(flags, "weight-decay", "[0, inf)", 0.0, kMax));
  ZINF_ASSIGN_OR_RETURN(a.max_grad_norm, Number(flags, "max-grad-norm", "[0, inf)", 0.0, kMax));
  ZINF_ASSIGN_OR_RETURN(a.adam_beta1, Number(flags, "adam-beta1", "[0, 1)", 0.0, 1.0, false, /*max_open=*/true));
  ZINF_ASSIGN_OR_RETURN(a.adam_beta2, Number(flags, "adam-beta2", "[0, 1)", 0.0, 1.0, false, /*max_open=*/true));
  ZINF_ASSIGN_OR_RETURN(a.adam_epsilon, Number(flags, "adam-epsilon", "(0, 1]", 0.0, 1.0, /*min_open=*/true));
  ZINF_ASSIGN_OR_RETURN(a.warmup_steps, Count(flags, "warmup-steps", 0));
  ZINF_ASSIGN_OR_RETURN(a.micro_batch, Count(flags, "micro-batch", 1));
  ZINF_ASSIGN_OR_RETURN(a.grad_accum, Count(flags, "grad-accum", 1));
  return a;
}

std::string FormatResolution(const AutoResolution& r) {
  return r.key + ": " + r.from + " -> " + r.value + " (" + r.rule + ")";
}

const char kTrainerArgsUsage[] =
    "  HF Trainer arguments: each fills its DeepSpeed key where the config says \"auto\" (else the\n"
    "  HF TrainingArguments default) or leaves it out; a different number in the config is an error.\n"
    "  --lr X              optimizer.params.lr and scheduler warmup_max_lr (default 5e-5)\n"
    "  --weight-decay X    optimizer.params.weight_decay (default 0)\n"
    "  --adam-beta1 X      optimizer.params.betas[0] (default 0.9)\n"
    "  --adam-beta2 X      optimizer.params.betas[1] (default 0.999)\n"
    "  --adam-epsilon X    optimizer.params.eps (default 1e-8)\n"
    "  --max-grad-norm X   gradient_clipping (default 1.0)\n"
    "  --warmup-steps N    scheduler.params.warmup_num_steps (default 0)\n"
    "  --micro-batch N     train_micro_batch_size_per_gpu (default 8)\n"
    "  --grad-accum N      gradient_accumulation_steps (default 1)\n";

std::string FetchUnitText(const Flags& flags, int rank, int world_size) {
  const std::string given = flags.GetOr("fetch-unit", "auto");
  const std::optional<std::string> resume = flags.Get("resume");
  if (given != "auto" || !resume) return given;
  auto point = swap::FindResumePoint(*resume, rank, world_size);
  if (!point.ok()) return given;
  auto md = swap::ReadCheckpointMetadata(point->Checkpoint(point->step));
  if (!md.ok()) return given;
  // Checkpoints from before the key have whole layers.
  auto it = md->find("trainer.fetch_unit");
  if (it == md->end() || it->second == "0") return "layer";
  return it->second;
}

StatusOr<model::ModelSource> ModelFromFlags(const Flags& flags, const std::string& value, int seq_len) {
  const bool from_config = flags.Has("from-config");
  if (from_config && !model::IsHfModelDir(value)) {
    return Status::InvalidArgument("--from-config needs a Hugging Face model folder (config.json): " + value);
  }
  StatusOr<model::ModelSource> source = model::ResolveModel(value, seq_len, from_config);
  if (source.ok()) return source;
  const Status& s = source.status();
  // A folder without weights: say so only where its config alone can start
  // (not a multimodal one, whose vision side needs weights).
  if (!from_config && s.code() == StatusCode::kNotFound && model::IsHfModelDir(value) && !model::HasHfWeights(value) &&
      model::OpenHfConfig(value).ok()) {
    return Status::NotFound(s.WithContext("--model").message() +
                            " (--from-config starts the architecture of its config.json from random weights)");
  }
  return s.WithContext("--model");
}

}  // namespace zinf::cli
