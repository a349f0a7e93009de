// zinf plan: which offload config fits a machine, and how fast it would
// train. The estimates are model/plan.h's; this file reads the flags,
// measures component speeds when asked (--measure), prints the table or
// JSON, and writes the chosen config (checked with ParseConfig and the
// offload-buffer checks of `zinf config-check` before it is written).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio/nvme_check.h"
#include "cli/command.h"
#include "cli/offload_buffers.h"
#include "core/fs.h"
#include "core/progress.h"
#include "core/units.h"
#include "device/device.h"
#include "model/gpt.h"
#include "model/hf_checkpoint.h"
#include "model/ops.h"
#include "model/plan.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

using model::PlanInputs;
using model::PlanOption;
using nlohmann::json;

constexpr const char* kName = "plan";
constexpr double kDefaultGpuTflops = 400.0;  // H100 SXM bf16 dense, sustained by cuBLAS GEMMs
constexpr double kDefaultMfu = 0.5;
constexpr double kDefaultHostGflops = 50.0;  // host device without --measure

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU Adam on 4M fp32 parameters (112 MB of state and gradients: beyond the
// caches), all cores, median of 3 timed steps after a warm-up.
StatusOr<double> MeasureAdam() {
  constexpr int64_t n = int64_t{4} << 20;
  ZINF_ASSIGN_OR_RETURN(auto pool,
                        optim::ThreadPool::Create({.num_threads = 0, .bind_threads = false, .name = "zinf-plan"}));
  ZINF_ASSIGN_OR_RETURN(optim::Isa isa, optim::DefaultIsa());
  OptimizerConfig config;
  ZINF_ASSIGN_OR_RETURN(optim::CpuAdam adam, optim::CpuAdam::Create(config, pool.get(), isa));
  std::vector<float> p(n, 0.01f), m(n, 0.0f), v(n, 0.0f), g(n, 0.001f);
  optim::AdamSpan span{.params = p.data(), .exp_avg = m.data(), .exp_avg_sq = v.data(), .grads = g.data(), .n = n};
  std::vector<double> times;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ZINF_RETURN_IF_ERROR(adam.Update(span, {.step = i + 1, .lr = 1e-4}));
    if (i > 0) times.push_back(Seconds(t0));
  }
  return static_cast<double>(n) / Median(times);
}

// The host device's fp32 matmul (the kernel the model runs there), 2 N C OC
// FLOPs a call.
StatusOr<double> MeasureHostFlops() {
  std::unique_ptr<Device> device = CreateHostDevice(0);
  ZINF_ASSIGN_OR_RETURN(auto ops, model::CreateOps(*device));
  const int64_t N = 512;
  const int C = 768, OC = 768;
  std::vector<float> in(static_cast<size_t>(N * C), 0.5f), w(static_cast<size_t>(OC) * C, 0.01f), b(OC, 0.0f),
      out(static_cast<size_t>(N * OC));
  std::vector<double> times;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ops->MatmulForward(out.data(), in.data(), w.data(), b.data(), N, C, OC);
    ZINF_RETURN_IF_ERROR(ops->Synchronize());
    if (i > 0) times.push_back(Seconds(t0));
  }
  return 2.0 * static_cast<double>(N) * C * OC / Median(times);
}

// The path itself, or its nearest existing ancestor (a path plan is told
// about may not be created yet).
std::string ExistingAncestor(std::string path) {
  struct stat st {};
  while (!path.empty() && ::stat(path.c_str(), &st) != 0) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return path.empty() ? "." : path;
}

