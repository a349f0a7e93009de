// zinf config-check FILE: the resolved config, or every error in it; with
// the model known (--model, or --params for a derived GPT shape), what every
// buffer costs per rank (zero3::BufferPlan, plus the reference GPT's own
// device buffers at stage 3).
#include <cstdio>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/offload_buffers.h"
#include "cli/trainer_args.h"
#include "core/units.h"
#include "model/plan.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

constexpr const char* kName = "config-check";

// What a rank allocates for `config` training `choice.model` on `world`
// ranks: the engine's windows and, at stage 3, the reference GPT's
// activations and scratch (model::EstimateOption). Appends its lines.
StatusOr<zero3::BufferPlan> PlanLines(const Config& config, const ModelChoice& choice, int world, bool cuda,
                                      int64_t fetch_unit, model::LayerActivations activations,
                                      std::vector<std::string>& lines) {
  const std::string title = "per rank for model " + choice.description + " (" +
                            FormatCount(choice.model.NumParameters()) + " parameters), " + std::to_string(world) +
                            " rank(s), " + (cuda ? "GPU" : "host device");
  if (config.zero.stage == 3) {
    model::PlanInputs in;
    in.model = choice.model;
    in.world_size = world;
    in.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
    in.grad_accum = static_cast<int>(config.gradient_accumulation_steps);
    in.cuda = cuda;
    in.fetch_unit = fetch_unit;
    in.activations = activations;
    in.activations_auto = false;
    ZINF_ASSIGN_OR_RETURN(model::PlanOption o, model::EstimateOption(in, config));
    lines.push_back("fetch: " + o.fetch_layout + " (largest engine block " + FormatCount(o.max_piece_elems) +
                    " parameters)");
    AppendBufferItems("buffers " + title + ", micro-batch " + std::to_string(in.micro_batch), o.items, lines);
    return o.buffers;
  }
  const model::FetchLayout layout = model::FetchLayout::Create(choice.model, fetch_unit);
  const std::vector<BlockSpec>& specs = layout.specs();
  lines.push_back("fetch: " + layout.Describe());
  ZINF_ASSIGN_OR_RETURN(
      zero3::BufferPlan plan,
      zero3::MakeBufferPlan(config, specs, world, cuda ? DeviceKind::kCuda : DeviceKind::kHost, ElementType::kF32,
                            model::GptMaxHeldElems(choice.model, specs, config, world)));
  AppendBufferItems("engine buffers " + title, plan.Items(), lines);
  return plan;
}

