// Offload planning (`zinf plan`): for the reference GPT trained by the
// Trainer through the ZeRO-3 Engine, what each offload choice costs in every
// memory tier, whether it fits a machine, and how long a step would take.
//
// Memory is counted the way the code allocates it, buffer by buffer (the
// items of PlanOption), not only as model states: the engine's windows are
// zero3::MakeBufferPlan's (working-parameter home, gathered blocks under
// stage3_max_live_parameters, gradient buffers, fp32 gradient accumulator,
// new-parameter buffer, staging, OptimizerSwapper and ParamSwapper pools,
// checkpoint buffers, swap files), and EstimateOption adds the model's own:
// GptCompute::Create (activations, checkpointed per layer or kept),
// Trainer::Create (fp32 cast and gradient scratch), a CUDA allowance. The
// DeepSpeed-style "model states" view (16-bit parameters and fp32 optimizer
// state only) is reported beside it. Device bytes include the 256-byte
// rounding of every allocation, so on the host device the resident part is
// what Device::bytes_in_use reports after a step (see plan_test.cc).
//
// Units: bytes, except where a name says otherwise. GPU bytes are per rank
// (one GPU); RAM and NVMe bytes are per node: world_size ranks share one
// node's RAM and NVMe drives.
//
// Step time (seconds; PlanSpeeds has the rates):
//   forward+backward = max(compute, parameter NVMe reads, PCIe copies):
//       the prefetch coordinator overlaps fetches with the model's kernels;
//       compute = (6 or 8) * P/world * tokens_per_rank / gpu_flops (6 P per token
//       for forward and backward, 2 P more for the recompute of activation
//       checkpointing, none when the activations are kept; attention's T^2
//       terms are left out);
//   optimizer = max(Adam, optimizer NVMe traffic) with pipelined sub-groups
//       (sum without pipelining);
//   write-home = the new 16-bit parameters to their home tier (NVMe writes,
//       a host-to-device copy, or nothing for RAM);
//   the optimizer and write-home run under the next step's first forward
//       pass (update window = forward+backward / (4 * grad_accum); / 3
//       with the activations kept), so
//   step = max(forward+backward + max(0, optimizer + write-home - window),
//              all NVMe traffic at the drives' speeds).
// Collectives between GPUs, the CPU's gradient accumulation and casts are
// not counted.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/fetch_layout.h"
#include "model/gpt.h"
#include "zero3/buffer_plan.h"
#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::model {

// "100B", "7b", "350M", "1.3e9", "125000000" (K/M/B/T are powers of 1000
// here: model sizes are counted in decimal). Errors name the text.
StatusOr<int64_t> ParseParameterCount(const std::string& text);

// Device bytes of GptCompute<float>::Create's allocations (gpt.cc) for a
// micro-batch of `batch` sequences, GPT-2 or Llama family, on the ops of
// `kernels` with parameters of `param_elem_bytes`, each rounded as the
// devices round it: every array is 4 bytes an element (fp32 activations,
// int32 tokens). With LayerActivations::kKeep: L - 1 more
// LayerActivationBytes; with kOffload: three layer inputs where kRecompute
// holds L + 1. Where the attention is fused (FusedAttention) each layer
// keeps its row log-sum-exps instead of its B*NH*T*T probabilities and its
// scratch is B*NH*T; the unfused CUDA attention's scratch is larger.
int64_t ActivationBytes(const GptConfig& model, int batch, ComputeKernels kernels, int64_t param_elem_bytes,
                        LayerActivations activations = LayerActivations::kRecompute);
// Whether `kernels` run `model`'s attention fused: always on the host
// (kernels::cpu::FusedAttentionForward); on CUDA (kernels::cuda::
// FlashAttentionForward) in its 16-bit mode (kCuda16 and 2-byte
// parameters) with a head size of 16, 32, 64 or 128. The GPU's shared
// memory is taken to hold the kernel (true of sm_80 and sm_90; a head size
// of 128 needs more than sm_86 and sm_89 have, and runs unfused there).
bool FusedAttention(const GptConfig& model, ComputeKernels kernels, int64_t param_elem_bytes);
// Pinned host bytes GptCompute<float>::Create maps for kOffload's layer
// inputs ((L + 1) * B*T*C fp32, as its PinnedPool rounds them); 0 for the
// others.
int64_t HostActivationBytes(const GptConfig& model, int batch, LayerActivations activations);
// Device bytes of one layer's activations (GptCompute's per-layer set: what
// its backward reads), fp32.
int64_t LayerActivationBytes(const GptConfig& model, int batch, bool fused_attention);
// `--activations auto` on a device of `device_bytes` (0: unknown) with the
// layers cut by `fetch_unit` (resolved first: the cut does not depend on
// this choice): kKeep when the L - 1 more layers' activations take at most
// half of the device (the rest stays for the engine's blocks and caches)
// and the model's working set with them (ModelWorkingSetBytes) fits it;
// else kRecompute when the working set with every layer input on the
// device fits; else kOffload (the inputs in pinned host memory) when the
// model has more than three of them.
LayerActivations AutoLayerActivations(const GptConfig& model, int batch, ComputeKernels kernels, int64_t device_bytes,
                                      int64_t param_elem_bytes, int64_t fetch_unit);