// Free bytes over the distinct filesystems of `paths`.
StatusOr<int64_t> NvmeFreeBytes(const std::vector<std::string>& paths, std::vector<std::string>& notes) {
  std::set<dev_t> seen;
  int64_t total = 0;
  for (const std::string& p : paths) {
    const std::string at = ExistingAncestor(p);
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", at);
    if (!seen.insert(st.st_dev).second) {
      notes.push_back("--nvme " + p + " shares a filesystem with an earlier path; its space is counted once");
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(int64_t free, FreeBytes(at));
    total += free;
  }
  return total;
}

std::string Gb(int64_t bytes) { return FormatBytes(bytes); }

// A routed model's experts and the parameters a token uses.
std::string Experts(const model::GptConfig& m) {
  if (!m.moe()) return "";
  const std::string routed = m.dense_layers.empty() ? "" : " in " + std::to_string(m.routed_layers()) + " layers";
  return ", " + std::to_string(m.experts_per_token) + " of " + std::to_string(m.n_experts) + " experts a token" +
         (m.shared_expert() ? " and a shared one" : "") + routed + ": " + FormatCount(m.ActiveParameters()) + " active";
}

std::string Shape(const model::GptConfig& m) {
  return std::to_string(m.n_layer) + " layers, n_embd " + std::to_string(m.n_embd) + ", " + std::to_string(m.n_head) +
         " heads" + model::AttentionNote(m) + ", seq_len " + std::to_string(m.seq_len) + ", vocab " +
         std::to_string(m.vocab_size) + (m.tied_embeddings ? ", tied head" : ", untied head") + Experts(m);
}

json OptionJson(const PlanOption& o) {
  json items = json::array();
  for (const model::PlanItem& it : o.items) {
    items.push_back({{"tier", model::TierName(it.tier)},
                     {"what", it.what},
                     {"bytes_per_rank", it.bytes},
                     {"transient", it.transient}});
  }
  return {{"offload_param", OffloadDeviceName(o.param)},
          {"offload_optimizer", OffloadDeviceName(o.optimizer)},
          {"gpu_bytes_per_rank", o.gpu_bytes},
          {"gpu_resident_bytes_per_rank", o.gpu_resident_bytes},
          {"gpu_gathered_bytes_per_rank", o.gpu_gathered_bytes},
          {"fetch_unit", o.fetch_unit},
          {"fetch_layout", o.fetch_layout},
          {"max_engine_block_params", o.max_piece_elems},
          {"pinned_ram_bytes", o.pinned_bytes},
          {"pageable_ram_bytes", o.pageable_bytes},
          {"nvme_bytes", o.nvme_bytes},
          {"model_states",
           {{"gpu_bytes", o.state_gpu_bytes},
            {"cpu_bytes", o.state_cpu_bytes},
            {"nvme_bytes", o.state_nvme_bytes},
            {"fit", o.state_fits}}},
          {"fits", {{"gpu", o.fits_gpu}, {"ram", o.fits_cpu}, {"nvme", o.fits_nvme}, {"all", o.fits()}}},
          {"overshoot", o.overshoot},
          {"shortfalls", o.shortfalls},
          {"step",
           {{"seconds", o.step_s},
            {"tokens_per_s", o.tokens_per_s},
            {"bound_by", o.bound_by},
            {"compute_s", o.compute_s},
            {"param_nvme_s", o.param_nvme_s},
            {"pcie_s", o.pcie_s},
            {"adam_s", o.adam_s},
            {"optimizer_nvme_s", o.optimizer_nvme_s},
            {"write_home_s", o.write_home_s},
            {"update_window_s", o.update_window_s},
            {"nvme_read_bytes", o.nvme_read_bytes},
            {"nvme_write_bytes", o.nvme_write_bytes},
            {"h2d_bytes_per_rank", o.h2d_bytes},
            {"d2h_bytes_per_rank", o.d2h_bytes}}},
          {"items", items}};
}

// Everything the flags say, and what was derived from them.
struct PlanRun {
  PlanInputs in;
  std::string model_arg, model_desc, device, nvme_source = "none", fetch_unit_arg = "auto", activations_arg = "auto";
  bool hf_default_seq_len = false;  // a Llama-family HF folder at its max_position_embeddings
  std::string gpu_src, adam_src, nvme_src, pcie_src;
  std::vector<std::string> notes;
};

// The model, the machine and the batch from the flags. Returns the exit code
// of a failure (reported), or nothing.
std::optional<int> ParseInputs(const Flags& flags, PlanRun& run) {
  const auto model_arg = flags.Get("model");
  if (!model_arg) {
    return Fail(kName,
                Status::InvalidArgument("--model is required (a built-in name, a JSON file or a count like 100B)"), 2);
  }
  run.model_arg = *model_arg;
  auto gpu_mem = flags.GetInt("gpu-mem", 0);
  auto cpu_mem = flags.GetInt("cpu-mem", 0);
  auto nvme_bytes = flags.GetInt("nvme-bytes", -1);
  auto gpus = flags.GetInt("gpus", 1);
  auto micro = flags.GetInt("micro-batch", 1);
  auto seq = flags.GetInt("seq-len", 0);
  auto vocab = flags.GetInt("vocab", 50257);
  auto accum = flags.GetInt("grad-accum", 1);
  auto ckpt = flags.GetInt("checkpoints", 0);
  for (const auto* s : {&gpu_mem, &cpu_mem, &nvme_bytes, &gpus, &micro, &seq, &vocab, &accum, &ckpt}) {
    if (!s->ok()) return Fail(kName, s->status(), 2);
  }
  if (*gpus < 1 || *gpus > 1024 || *micro < 1 || *accum < 1 || *ckpt < 0 || *seq < 0 || *seq > (1 << 20) ||
      *vocab < 1 || *vocab > (1 << 24)) {
    return Fail(kName,
                Status::InvalidArgument("--gpus, --micro-batch and --grad-accum must be >= 1, --checkpoints >= 0, "
                                        "--seq-len and --vocab in range"),
                2);
  }
  if (*gpu_mem <= 0) return Fail(kName, Status::InvalidArgument("--gpu-mem is required (per GPU, e.g. 24G)"), 2);
  if (*cpu_mem <= 0)
    return Fail(kName, Status::InvalidArgument("--cpu-mem is required (the node's RAM, e.g. 256G)"), 2);
  run.device = flags.GetOr("device", "gpu");
  if (run.device != "gpu" && run.device != "host") {
    return Fail(kName, Status::InvalidArgument("--device: expected gpu or host, got \"" + run.device + "\""), 2);
  }
  auto model = ModelFromFlag("--model", *model_arg, static_cast<int>(*seq), static_cast<int>(*vocab));
  if (!model.ok()) return Fail(kName, model.status(), 2);
  PlanInputs& in = run.in;
  in.model = model->model;
  run.model_desc = model->description;
  run.hf_default_seq_len = *seq == 0 && model->model.llama() && model::IsHfModelDir(*model_arg);
  in.world_size = static_cast<int>(*gpus);
  in.micro_batch = static_cast<int>(*micro);
  in.grad_accum = static_cast<int>(*accum);
  in.cuda = run.device == "gpu";
  const StatusOr<bool> compute16 = model::ParseGpuCompute16(flags.GetOr("gpu-compute", "16"));
  if (!compute16.ok()) return Fail(kName, compute16.status(), 2);
  in.compute16 = *compute16;
  in.gpu_bytes = *gpu_mem;
  in.cpu_bytes = *cpu_mem;
  in.nvme_paths = flags.GetAll("nvme");
  in.checkpoints = static_cast<int>(*ckpt);
  run.fetch_unit_arg = flags.GetOr("fetch-unit", "auto");
  auto unit = model::ParseFetchUnit(run.fetch_unit_arg, &in.fetch_unit_auto);
  if (!unit.ok()) return Fail(kName, unit.status(), 2);
  in.fetch_unit = *unit;
  run.activations_arg = flags.GetOr("activations", "auto");
  auto activations = model::ParseLayerActivations(run.activations_arg, &in.activations_auto);
  if (!activations.ok()) return Fail(kName, activations.status(), 2);
  in.activations = *activations;
  if (*nvme_bytes >= 0) {
    in.nvme_bytes = *nvme_bytes;
    run.nvme_source = "--nvme-bytes";
  } else if (!in.nvme_paths.empty()) {
    auto free = NvmeFreeBytes(in.nvme_paths, run.notes);
    if (!free.ok()) return Fail(kName, free.status().WithContext("--nvme"));
    in.nvme_bytes = *free;
    run.nvme_source = "free space of --nvme";
  }
  return std::nullopt;
}

// Speeds: given, measured (--measure), or assumed; each says which.
std::optional<int> SetSpeeds(const Flags& flags, PlanRun& run) {
  auto tflops = flags.GetDouble("gpu-tflops", kDefaultGpuTflops);
  auto mfu = flags.GetDouble("mfu", kDefaultMfu);
  auto adam_rate = flags.GetDouble("adam-gparams", 0);
  auto nvme_gbps = flags.GetDouble("nvme-gbps", 0);
  auto nvme_read = flags.GetDouble("nvme-read-gbps", 0);
  auto nvme_write = flags.GetDouble("nvme-write-gbps", 0);
  auto pcie = flags.GetDouble("pcie-gbps", 25.0);
  for (const auto* s : {&tflops, &mfu, &adam_rate, &nvme_gbps, &nvme_read, &nvme_write, &pcie}) {
    if (!s->ok()) return Fail(kName, s->status(), 2);
  }
  if (*tflops <= 0 || *mfu <= 0 || *mfu > 1 || *adam_rate < 0 || *nvme_gbps < 0 || *nvme_read < 0 || *nvme_write < 0 ||
      *pcie <= 0) {
    return Fail(kName,
                Status::InvalidArgument("--gpu-tflops, --pcie-gbps must be > 0, --mfu in (0, 1], "
                                        "rates not negative"),
                2);
  }
  const bool measure = flags.Has("measure");
  const PlanInputs& in = run.in;
  model::PlanSpeeds& sp = run.in.speeds;
  // --measure takes seconds per item: a bar (or lines) with ETA on stderr.
  const int to_measure =
      !measure ? 0
               : int{!in.cuda && !flags.Has("gpu-tflops")} + int{*adam_rate <= 0} +
                     int{*nvme_gbps <= 0 && *nvme_read <= 0 && *nvme_write <= 0 && !in.nvme_paths.empty()};
  ProgressMeter::Options po;
  po.out = to_measure > 0 ? stderr : nullptr;
  po.label = "plan: measuring";
  po.unit = ProgressMeter::Unit::kCount;
  po.count_name = "speeds";
  ProgressMeter meter(po);
  int measured = 0;
  auto measured_one = [&] { meter.Update(++measured, to_measure); };
  run.pcie_src = flags.Has("pcie-gbps") ? "given" : "assumed";
  sp.pcie_gbps = *pcie;
  if (in.cuda) {
    sp.gpu_flops = *tflops * 1e12 * *mfu;
    run.gpu_src = FormatCount(static_cast<int64_t>(*tflops)) + " TFLOP/s x mfu " + std::to_string(*mfu).substr(0, 4) +
                  (flags.Has("gpu-tflops") ? ", given" : ", assumed");
  } else if (flags.Has("gpu-tflops")) {
    sp.gpu_flops = *tflops * 1e12 * *mfu;
    run.gpu_src = "given";
  } else if (measure) {
    auto f = MeasureHostFlops();
    if (!f.ok()) return Fail(kName, f.status().WithContext("measuring the host matmul"));
    sp.gpu_flops = *f;
    run.gpu_src = "host fp32 matmul, measured";
    measured_one();
  } else {
    sp.gpu_flops = kDefaultHostGflops * 1e9;
    run.gpu_src = "host, assumed";
  }
  if (*adam_rate > 0) {
    sp.adam_params_per_s = *adam_rate * 1e9;
    run.adam_src = "given";
  } else if (measure) {
    auto r = MeasureAdam();
    if (!r.ok()) return Fail(kName, r.status().WithContext("measuring CPU Adam"));
    sp.adam_params_per_s = *r;
    run.adam_src = "measured, " + std::to_string(optim::ThreadPool::NumCores()) + " cores";
    measured_one();
  } else {
    run.adam_src = "assumed";
  }
  if (*nvme_gbps > 0) sp.nvme_read_gbps = sp.nvme_write_gbps = *nvme_gbps;
  if (*nvme_read > 0) sp.nvme_read_gbps = *nvme_read;
  if (*nvme_write > 0) sp.nvme_write_gbps = *nvme_write;
  run.nvme_src = (*nvme_gbps > 0 || *nvme_read > 0 || *nvme_write > 0) ? "given" : "assumed";
  if (measure && run.nvme_src == "assumed" && !in.nvme_paths.empty()) {
    aio::NvmeCheckOptions co;
    co.test_bytes = int64_t{256} << 20;
    aio::NvmeCheckReport r = aio::CheckNvmePath(in.nvme_paths[0], co);
    measured_one();
    if (r.read_gbps > 0 && r.write_gbps > 0) {
      sp.nvme_read_gbps = r.read_gbps;
      sp.nvme_write_gbps = r.write_gbps;
      run.nvme_src = "measured on " + in.nvme_paths[0] + " (" + r.engine + ")";
    } else {
      std::string why;
      for (const std::string& p : r.problems) why += (why.empty() ? "" : "; ") + p;
      run.notes.push_back("could not measure --nvme " + in.nvme_paths[0] + " (" + why + "); NVMe speed assumed");
    }
  }
  return std::nullopt;
}

// The chosen config as `zinf plan --write-config` writes it, parsed and
// resolved as `zinf config-check` would before it goes out (its buffer plan,
// chosen.buffers, was made from it). Sets `text` when written.
Status WriteConfig(const PlanRun& run, const model::Plan& plan, const std::string& out, std::string& text) {
  const PlanOption& chosen = plan.options[static_cast<size_t>(plan.chosen)];
  if (!plan.chosen_fits) {
    return Status::FailedPrecondition("--write-config: no offload choice fits this machine; nothing written");
  }
  if (chosen.config.offloads_to_nvme() && run.in.nvme_paths.empty()) {
    return Status::InvalidArgument("--write-config: the chosen config offloads to NVMe; give --nvme PATH");
  }
  text = ConfigChangesToJson(chosen.config) + "\n";
  auto parsed = ParseConfig(text, out);
  Status st = parsed.status();
  AutoContext ctx;
  ctx.world_size = run.in.world_size;
  if (st.ok()) st = ResolveAuto(*parsed, ctx);
  if (st.ok()) st = WriteFileAtomic(out, text);
  return st.WithContext("--write-config " + out);
}

void PrintJson(const PlanRun& run, const model::Plan& plan, const std::string& config_text,
               const Status& config_status) {
  const PlanInputs& in = run.in;
  const model::PlanSpeeds& sp = in.speeds;
  const PlanOption& chosen = plan.options[static_cast<size_t>(plan.chosen)];
  json options = json::array();
  for (const PlanOption& o : plan.options) options.push_back(OptionJson(o));
  json j = {{"model",
             {{"name", run.model_arg},
              {"parameters", in.model.NumParameters()},
              {"n_layer", in.model.n_layer},
              {"n_embd", in.model.n_embd},
              {"n_head", in.model.n_head},
              {"seq_len", in.model.seq_len},
              {"vocab_size", in.model.vocab_size}}},
            {"machine",
             {{"gpus", in.world_size},
              {"gpu_bytes", in.gpu_bytes},
              {"cpu_bytes", in.cpu_bytes},
              {"nvme_bytes", in.nvme_bytes},
              {"nvme_paths", in.nvme_paths},
              {"device", run.device}}},
            {"batch", {{"micro_batch", in.micro_batch}, {"grad_accum", in.grad_accum}}},
            {"fetch", {{"fetch_unit_flag", run.fetch_unit_arg}, {"fetch_layout", chosen.fetch_layout}}},
            {"activations",
             {{"activations_flag", run.activations_arg},
              {"layer_activations", model::LayerActivationsName(chosen.activations)}}},
            {"speeds",
             {{"gpu_flops", sp.gpu_flops},
              {"gpu_source", run.gpu_src},
              {"adam_params_per_s", sp.adam_params_per_s},
              {"adam_source", run.adam_src},
              {"nvme_read_gbps", sp.nvme_read_gbps},
              {"nvme_write_gbps", sp.nvme_write_gbps},
              {"nvme_source", run.nvme_src},
              {"pcie_gbps", sp.pcie_gbps}}},
            {"options", options},
            {"chosen",
             {{"offload_param", OffloadDeviceName(chosen.param)},
              {"offload_optimizer", OffloadDeviceName(chosen.optimizer)},
              {"fits", plan.chosen_fits}}},
            {"notes", run.notes}};
  if (!config_text.empty() && config_status.ok()) j["config"] = json::parse(config_text);
  std::printf("%s\n", j.dump(2).c_str());
}

void PrintTable(const PlanRun& run, const model::Plan& plan) {
  const PlanInputs& in = run.in;
  const model::PlanSpeeds& sp = in.speeds;
  const PlanOption& chosen = plan.options[static_cast<size_t>(plan.chosen)];
  std::printf("model:   %s: %s parameters (%s)\n", run.model_desc.c_str(),
              FormatCount(in.model.NumParameters()).c_str(), Shape(in.model).c_str());
  std::printf("machine: %d x %s GPU (%s), RAM %s, NVMe %s (%s); micro-batch %d x %d tokens, %d per step\n",
              in.world_size, Gb(in.gpu_bytes).c_str(), in.cuda ? "CUDA" : "host device", Gb(in.cpu_bytes).c_str(),
              Gb(in.nvme_bytes).c_str(), run.nvme_source.c_str(), in.micro_batch, in.model.seq_len, in.grad_accum);
  std::printf(
      "speeds:  compute %.3g TFLOP/s (%s); CPU Adam %.2f Gparam/s (%s); NVMe read %.2f / write %.2f GB/s "
      "(%s); PCIe %.0f GB/s (%s)\n",
      sp.gpu_flops / 1e12, run.gpu_src.c_str(), sp.adam_params_per_s / 1e9, run.adam_src.c_str(), sp.nvme_read_gbps,
      sp.nvme_write_gbps, run.nvme_src.c_str(), sp.pcie_gbps, run.pcie_src.c_str());
  // Every option has the same parameter width (bf16), so the same cut.
  std::printf("fetch:   --fetch-unit %s: %s (largest engine block %s parameters, a layer %s)\n",
              run.fetch_unit_arg.c_str(), chosen.fetch_layout.c_str(), FormatCount(chosen.max_piece_elems).c_str(),
              FormatCount(model::FetchLayout::Create(in.model, 0).layer_elems()).c_str());
  std::printf("activations: --activations %s: %s\n\n", run.activations_arg.c_str(),
              model::LayerActivationsDescription(chosen.activations));
  std::printf("%-6s %-6s | %10s %10s %10s %10s | %-6s | %-9s | %9s %10s  %s\n", "param", "optim", "GPU/rank", "pinned",
              "pageable", "NVMe", "states", "fits", "step s", "tokens/s", "bound by");
  for (size_t i = 0; i < plan.options.size(); ++i) {
    const PlanOption& o = plan.options[i];
    std::string fits = o.fits() ? "yes" : "no:";
    if (!o.fits()) {
      if (!o.fits_gpu) fits += "G";
      if (!o.fits_cpu) fits += "R";
      if (!o.fits_nvme) fits += "N";
    }
    std::printf("%-6s %-6s | %10s %10s %10s %10s | %-6s | %-9s | %9.2f %10.0f  %s%s\n",
                std::string(OffloadDeviceName(o.param)).c_str(), std::string(OffloadDeviceName(o.optimizer)).c_str(),
                Gb(o.gpu_bytes).c_str(), Gb(o.pinned_bytes).c_str(), Gb(o.pageable_bytes).c_str(),
                Gb(o.nvme_bytes).c_str(), o.state_fits ? "fit" : "no", fits.c_str(), o.step_s, o.tokens_per_s,
                o.bound_by.c_str(), static_cast<int>(i) == plan.chosen ? "  <==" : "");
  }
  std::printf(
      "\n(GPU per rank; RAM and NVMe per node. states: the 16-bit parameters and fp32 optimizer state "
      "alone fit their tiers. fits: everything zinf allocates fits; G/R/N: GPU/RAM/NVMe short.)\n\n");
  std::printf("%s: offload_param %s, offload_optimizer %s: step %.2f s (%.0f tokens/s), bound by %s\n",
              plan.chosen_fits ? "chosen" : "nothing fits; closest",
              std::string(OffloadDeviceName(chosen.param)).c_str(),
              std::string(OffloadDeviceName(chosen.optimizer)).c_str(), chosen.step_s, chosen.tokens_per_s,
              chosen.bound_by.c_str());
  for (const std::string& s : chosen.shortfalls) std::printf("  short: %s\n", s.c_str());
  std::printf(
      "  step: compute %.2f s, param NVMe %.2f s, PCIe %.2f s -> forward+backward %.2f s; "
      "Adam %.2f s, optimizer NVMe %.2f s, write-home %.2f s -> under the next forward's %.2f s\n",
      chosen.compute_s, chosen.param_nvme_s, chosen.pcie_s,
      std::max({chosen.compute_s, chosen.param_nvme_s, chosen.pcie_s}), chosen.adam_s, chosen.optimizer_nvme_s,
      chosen.write_home_s, chosen.update_window_s);
  std::printf("  per rank:\n");
  for (const model::PlanItem& it : chosen.items) {
    std::printf("    %-8s %10s  %s%s\n", std::string(model::TierName(it.tier)).c_str(), Gb(it.bytes).c_str(),
                it.what.c_str(), it.transient ? " [start-up]" : "");
  }
}

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(
      args, {"model",       "gpu-mem",      "cpu-mem",      "nvme",        "nvme-bytes",     "gpus",
             "micro-batch", "seq-len",      "vocab",        "grad-accum",  "checkpoints",    "device",
             "gpu-tflops",  "mfu",          "adam-gparams", "nvme-gbps",   "nvme-read-gbps", "nvme-write-gbps",
             "pcie-gbps",   "write-config", "fetch-unit",   "activations", "gpu-compute"},
      {"measure", "json"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  if (!flags->positionals().empty()) {
    return Fail(kName, Status::InvalidArgument("unexpected argument \"" + flags->positionals()[0] + "\""), 2);
  }
  PlanRun run;
  if (auto rc = ParseInputs(*flags, run)) return *rc;
  if (auto rc = SetSpeeds(*flags, run)) return *rc;
  auto plan = model::MakePlan(run.in);
  if (!plan.ok()) return Fail(kName, plan.status(), 2);

  std::string config_text;
  Status config_status = Status::Ok();
  const auto out = flags->Get("write-config");
  if (out) config_status = WriteConfig(run, *plan, *out, config_text);
  if (flags->Has("json")) {
    PrintJson(run, *plan, config_text, config_status);
  } else {
    PrintTable(run, *plan);
  }
  for (const std::string& n : run.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  if (!config_status.ok()) return Fail(kName, config_status);
  if (out) std::fprintf(stderr, "zinf plan: wrote %s\n", out->c_str());
  if (!plan->chosen_fits) {
    std::fprintf(stderr, "zinf plan: no offload choice fits this machine\n");
    if (run.hf_default_seq_len) {
      std::fprintf(stderr,
                   "zinf plan: the sequence length %d is %s's max_position_embeddings, the default for a HF model "
                   "(activations grow with it): --seq-len plans a shorter one\n",
                   run.in.model.seq_len, run.model_arg.c_str());
    }
    return 1;
  }
  return 0;
}

ZINF_COMMAND({"plan", "pick an offload config for a model and a machine: memory per tier, step time",
              "plan --model M --gpu-mem G --cpu-mem R [--nvme PATH]... [--nvme-bytes N] [--gpus N]\n"
              "     [--micro-batch B] [--seq-len T] [--grad-accum K] [--vocab V] [--checkpoints K]\n"
              "     [--device gpu|host] [--gpu-tflops F] [--mfu U] [--adam-gparams A] [--nvme-gbps S]\n"
              "     [--nvme-read-gbps S] [--nvme-write-gbps S] [--pcie-gbps S] [--measure] [--json]\n"
              "     [--write-config OUT.json] [--fetch-unit auto|layer|ELEMS]\n"
              "     [--activations auto|keep|recompute|offload] [--gpu-compute 16|fp32]\n"
              "  For every offload choice (offload_param none/cpu/nvme x offload_optimizer cpu/nvme, stage 3)\n"
              "  prints what zinf allocates per tier (GPU per rank; RAM and NVMe per node of --gpus ranks),\n"
              "  whether it fits, and the predicted step time; picks the fastest that fits and writes it\n"
              "  as a DeepSpeed config with --write-config (checked like config-check; written atomically).\n"
              "  Exit 1 when nothing fits. See docs/plan.md for the memory and time model.\n"
              "  --model: a built-in (tiny, demo, small, gpt2-124m; 100B and 175B, GPT-3's shape), a model JSON,\n"
              "    or a count (7B, 1.3e9; seq_len 2048 and vocab 50257 unless --seq-len/--vocab).\n"
              "  --gpu-mem, --cpu-mem, --nvme-bytes: sizes (24G = 24 GiB); NVMe defaults to the free space of\n"
              "    the --nvme paths (distinct filesystems).\n"
              "  --device host: plan for the host device (no CUDA scratch or context allowance).\n"
              "  --fetch-unit: layers above this many parameters are fetched in pieces (as zinf train's flag;\n"
              "    default auto: whole layers unless their working set exceeds --gpu-mem; layer: whole).\n"
              "  --activations: keep every layer's activations, recompute them in the backward, or recompute\n"
              "    them with the layer inputs in pinned RAM (offload; as zinf train's flag; default auto: keep\n"
              "    when the L-1 more layers take at most half of --gpu-mem and the working set still fits it,\n"
              "    recompute when it fits with every layer input, else offload; the config written then sets\n"
              "    activation_checkpointing.cpu_checkpointing).\n"
              "  --gpu-compute: as zinf train's flag (default 16: with bf16/fp16 the matmuls read the layers'\n"
              "    matrices in 16 bits; fp32: every block is cast to fp32 scratch, 4 B more per element).\n"
              "  Speeds: compute --gpu-tflops (400) x --mfu (0.5); --adam-gparams (2); --nvme-gbps (read 3,\n"
              "    write 2); --pcie-gbps (25). --measure times CPU Adam, the first --nvme path (256 MiB\n"
              "    through the aio engine) and, with --device host, the host matmul, unless given.",
              Run});

}  // namespace
}  // namespace zinf::cli