// The model --model or --params names, if any.
StatusOr<std::optional<ModelChoice>> ModelOf(const Flags& flags, int64_t params) {
  if (const auto m = flags.Get("model")) {
    ZINF_ASSIGN_OR_RETURN(ModelChoice c, ModelFromFlag("--model", *m, 0, 50257));
    return std::optional<ModelChoice>(std::move(c));
  }
  if (params <= 0) return std::optional<ModelChoice>();
  auto g = model::GptConfigForParameterCount(params, 2048, 50257);
  if (!g.ok()) return std::optional<ModelChoice>();  // too small or large to shape: totals per parameter only
  return std::optional<ModelChoice>(ModelChoice{*g, FormatCount(params) +
                                                        " (derived GPT shape: " + std::to_string(g->n_layer) +
                                                        " layers x " + std::to_string(g->n_embd) + ", seq_len 2048)"});
}

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, WithTrainerArgFlags({"world-size", "hidden-size", "steps", "params", "model",
                                                       "device", "fetch-unit", "activations"}));
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  if (flags->positionals().size() != 1) return Fail(kName, Status::InvalidArgument("expected one config file"), 2);
  const std::string& path = flags->positionals()[0];
  auto config = LoadConfigFile(path);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return 1;
  }
  for (const std::string& key : config->ignored_keys) {
    const std::string_view why = IgnoredKeyReason(key);
    std::fprintf(stderr, "note: %s is a DeepSpeed key that zinf does not act on%s%.*s%s; ignored\n", key.c_str(),
                 why.empty() ? "" : " (", static_cast<int>(why.size()), why.data(), why.empty() ? "" : ")");
  }
  AutoContext ctx;
  auto world = flags->GetInt("world-size", 1);
  auto hidden = flags->GetInt("hidden-size", 0);
  auto steps = flags->GetInt("steps", 0);
  auto params = flags->GetInt("params", 0);
  for (const auto* s : {&world, &hidden, &steps, &params}) {
    if (!s->ok()) return Fail(kName, s->status(), 2);
  }
  if (*world < 1 || *world > (1 << 20)) {
    return Fail(kName,
                Status::InvalidArgument("--world-size: expected 1..1048576 ranks, got " + std::to_string(*world)), 2);
  }
  const std::string device = flags->GetOr("device", "gpu");
  if (device != "gpu" && device != "host") {
    return Fail(kName, Status::InvalidArgument("--device: expected gpu or host, got \"" + device + "\""), 2);
  }
  // No device size here: auto is whole layers (train's auto cuts only what
  // its device cannot hold).
  bool fetch_auto = false;
  auto fetch_unit = model::ParseFetchUnit(flags->GetOr("fetch-unit", "auto"), &fetch_auto);
  if (!fetch_unit.ok()) return Fail(kName, fetch_unit.status(), 2);
  bool activations_auto = false;  // auto: recompute here, for the same reason
  auto activations = model::ParseLayerActivations(flags->GetOr("activations", "auto"), &activations_auto);
  if (!activations.ok()) return Fail(kName, activations.status(), 2);
  auto model = ModelOf(*flags, *params);
  if (!model.ok()) return Fail(kName, model.status(), 2);
  auto trainer_args = TrainerArgsFromFlags(*flags);
  if (!trainer_args.ok()) return Fail(kName, trainer_args.status(), 2);
  ctx.trainer = *trainer_args;
  ctx.world_size = static_cast<int>(*world);
  if (*hidden > 0) {
    ctx.hidden_size = *hidden;
  } else if (*model && flags->Has("model")) {
    ctx.hidden_size = (*model)->model.n_embd;  // as the HF Trainer reads it from the model's config
  }
  if (*steps > 0) ctx.total_steps = *steps;
  Config resolved = *config;
  std::vector<AutoResolution> resolutions;
  Status st = ResolveAuto(resolved, ctx, &resolutions);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  for (const AutoResolution& r : resolutions) std::fprintf(stderr, "%s\n", FormatResolution(r).c_str());
  std::vector<std::string> lines, plan_lines;
  std::optional<zero3::BufferPlan> plan;
  std::optional<int64_t> count = *params > 0 ? std::optional<int64_t>(*params) : std::nullopt;
  if (*model) {
    // auto with the config's cpu_checkpointing: as zinf train takes it.
    const model::LayerActivations acts = activations_auto && resolved.activation_checkpointing.cpu_checkpointing
                                             ? model::LayerActivations::kOffload
                                             : *activations;
    auto p = PlanLines(resolved, **model, ctx.world_size, device == "gpu", *fetch_unit, acts, plan_lines);
    if (p.ok()) {
      plan = std::move(*p);
    } else if (flags->Has("model")) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), p.status().message().c_str());
      return 1;
    } else {
      // A shape guessed from --params is not the user's model: its refusal is a note.
      plan_lines.push_back("no buffer plan for the derived shape " + (*model)->description + ": " +
                           p.status().message());
    }
    if (!count) count = (*model)->model.NumParameters();
  }
  ExplainOffloadBuffers(resolved, plan ? &*plan : nullptr, count, ctx.world_size, lines);
  lines.insert(lines.end(), plan_lines.begin(), plan_lines.end());
  for (const std::string& line : lines) std::fprintf(stderr, "note: %s\n", line.c_str());
  std::printf("%s\n", ConfigToJson(resolved).c_str());
  std::fprintf(stderr, "%s: OK\n", path.c_str());
  return 0;
}

ZINF_COMMAND({"config-check", "parse a DeepSpeed-style config; print it resolved or list its errors",
              "config-check FILE [--world-size N] [--hidden-size H] [--steps N] [--params N]\n"
              "             [--model M] [--device gpu|host] [--fetch-unit auto|layer|ELEMS]\n"
              "             [--activations auto|keep|recompute|offload]\n"
              "             [HF Trainer arguments: --lr X, ...]\n"
              "  Prints the config with every default filled in, or every error (exit 1), and explains\n"
              "  what the offload buffers cost in pinned RAM. Buffers fewer or smaller than the optimizer\n"
              "  pipeline or a parameter shard need are fitted as DeepSpeed sizes them (a \"fitted:\" note);\n"
              "  parameter buffers smaller than the prefetch window limit prefetching (a note).\n"
              "  --world-size, --hidden-size (else --model's width) and --steps resolve batch keys and \"auto\"\n"
              "  values;\n"
              "  --params (the model's parameter count) turns per-parameter costs into totals.\n"
              "  --model (a built-in, a model JSON or a count like 7B; --params alone stands for a GPT of\n"
              "  that size) lists every buffer a rank allocates, per tier: the engine's windows (parameter\n"
              "  home, swapper and optimizer pools, gradient buffers, gathered blocks under\n"
              "  stage3_max_live_parameters, checkpoint buffers, swap files) and, at stage 3, the reference\n"
              "  GPT's activations and scratch at the config's micro-batch; --device host leaves out the\n"
              "  CUDA allowance. --fetch-unit: layers above this many parameters are engine blocks in pieces\n"
              "  (zinf train's flag; auto is whole layers here, with no device size to go by).\n"
              "  --activations: whether the activations counted are every layer's (keep), one layer's\n"
              "  (recompute) or one layer's with the layer inputs in pinned RAM (offload; zinf train's flag;\n"
              "  auto is recompute here, for the same reason, or offload with cpu_checkpointing).\n"
              "  Each value worked out is printed as `key: auto -> value (rule)`.\n" +
                  std::string(kTrainerArgsUsage),
              Run});

}  // namespace
}  // namespace zinf::cli