// "auto" (sets *automatic; the result is then kRecompute until resolved),
// "keep", "recompute" or "offload"; other text is kInvalidArgument naming
// the flag.
StatusOr<LayerActivations> ParseLayerActivations(const std::string& text, bool* automatic);
// --gpu-compute (zinf train's and zinf plan's): "16" true (the linear
// layers' matmuls in 16 bits when the parameters are), "fp32" false; other
// text is kInvalidArgument naming the flag.
StatusOr<bool> ParseGpuCompute16(const std::string& text);
// The activations a --activations `text` asks for when training `model`
// under `config` on `device` with layers cut by `fetch_unit`:
// ParseLayerActivations's, and for "auto" kOffload when the config asks
// for it (activation_checkpointing.cpu_checkpointing), else
// AutoLayerActivations's for DeviceFitFor(config, device, compute16)
// (fetch_layout.h).
StatusOr<LayerActivations> LayerActivationsForDevice(const std::string& text, const GptConfig& model,
                                                     const Config& config, const Device& device, bool compute16,
                                                     int64_t fetch_unit);
const char* LayerActivationsName(LayerActivations a);  // "keep", "recompute" or "offload"
// A line's worth: "every layer's kept for the backward", "each layer's
// recomputed from its input in the backward", or that with the inputs in
// pinned host memory.
const char* LayerActivationsDescription(LayerActivations a);

// A GPT shape of about `params` parameters (kInvalidArgument below 1M or
// above 10T). Rule: layers of 12 C^2 parameters with an aspect ratio of
// C / L = 128, so params ~= 12 C^3 / 128: C = cbrt(128 * params / 12)
// rounded to a multiple of 128, n_head = C / 128 (head size 128), and
// n_layer = round((params - embeddings) / (12 C^2 + 13 C)), at least 1.
// Tied embeddings. (100B gives C 10240, 79 layers; 7B gives C 4224, 32.)
StatusOr<GptConfig> GptConfigForParameterCount(int64_t params, int seq_len, int vocab_size);

struct PlanSpeeds {
  double gpu_flops = 2e14;         // effective FLOP/s of one GPU (or the host device)
  double adam_params_per_s = 2e9;  // CPU Adam, the whole node
  double nvme_read_gbps = 3.0;     // the node's NVMe paths together, 1e9 B/s
  double nvme_write_gbps = 2.0;
  double pcie_gbps = 25.0;  // per GPU, each direction
};

struct PlanInputs {
  GptConfig model;
  int world_size = 1;   // ranks (GPUs) on the node
  int micro_batch = 1;  // sequences per rank per micro-batch
  int grad_accum = 1;   // micro-batches per optimizer step
  bool cuda = true;     // CUDA kernels' scratch and a context allowance; false: the host device
  // CUDA with 16-bit parameters: the linear layers' matmuls in 16 bits
  // (`zinf train --gpu-compute 16`, its default), reading the layers'
  // matrices as they are; false (`--gpu-compute fp32`): every block cast
  // to fp32 scratch. The host's ops always read them in 16 bits.
  bool compute16 = true;
  int64_t gpu_bytes = 0;                // per GPU
  int64_t cpu_bytes = 0;                // RAM of the node
  int64_t nvme_bytes = 0;               // free NVMe space of the node; 0 with paths: no NVMe tier
  std::vector<std::string> nvme_paths;  // written into configs that offload to NVMe
  int checkpoints = 0;                  // checkpoints kept on NVMe (12 B per parameter each)
  // Sub-block fetch (fetch_layout.h): layers above fetch_unit elements are
  // cut into pieces (0: whole layers); with fetch_unit_auto the unit is
  // ResolveAutoFetchUnit's for gpu_bytes (as `zinf train --fetch-unit auto`).
  int64_t fetch_unit = 0;
  bool fetch_unit_auto = false;
  // Kept layer activations or a recompute in the backward; with
  // activations_auto, AutoLayerActivations's for gpu_bytes (as `zinf train
  // --activations auto`).
  LayerActivations activations = LayerActivations::kRecompute;
  bool activations_auto = false;
  PlanSpeeds speeds;
};

