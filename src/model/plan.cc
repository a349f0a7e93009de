// Offload planning (plan.h). The engine's windows are zero3::MakeBufferPlan's;
// the model's own estimates here follow the allocation they stand for, and
// the comment on each names where that allocation is made, so a change there
// shows which line here to change with it.
#include "model/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "aio/pinned_pool.h"
#include "core/units.h"
#include "device/device.h"
#include "kernels/cuda_kernels.h"
#include "swap/optimizer_swapper.h"
#include "zero3/partitioner.h"

namespace zinf::model {
namespace {

// CUDA context, cuBLAS handle and workspace: an allowance, not measured.
constexpr int64_t kCudaAllowanceBytes = int64_t{1} << 30;
// GptCompute's head chunk (gpt.cc kHeadChunkBytes): logits + their gradient.
constexpr int64_t kHeadChunkBytes = int64_t{64} << 20;
// Optimizer sub-groups the generated configs aim for, and their size bounds.
constexpr int64_t kMinSubGroup = int64_t{1} << 16;
constexpr int64_t kMaxSubGroup = 100'000'000;

// HostDevice and cudaMalloc round every allocation to 256 bytes.
int64_t DeviceBytes(int64_t bytes) { return zero3::DeviceFootprint(bytes); }

std::string GiB(int64_t bytes) { return FormatBytes(bytes); }

}  // namespace

int64_t LayerActivationBytes(const GptConfig& m, int batch, bool fused_attention) {
  // gpt.cc Impl::AllocateLayerActs (every array has at least one element).
  const int64_t B = batch, N = B * m.seq_len, NC = N * m.n_embd, NA = N * m.attn_width();
  const int64_t att = B * m.n_head * m.seq_len * (fused_attention ? 1 : m.seq_len);  // Ops::AttentionSavedElems
  int64_t bytes = DeviceBytes(std::max<int64_t>(att, 1) * 4);
  // ln1, mid, ln2 (post norms: mid alone); qkv, atty; the norms' rstd
  const int64_t pre_norms = m.post_norms ? 0 : 2;
  bytes += (1 + pre_norms) * DeviceBytes(NC * 4) + DeviceBytes(3 * NA * 4) + DeviceBytes(NA * 4) +
           pre_norms * DeviceBytes(N * 4);
  if (!m.llama())
    return bytes + 2 * DeviceBytes(N * 4) + 2 * DeviceBytes(4 * NC * 4);  // LayerNorm means; fch, fch_gelu
  const int64_t M = N * m.experts_per_token;                              // MoE: dispatched rows
  const int64_t wide = std::max((m.moe() ? M : N) * m.intermediate_size, N * m.dense_width());  // routed or dense
  bytes += 3 * DeviceBytes(wide * 4);                                                           // gate, up, hmid
  if (m.branch_norms()) bytes += 2 * DeviceBytes(NC * 4) + 2 * DeviceBytes(N * 4);  // o and down outputs, rstds
  if (m.moe()) {  // router probabilities; routing weights, experts; dispatch; expert inputs, outputs
    bytes += DeviceBytes(N * m.n_experts * 4) + 2 * DeviceBytes(N * m.experts_per_token * 4) + DeviceBytes(3 * M * 4) +
             2 * DeviceBytes(M * m.n_embd * 4);
  }
  if (m.shared_expert()) {  // the shared expert's gate, up, hidden; output; gate logit
    bytes += 3 * DeviceBytes(N * m.shared_expert_size * 4) + DeviceBytes(NC * 4) +
             (m.shared_expert_gate ? DeviceBytes(N * 4) : 0);
  }
  if (m.mla()) {  // q's latent before and after its norm, its rstd; the kv latent's; the values out
    const int64_t rq = m.q_lora_rank, rkv = m.kv_lora_rank;
    if (rq > 0) bytes += 2 * DeviceBytes(N * rq * 4) + DeviceBytes(N * 4);
    bytes += 2 * DeviceBytes(N * rkv * 4) + DeviceBytes(N * 4) + DeviceBytes(N * m.attn_out_width() * 4);
  }
  if (!m.qk_norm) return bytes;
  // q and k before their norms, the norms' rstd
  const int64_t NKV = N * m.n_kv_head * m.head_dim();
  return bytes + DeviceBytes(NA * 4) + DeviceBytes(NKV * 4) + DeviceBytes(NA / m.q_norm_width() * 4) +
         DeviceBytes(NKV / m.k_norm_width() * 4);
}

LayerActivations AutoLayerActivations(const GptConfig& model, int batch, ComputeKernels kernels, int64_t device_bytes,
                                      int64_t param_elem_bytes, int64_t fetch_unit) {
  if (device_bytes <= 0) return LayerActivations::kRecompute;
  const int64_t blocks = FetchLayout::Create(model, fetch_unit).max_non_embed_elems();
  auto fits = [&](LayerActivations a) {
    return ModelWorkingSetBytes(model, batch, kernels, param_elem_bytes, blocks, a) <= device_bytes;
  };
  const int64_t extra =
      (model.n_layer - 1) * LayerActivationBytes(model, batch, FusedAttention(model, kernels, param_elem_bytes));
  if (model.n_layer >= 2 && extra <= device_bytes / 2 && fits(LayerActivations::kKeep)) return LayerActivations::kKeep;
  // gpt.cc's three device slots for the layer inputs.
  if (fits(LayerActivations::kRecompute) || model.n_layer + 1 <= 3) return LayerActivations::kRecompute;
  return LayerActivations::kOffload;
}

StatusOr<LayerActivations> LayerActivationsForDevice(const std::string& text, const GptConfig& model,
                                                     const Config& config, const Device& device, bool compute16,
                                                     int64_t fetch_unit) {
  bool automatic = false;
  ZINF_ASSIGN_OR_RETURN(const LayerActivations chosen, ParseLayerActivations(text, &automatic));
  if (!automatic) return chosen;
  if (config.activation_checkpointing.cpu_checkpointing) return LayerActivations::kOffload;
  const DeviceFit f = DeviceFitFor(config, device, compute16);
  return AutoLayerActivations(model, f.batch, f.kernels, f.device_bytes, f.param_elem_bytes, fetch_unit);
}

const char* LayerActivationsDescription(LayerActivations a) {
  switch (a) {
    case LayerActivations::kKeep: return "every layer's kept for the backward";
    case LayerActivations::kOffload:
      return "each layer's recomputed from its input in the backward, the inputs in pinned host memory";
    case LayerActivations::kRecompute: break;
  }
  return "each layer's recomputed from its input in the backward";
}

StatusOr<LayerActivations> ParseLayerActivations(const std::string& text, bool* automatic) {
  *automatic = text == "auto";
  if (*automatic || text == "recompute") return LayerActivations::kRecompute;
  if (text == "keep") return LayerActivations::kKeep;
  if (text == "offload") return LayerActivations::kOffload;
  return Status::InvalidArgument("--activations: expected auto, keep, recompute or offload, got \"" + text + "\"");
}

StatusOr<bool> ParseGpuCompute16(const std::string& text) {
  if (text == "16" || text == "fp32") return text == "16";
  return Status::InvalidArgument("--gpu-compute: expected 16 or fp32, got \"" + text + "\"");
}

const char* LayerActivationsName(LayerActivations a) {
  switch (a) {
    case LayerActivations::kKeep: return "keep";
    case LayerActivations::kOffload: return "offload";
    case LayerActivations::kRecompute: break;
  }
  return "recompute";
}

bool FusedAttention(const GptConfig& model, ComputeKernels kernels, int64_t param_elem_bytes) {
  if (kernels == ComputeKernels::kHost) return true;  // ops.cc CpuOps
  // cuda_ops.cc CudaOps::Flash; the trainer's condition for the 16-bit mode.
  return kernels == ComputeKernels::kCuda16 && param_elem_bytes == 2 && model.n_head > 0 &&
         (model.head_size > 0 || model.n_embd % model.n_head == 0) &&
         kernels::cuda::FlashAttentionHeadSize(model.head_dim());
}

int64_t ActivationBytes(const GptConfig& m, int batch, ComputeKernels kernels, int64_t param_elem_bytes,
                        LayerActivations activations) {
  // gpt.cc GptCompute::Create and Impl::AllocateLlama, array by array.
  const bool fused_attention = FusedAttention(m, kernels, param_elem_bytes);
  const int64_t B = batch, T = m.seq_len, C = m.n_embd, NH = m.n_head, L = m.n_layer, Vp = m.padded_vocab_size;
  const int64_t N = B * T, NC = N * C;
  const int64_t att = B * NH * T * T;
  // ops.cc (CPU, fused) and cuda_kernels.h FlashAttentionScratchElems, AttentionScratchElems.
  const int64_t A = m.attn_width();
  const int64_t attn_scratch = fused_attention ? B * NH * T : 7 * B * T * A + (m.attn_softcap > 0 ? 2 : 1) * att;
  const int64_t head_rows = std::clamp<int64_t>(kHeadChunkBytes / (2 * Vp * 4), 1, N);
  auto f = [](int64_t elems) { return DeviceBytes(std::max<int64_t>(elems, 1) * 4); };  // one fp32 (or int32) array
  // tokens, targets; the layer inputs x_0 .. x_L (kOffload: at most three
  // device slots, gpt.cc Impl::kSlots)
  const int64_t inputs = activations == LayerActivations::kOffload ? std::min<int64_t>(L + 1, 3) : L + 1;
  int64_t bytes = 2 * f(N) + inputs * f(NC);
  bytes += (activations == LayerActivations::kKeep ? L : 1) * LayerActivationBytes(m, batch, fused_attention);
  // attention scratch; final norm (+ mean) and rstd; logits and their
  // gradient, one chunk; losses; residual and layer gradients (kLlama's
  // layer gradient also holds d atty: N * max(C, A))
  bytes += f(attn_scratch) + f(NC) + (m.llama() ? 1 : 2) * f(N) + 2 * f(head_rows * Vp) + f(N) + f(NC) +
           f(m.llama() ? N * std::max(C, A) : NC);
  if (!m.llama()) return bytes + f(4 * NC);  // the MLP's gradient
  const int64_t hd = m.head_dim(), Ckv = static_cast<int64_t>(m.n_kv_head) * hd, I = m.intermediate_size;
  const int64_t NA = N * A;
  bytes += 2 * f(T * (m.rope_dims() / 2)) + 2 * f(T * C);  // rope tables; zero positions, their gradient sink
  bytes += f(NA) + 2 * f(N * Ckv);                         // q, k, v
  const int64_t M = N * m.experts_per_token;
  const int64_t S = m.shared_expert_size;  // d gate and d up serve the shared expert too
  const int64_t wide = std::max((m.moe() ? M : N) * I, N * m.dense_width());         // routed or dense rows
  bytes += f(wide) + 2 * f(std::max(wide, N * S));                                   // d hidden, d gate, d up
  if (m.shared_expert()) bytes += f(N * S) + (m.shared_expert_gate ? f(N) : 0);      // its d hidden, d logit
  if (m.moe()) bytes += f(M * C) + f(N * m.experts_per_token) + f(N * m.n_experts);  // d rows, weights, logits
  if (m.moe() && m.router_aux_coef > 0) bytes += f(m.n_experts);  // the load-balancing loss's gradient
  bytes += f(3 * NA) + 2 * f(NA) + 3 * f(N * Ckv);                // d qkv; d q (rotated and not); d k (both), d v
  if (m.local_rope_theta > 0 && !m.local_rope_layers.empty()) bytes += 2 * f(T * (m.rope_dims() / 2));
  if (m.mla()) {  // the projections' outputs (and gradients): q, kv_a, kv_b; the latents' gradients
    bytes += f(NA) + f(N * m.kv_a_width()) + f(N * m.kv_b_width()) + 2 * f(N * std::max(m.q_lora_rank, m.kv_lora_rank));
  }
  const int64_t norm_elems = std::max<int64_t>({C, hd, m.q_lora_rank, m.kv_lora_rank});
  if (m.norm_unit_offset) bytes += 2 * f(norm_elems);                  // ones, 1 + w
  if (m.branch_norms() || m.residual_multiplier != 1) bytes += f(NC);  // d of a post norm's input or a branch's output
  return bytes;
}

int64_t HostActivationBytes(const GptConfig& m, int batch, LayerActivations activations) {
  if (activations != LayerActivations::kOffload) return 0;
  // gpt.cc GptCompute::Create: one PinnedPool buffer of every layer input.
  aio::PinnedPoolOptions host;
  host.buffer_count = 1;
  host.buffer_bytes = (m.n_layer + 1) * int64_t{batch} * m.seq_len * m.n_embd * 4;
  return aio::PinnedPool::MappedBytes(host);
}

std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "gpu";
    case Tier::kPinned: return "pinned";
    case Tier::kPageable: return "pageable";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

StatusOr<int64_t> ParseParameterCount(const std::string& text) {
  const int64_t n = ParseCount(text);
  if (n < 1) {
    return Status::InvalidArgument(
        "--model: expected a built-in name, a model JSON file or a parameter count like "
        "100B, 7B, 350M or 1.3e9, got \"" +
        text + "\"");
  }
  return n;
}

StatusOr<GptConfig> GptConfigForParameterCount(int64_t params, int seq_len, int vocab_size) {
  if (params < 1'000'000 || params > 10'000'000'000'000) {
    return Status::InvalidArgument("--model: a parameter count must be between 1M and 10T, got " +
                                   std::to_string(params));
  }
  if (seq_len < 1 || vocab_size < 1) return Status::InvalidArgument("--seq-len and --vocab must be >= 1");
  const double c = std::cbrt(128.0 * static_cast<double>(params) / 12.0);
  const int C = std::max(128, static_cast<int>(std::lround(c / 128.0)) * 128);
  GptConfig g;
  g.vocab_size = vocab_size;
  g.padded_vocab_size = (vocab_size + 63) / 64 * 64;
  g.seq_len = seq_len;
  g.n_embd = C;
  g.n_head = C / 128;
  g.tied_embeddings = true;
  const double embed = static_cast<double>(g.padded_vocab_size + seq_len) * C + 2.0 * C;
  const double layer = 12.0 * C * C + 13.0 * C;
  g.n_layer = std::max(1, static_cast<int>(std::lround((static_cast<double>(params) - embed) / layer)));
  return g;
}

Config PlanConfig(const PlanInputs& in, OffloadDevice param, OffloadDevice optimizer) {
  Config c;
  c.train_micro_batch_size_per_gpu = in.micro_batch;
  c.gradient_accumulation_steps = in.grad_accum;
  c.train_batch_size = int64_t{in.micro_batch} * in.grad_accum * in.world_size;
  c.batch_given[0] = c.batch_given[1] = c.batch_given[2] = true;
  c.gradient_clipping = 1.0;
  c.bf16.enabled = true;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 3e-4;
  c.optimizer.weight_decay = 0.01;

  const FetchLayout layout = FetchLayout::Create(in.model, PlanFetchUnit(in, /*param_elem_bytes=*/2));
  auto part = zero3::Partitioner::Create(layout.specs(), std::max(1, in.world_size), 0);
  int64_t total = 0, max_padded = 0, max_shard = 0;
  if (part.ok()) {
    total = part->total_shard_numel();
    max_padded = part->max_padded_numel();
    max_shard = part->max_shard_numel();
  }
  ZeroConfig& z = c.zero;
  z.stage = 3;
  z.overlap_comm = true;
  const int64_t C = in.model.n_embd;
  z.reduce_bucket_size = C * C;
  z.allgather_bucket_size = C * C;
  // Blocks below 10 C elements (the LayerNorm-only head) stay gathered.
  z.stage3_param_persistence_threshold = 10 * C;
  // Prefetch the next block; hold the one in use and the next; keep a
  // released block only when it is needed again right away (the last layer
  // between forward and backward).
  z.stage3_prefetch_bucket_size = max_padded;
  z.stage3_max_live_parameters = 2 * max_padded;
  z.stage3_max_reuse_distance = max_padded;
  // About 8 sub-groups per shard, bounded: the pipeline holds 12 of them.
  z.sub_group_size = std::clamp<int64_t>(AlignUp((total + 7) / 8, 4096), kMinSubGroup, kMaxSubGroup);

  z.offload_param.device = param;
  if (param == OffloadDevice::kNvme) z.offload_param.nvme_paths = in.nvme_paths;
  z.offload_param.pin_memory = true;
  // The current shard, the prefetched one and NVMe reads two buckets ahead.
  z.offload_param.buffer_count = 4;
  z.offload_param.buffer_size = std::max<int64_t>(max_shard, 1);
  z.offload_param.max_in_cpu = z.offload_param.buffer_count * z.offload_param.buffer_size;

  z.offload_optimizer.device = optimizer;
  if (optimizer == OffloadDevice::kNvme) z.offload_optimizer.nvme_paths = in.nvme_paths;
  z.offload_optimizer.pin_memory = true;
  z.offload_optimizer.pipeline_read = optimizer == OffloadDevice::kNvme;
  z.offload_optimizer.pipeline_write = optimizer == OffloadDevice::kNvme;
  swap::OptimizerSwapperOptions so = swap::OptimizerSwapperOptionsFromConfig(z, std::max<int64_t>(total, 1));
  z.offload_optimizer.buffer_count = std::max<int64_t>(4, swap::OptimizerSwapper::RequiredBuffers(so));

  std::vector<std::string> distinct = in.nvme_paths;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  c.aio.thread_count = std::max<int64_t>(1, static_cast<int64_t>(distinct.size()));
  c.aio.queue_depth = 32;
  return c;
}

LayerActivations PlanActivations(const PlanInputs& in, int64_t param_elem_bytes) {
  if (!in.activations_auto) return in.activations;
  return AutoLayerActivations(in.model, in.micro_batch, KernelsFor(in.cuda, in.compute16), in.gpu_bytes,
                              param_elem_bytes, PlanFetchUnit(in, param_elem_bytes));
}

int64_t PlanFetchUnit(const PlanInputs& in, int64_t param_elem_bytes) {
  if (!in.fetch_unit_auto) return in.fetch_unit;
  return ResolveAutoFetchUnit(in.model, in.micro_batch, KernelsFor(in.cuda, in.compute16), in.gpu_bytes,
                              param_elem_bytes);
}

FetchLayout PlanLayout(const PlanInputs& in, const Config& config) {
  const int64_t elem_bytes = ElementSizeBytes(zero3::WorkingType(config));
  return FetchLayout::Create(in.model, PlanFetchUnit(in, elem_bytes));
}

int64_t GptMaxHeldElems(const GptConfig& model, const std::vector<BlockSpec>& specs, const Config& config, int world) {
  auto part = zero3::Partitioner::Create(specs, std::max(1, world), 0);
  if (!part.ok()) return 0;  // MakeBufferPlan reports the Partitioner's error
  const ZeroConfig& z = config.zero;
  auto transient = [&](BlockId b) {
    const int64_t n = part->layout(b).padded_numel;
    return z.stage == 3 && n >= z.stage3_param_persistence_threshold ? n : 0;
  };
  int64_t held = 0;
  for (BlockId b = 0; b < part->num_blocks(); ++b) held = std::max(held, transient(b));
  // trainer.cc MicroBatch: the tied head holds the embedding and the head at once.
  const BlockId head = part->num_blocks() - 1;
  if (model.tied_embeddings) held = std::max(held, transient(kEmbedBlock) + transient(head));
  return held;
}

namespace {

// The model's own allocations besides the engine's: activations on the
// device and, offloaded, their layer inputs in pinned host memory (gpt.cc
// GptCompute::Create), the trainer's scratch (trainer.cc Create) and, on
// CUDA, an allowance for the context and cuBLAS.
void AddModelItems(const PlanInputs& in, const FetchLayout& layout, int64_t param_bytes, int64_t batch,
                   LayerActivations kept, int64_t engine_bytes, std::vector<PlanItem>& items) {
  const ComputeKernels kernels = KernelsFor(in.cuda, in.compute16);
  auto add = [&](std::string what, int64_t bytes) {
    if (bytes > 0) items.push_back({Tier::kDevice, std::move(what), bytes, false});
  };
  add(kept == LayerActivations::kKeep
          ? "activations (fp32: every layer's, kept for the backward; attention, logits chunk)"
      : kept == LayerActivations::kOffload
          ? "activations (fp32: 3 of the layer inputs (the rest in pinned host memory), "
            "one layer, attention, logits chunk)"
          : "activations (fp32: checkpoints (L+1)*B*T*C, one layer, attention, logits chunk)",
      ActivationBytes(in.model, static_cast<int>(batch), kernels, param_bytes, kept));
  if (const int64_t host = HostActivationBytes(in.model, static_cast<int>(batch), kept); host > 0) {
    items.push_back({Tier::kPinned,
                     "activation checkpoints (fp32 layer inputs (L+1)*B*T*C in pinned host memory: cpu_checkpointing)",
                     host, false});
  }
  // fp32 cast of a block (the tied embedding has its own; 16-bit
  // parameters: the layers' matrices are read as they are, on the host and
  // in CudaOps' 16-bit mode, PlanInputs::compute16), one block's gradients
  // (the embedding's are apart; on a GPU a second buffer for a layer's when
  // it fits, TrainerGradBuffers), the embedding's gradients.
  const bool matrices16 = kernels != ComputeKernels::kCuda;  // the host's ops read 16-bit matrices too
  const bool two_grads = TrainerGradBuffers(in.model, static_cast<int>(batch), kernels, /*queued=*/in.cuda,
                                            in.gpu_bytes, engine_bytes, param_bytes, layout, kept) > 1;
  const int64_t scratch =
      TrainerScratchFor(layout, in.model.tied_embeddings, param_bytes != 4, matrices16, two_grads ? 2 : 1).bytes();
  const std::string grads =
      two_grads ? "its gradients (a layer's in two buffers: one copied out as the next computes)" : "its gradients";
  add(matrices16
          ? "trainer scratch (fp32 cast of a block's vectors or of the head, " + grads + ", the embedding's gradients)"
          : "trainer scratch (fp32 cast of a block or piece, " + grads + ", the embedding's gradients)",
      scratch);
  if (in.cuda) add("CUDA context and cuBLAS workspace (allowance)", kCudaAllowanceBytes);
  if (matrices16) {
    add("16-bit compute (cuBLASLt workspace, a linear layer's operands in 16 bits)",
        Matmul16Bytes(in.model, static_cast<int>(batch), kernels, param_bytes));
  }
}

// Per-tier totals (GPU per rank; RAM and NVMe per node), the model-states
// view, and whether each tier fits.
void Totals(const PlanInputs& in, int world, PlanOption& o) {
  const zero3::BufferPlan& bp = o.buffers;
  const int64_t total = bp.total_shard_elems, pes = bp.param_elem_bytes;
  const OffloadDevice popt = bp.param_home, oopt = bp.optimizer.device;
  for (const PlanItem& it : o.items) {
    switch (it.tier) {
      case Tier::kDevice: o.gpu_bytes += it.bytes; break;
      case Tier::kPinned: o.pinned_bytes += it.bytes * world; break;
      case Tier::kPageable: o.pageable_bytes += it.bytes * world; break;
      case Tier::kNvme: o.nvme_bytes += it.bytes * world; break;
    }
  }
  o.gpu_gathered_bytes = bp.device_gathered_bytes();
  o.gpu_resident_bytes = o.gpu_bytes - o.gpu_gathered_bytes;

  // Model states, DeepSpeed's view: where the 16-bit parameters and the
  // 16 B/parameter fp32 optimizer state live, plus one gathered block.
  o.state_gpu_bytes = (popt == OffloadDevice::kNone ? total * pes : 0) + bp.max_padded_elems * pes;
  o.state_cpu_bytes =
      world * ((popt == OffloadDevice::kCpu ? total * pes : 0) + (oopt == OffloadDevice::kCpu ? 16 * total : 0));
  o.state_nvme_bytes = world * ((popt == OffloadDevice::kNvme ? total * pes : 0) +
                                (oopt == OffloadDevice::kNvme ? 16 * total : 0) + in.checkpoints * total * 12);

  auto ratio = [](int64_t need, int64_t have) {
    if (need <= 0) return 0.0;
    return have <= 0 ? 1e9 : static_cast<double>(need) / static_cast<double>(have);
  };
  const int64_t ram = o.pinned_bytes + o.pageable_bytes;
  o.fits_gpu = o.gpu_bytes <= in.gpu_bytes;
  o.fits_cpu = ram <= in.cpu_bytes;
  o.fits_nvme = o.nvme_bytes <= in.nvme_bytes;
  o.state_fits =
      o.state_gpu_bytes <= in.gpu_bytes && o.state_cpu_bytes <= in.cpu_bytes && o.state_nvme_bytes <= in.nvme_bytes;
  o.overshoot =
      std::max({ratio(o.gpu_bytes, in.gpu_bytes), ratio(ram, in.cpu_bytes), ratio(o.nvme_bytes, in.nvme_bytes)});
  if (!o.fits_gpu) o.shortfalls.push_back("GPU: needs " + GiB(o.gpu_bytes) + " per GPU, has " + GiB(in.gpu_bytes));
  if (!o.fits_cpu) o.shortfalls.push_back("RAM: needs " + GiB(ram) + ", has " + GiB(in.cpu_bytes));
  if (!o.fits_nvme) {
    o.shortfalls.push_back(
        "NVMe: needs " + GiB(o.nvme_bytes) + ", has " +
        (in.nvme_bytes > 0 ? GiB(in.nvme_bytes) : std::string("none (give --nvme or --nvme-bytes)")));
  }
}

// The step time (plan.h).
void StepTime(const PlanInputs& in, const Config& config, int world, const FetchLayout& layout, PlanOption& o) {
  const ZeroConfig& z = config.zero;
  const zero3::BufferPlan& bp = o.buffers;
  const int64_t total = bp.total_shard_elems, pes = bp.param_elem_bytes;
  const OffloadDevice popt = bp.param_home, oopt = bp.optimizer.device;
  const int64_t B = config.train_micro_batch_size_per_gpu, gas = config.gradient_accumulation_steps;
  const PlanSpeeds& s = in.speeds;
  const double P_rank = static_cast<double>(total);
  const double tokens_rank = static_cast<double>(B * gas * in.model.seq_len);
  const bool keep = o.activations == LayerActivations::kKeep;
  const double flops_per_token = keep ? 6.0 : 8.0;  // the recompute's 2 P more
  // A routed model multiplies each token by its experts alone.
  const double active =
      static_cast<double>(in.model.ActiveParameters()) / static_cast<double>(in.model.NumParameters());
  o.compute_s = flops_per_token * P_rank * active * tokens_rank / s.gpu_flops;
  // Every block is fetched for the forward and again for the backward; a
  // layer in pieces fetches its pieces before the last once more when the
  // backward recomputes (the recompute releases them before their backward).
  const int64_t refetch = keep ? 0 : layout.backward_refetch_elems() / world;
  const int64_t fetch_bytes = gas * (2 * total + refetch) * pes;
  const int64_t param_read = popt == OffloadDevice::kNvme ? fetch_bytes * world : 0;
  const int64_t param_write = popt == OffloadDevice::kNvme ? total * pes * world : 0;
  // The optimizer update: master, m, v read and written; on NVMe the fp32
  // gradient lives there too: written every micro-batch, read back to
  // accumulate after the first, and read by the update (all but the few
  // sub-groups the gradient window still holds: not counted).
  const int64_t optim_read = oopt == OffloadDevice::kNvme ? (12 + 4 * gas) * total * world : 0;
  const int64_t optim_write = oopt == OffloadDevice::kNvme ? (12 + 4 * gas) * total * world : 0;
  o.nvme_read_bytes = param_read + optim_read;
  o.nvme_write_bytes = param_write + optim_write;
  // Offloaded layer inputs, every micro-batch: each copied out in the
  // forward, and back in the backward but for the last three (x_L is not
  // read there, x_{L-1} and x_{L-2} are still in their slots: gpt.cc).
  const int64_t input_bytes = int64_t{4} * B * in.model.seq_len * in.model.n_embd;
  const int64_t inputs = o.activations == LayerActivations::kOffload ? in.model.n_layer + 1 : 0;
  const int64_t inputs_out = gas * inputs * input_bytes,
                inputs_in = gas * std::max<int64_t>(inputs - 3, 0) * input_bytes;
  o.h2d_bytes =
      (popt == OffloadDevice::kNone ? 0 : fetch_bytes) + (popt == OffloadDevice::kNone ? total * pes : 0) + inputs_in;
  o.d2h_bytes = gas * total * 4 + inputs_out;
  const double rd = s.nvme_read_gbps * 1e9, wr = s.nvme_write_gbps * 1e9, pcie = s.pcie_gbps * 1e9;
  o.param_nvme_s = static_cast<double>(param_read) / rd;
  o.pcie_s = static_cast<double>(fetch_bytes * (popt == OffloadDevice::kNone ? 0 : 1) + inputs_in + o.d2h_bytes) / pcie;
  o.adam_s = P_rank * world / s.adam_params_per_s;
  o.optimizer_nvme_s = static_cast<double>(optim_read) / rd + static_cast<double>(optim_write) / wr;
  o.write_home_s = popt == OffloadDevice::kNvme   ? static_cast<double>(param_write) / wr
                   : popt == OffloadDevice::kNone ? static_cast<double>(total * pes) / pcie
                                                  : 0.0;
  const double fb = std::max({o.compute_s, o.param_nvme_s, o.pcie_s});
  const bool pipelined = z.offload_optimizer.pipeline_read || z.offload_optimizer.pipeline_write;
  const double opt = pipelined ? std::max(o.adam_s, o.optimizer_nvme_s) : o.adam_s + o.optimizer_nvme_s;
  // The update and the write-home run under the first micro-batch's forward
  // pass: a quarter of its forward+backward (2 P of 8 P per token), a third
  // with the activations kept (2 P of 6 P).
  const double parts_of_fb = keep ? 3.0 : 4.0;
  o.update_window_s = fb / (parts_of_fb * static_cast<double>(gas));
  // One set of drives carries the parameter reads, the optimizer's traffic
  // and the write-home.
  const double nvme_s = o.param_nvme_s + o.optimizer_nvme_s + (popt == OffloadDevice::kNvme ? o.write_home_s : 0.0);
  o.step_s = std::max(fb + std::max(0.0, opt + o.write_home_s - o.update_window_s), nvme_s);
  o.tokens_per_s = tokens_rank * world / o.step_s;
  const std::vector<std::pair<double, const char*>> parts = {
      {o.compute_s, "compute"}, {o.param_nvme_s, "param NVMe reads"},   {o.pcie_s, "PCIe"},
      {o.adam_s, "CPU Adam"},   {o.optimizer_nvme_s, "optimizer NVMe"}, {o.write_home_s, "param write-home"}};
  o.bound_by = std::max_element(parts.begin(), parts.end())->second;
}

}  // namespace

StatusOr<PlanOption> EstimateOption(const PlanInputs& in, const Config& config) {
  const ZeroConfig& z = config.zero;
  if (z.stage != 3)
    return Status::InvalidArgument("plan: only stage 3 is estimated, got stage " + std::to_string(z.stage));
  const int world = std::max(1, in.world_size);
  const int64_t B = config.train_micro_batch_size_per_gpu, gas = config.gradient_accumulation_steps;
  if (B < 1 || gas < 1) return Status::InvalidArgument("plan: micro-batch and accumulation steps must be >= 1");
  const FetchLayout layout = PlanLayout(in, config);
  const std::vector<BlockSpec>& specs = layout.specs();

  PlanOption o;
  o.fetch_unit = layout.fetch_unit();
  o.fetch_layout = layout.Describe();
  o.max_piece_elems = layout.max_piece_elems();
  o.param = z.offload_param.device;
  o.optimizer = z.offload_optimizer.device;
  o.config = config;
  // The trainer's gradients are fp32.
  ZINF_ASSIGN_OR_RETURN(o.buffers,
                        zero3::MakeBufferPlan(config, specs, world, in.cuda ? DeviceKind::kCuda : DeviceKind::kHost,
                                              ElementType::kF32, GptMaxHeldElems(in.model, specs, config, world)));
  // The engine's device windows, the model's, then the host and NVMe tiers.
  std::vector<PlanItem> engine = o.buffers.Items();
  for (const PlanItem& it : engine) {
    if (it.tier == Tier::kDevice) o.items.push_back(it);
  }
  o.activations = PlanActivations(in, o.buffers.param_elem_bytes);
  // The config written for this option asks `zinf train --activations
  // auto` for the same.
  if (o.activations == LayerActivations::kOffload) o.config.activation_checkpointing.cpu_checkpointing = true;
  // What the engine allocates on the device when it is made (the trainer
  // measures the same before its own allocations: TrainerGradBuffers).
  const int64_t engine_bytes = o.buffers.device_fixed_bytes() + o.buffers.persistent_bytes;
  AddModelItems(in, layout, o.buffers.param_elem_bytes, B, o.activations, engine_bytes, o.items);
  for (const PlanItem& it : engine) {
    if (it.tier != Tier::kDevice) o.items.push_back(it);
  }
  if (in.checkpoints > 0) {
    o.items.push_back({Tier::kNvme, std::to_string(in.checkpoints) + " checkpoint(s): master, m, v",
                       in.checkpoints * o.buffers.total_shard_elems * 12, false});
  }
  Totals(in, world, o);
  StepTime(in, config, world, layout, o);
  return o;
}

StatusOr<Plan> MakePlan(const PlanInputs& in) {
  if (in.world_size < 1 || in.micro_batch < 1 || in.grad_accum < 1) {
    return Status::InvalidArgument("--gpus, --micro-batch and --grad-accum must be >= 1");
  }
  if (in.gpu_bytes <= 0) return Status::InvalidArgument("--gpu-mem: the GPU memory per GPU is required");
  if (in.cpu_bytes <= 0) return Status::InvalidArgument("--cpu-mem: the node's RAM is required");
  Plan plan;
  for (OffloadDevice p : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (OffloadDevice o : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      ZINF_ASSIGN_OR_RETURN(PlanOption opt, EstimateOption(in, PlanConfig(in, p, o)));
      plan.options.push_back(std::move(opt));
    }
  }
  for (size_t i = 0; i < plan.options.size(); ++i) {
    const PlanOption& o = plan.options[i];
    if (!o.fits()) continue;
    if (plan.chosen < 0 || o.step_s < plan.options[static_cast<size_t>(plan.chosen)].step_s) {
      plan.chosen = static_cast<int>(i);
    }
  }
  plan.chosen_fits = plan.chosen >= 0;
  if (!plan.chosen_fits) {
    for (size_t i = 0; i < plan.options.size(); ++i) {
      if (plan.chosen < 0 || plan.options[i].overshoot < plan.options[static_cast<size_t>(plan.chosen)].overshoot) {
        plan.chosen = static_cast<int>(i);
      }
    }
  }
  return plan;
}

}  // namespace zinf::model