// One allocation (or group of equal ones) of one rank: the BufferPlan's
// items and the model's; the device tier is the GPU.
using Tier = zero3::BufferTier;
using PlanItem = zero3::BufferItem;
std::string_view TierName(Tier t);  // "gpu", "pinned", "pageable", "nvme"

struct PlanOption {
  OffloadDevice param = OffloadDevice::kNone;
  OffloadDevice optimizer = OffloadDevice::kCpu;
  Config config;                   // the DeepSpeed config this option stands for
  zero3::BufferPlan buffers;       // the engine's windows, per rank
  std::vector<PlanItem> items;     // per rank, what zinf allocates: buffers.Items() and the model's
  int64_t gpu_bytes = 0;           // per rank: resident + gathered peak
  int64_t gpu_resident_bytes = 0;  // per rank: held through a whole step
  int64_t gpu_gathered_bytes = 0;  // per rank: gathered blocks at most
  int64_t pinned_bytes = 0;        // node
  int64_t pageable_bytes = 0;      // node
  int64_t nvme_bytes = 0;          // node
  // DeepSpeed-style model states only (16-bit params, fp32 optimizer state).
  int64_t state_gpu_bytes = 0, state_cpu_bytes = 0, state_nvme_bytes = 0;
  bool fits_gpu = false, fits_cpu = false, fits_nvme = false;
  bool state_fits = false;
  double overshoot = 0.0;               // max over tiers of need / capacity (<= 1: fits)
  std::vector<std::string> shortfalls;  // one line per tier that does not fit

  // Bytes per optimizer step, node.
  int64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  // Per rank.
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  double compute_s = 0, param_nvme_s = 0, pcie_s = 0, adam_s = 0, optimizer_nvme_s = 0, write_home_s = 0;
  double update_window_s = 0;  // forward time the optimizer update hides under
  double step_s = 0;
  double tokens_per_s = 0;  // node
  std::string bound_by;     // the largest part of the step

  // The cut the estimate assumes: the unit (elements, 0 whole layers), its
  // description (FetchLayout::Describe) and the largest engine block.
  int64_t fetch_unit = 0;
  std::string fetch_layout;
  int64_t max_piece_elems = 0;
  LayerActivations activations = LayerActivations::kRecompute;  // PlanActivations'

  bool fits() const { return fits_gpu && fits_cpu && fits_nvme; }
};

struct Plan {
  std::vector<PlanOption> options;
  int chosen = -1;  // the fastest option that fits; else the one overshooting least
  bool chosen_fits = false;
};

// The config `zinf plan` proposes for an offload choice (stage 3, bf16,
// buffers sized for the model: see plan.cc).
Config PlanConfig(const PlanInputs& inputs, OffloadDevice param, OffloadDevice optimizer);

// The activations `inputs` asks for with 16-bit (`param_elem_bytes` 2) or
// fp32 parameters: activations, or with activations_auto
// AutoLayerActivations's for gpu_bytes and PlanFetchUnit's cut.
LayerActivations PlanActivations(const PlanInputs& inputs, int64_t param_elem_bytes);

// The fetch unit `inputs` asks for with 16-bit (`param_elem_bytes` 2) or
// fp32 parameters: fetch_unit, or ResolveAutoFetchUnit's with fetch_unit_auto.
int64_t PlanFetchUnit(const PlanInputs& inputs, int64_t param_elem_bytes);
// The engine's blocks the Trainer would create for `inputs` under `config`
// (GptBlockSpecs cut by PlanFetchUnit).
FetchLayout PlanLayout(const PlanInputs& inputs, const Config& config);

// The most non-persistent elements the Trainer holds acquired at once: the
// largest engine block (`specs`: the embed block first, the head last), or
// with a tied head the embedding and the head together.
int64_t GptMaxHeldElems(const GptConfig& model, const std::vector<BlockSpec>& specs, const Config& config, int world);

// The costs of training inputs.model under `config` (any stage-3 config).
// Errors: MakeBufferPlan's, a stage other than 3, a micro-batch or
// accumulation count below 1.
StatusOr<PlanOption> EstimateOption(const PlanInputs& inputs, const Config& config);

// Every offload choice: offload_param none/cpu/nvme x offload_optimizer
// cpu/nvme ("none" runs the same CPU Adam on RAM-resident state as "cpu" in
// zinf, which has no GPU Adam, so it is not listed apart). NVMe choices need
// nvme_paths or nvme_bytes.
StatusOr<Plan> MakePlan(const PlanInputs& inputs);

}  // namespace zinf::model
