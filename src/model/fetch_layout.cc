// FetchLayout (fetch_layout.h): the greedy cut of a layer into pieces and
// the fetch unit's parsing and "auto" rule.
#include "model/fetch_layout.h"

#include <algorithm>

#include "core/check.h"
#include "core/units.h"
#include "kernels/cuda_kernels.h"
#include "model/plan.h"
#include "zero3/buffer_plan.h"

namespace zinf::model {
namespace {

constexpr const char* kGroupNames[kLayerGroups] = {"norm1", "qkv", "attn_out", "norm2", "mlp_in", "mlp_out"};

// Pieces of a layer as group lists: greedy in order (fetch_layout.h).
std::vector<std::vector<int>> CutLayer(const std::vector<int64_t>& group_elems, int64_t unit) {
  std::vector<std::vector<int>> cut(1);
  int64_t in_piece = 0;
  for (int g = 0; g < kLayerGroups; ++g) {
    const int64_t n = group_elems[static_cast<size_t>(g)];
    // An empty group (post norms' norm groups) never starts a piece of its
    // own: it stays in the piece being filled unless that one is already
    // over the unit (one group larger than it), then opens the next.
    if (unit > 0 && in_piece > 0 && in_piece + n > unit) {
      cut.emplace_back();
      in_piece = 0;
    }
    cut.back().push_back(g);
    in_piece += n;
  }
  return cut;
}

// Each group's elements: the most over the layers (a dense layer among
// routed ones has other MLP groups), which the one cut of every layer
// follows.
std::vector<int64_t> GroupElems(const GptConfig& model, const std::vector<BlockSpec>& specs) {
  std::vector<int64_t> out(kLayerGroups, 0);
  for (int layer = 0; layer < model.n_layer; ++layer) {
    const BlockSpec& spec = specs[static_cast<size_t>(LayerBlock(layer))];
    const std::vector<std::vector<int>> groups = LayerTensorGroups(model, layer);
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t n = 0;
      for (int t : groups[g]) n += spec.tensors[static_cast<size_t>(t)].numel();
      out[g] = std::max(out[g], n);
    }
  }
  return out;
}

}  // namespace

FetchLayout FetchLayout::Create(const GptConfig& model, std::vector<BlockSpec> specs, int64_t fetch_unit_elems) {
  FetchLayout l;
  l.fetch_unit_ = std::max<int64_t>(fetch_unit_elems, 0);
  if (model.n_layer > 0) {
    const std::vector<int64_t> elems = GroupElems(model, specs);
    for (int64_t n : elems) l.layer_elems_ += n;
    l.cut_ = CutLayer(elems, l.layer_elems_ <= l.fetch_unit_ ? 0 : l.fetch_unit_);
  } else {
    l.cut_ = CutLayer(std::vector<int64_t>(kLayerGroups, 0), 0);
  }
  l.pieces_per_layer_ = static_cast<int>(l.cut_.size());
  l.of_model_.resize(specs.size());
  auto add = [&](BlockSpec spec, FetchPiece piece) {
    int64_t n = 0, cast16 = 0;  // cast16: what is cast when the layers' matrices are read in 16 bits
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      const int64_t e = spec.tensors[i].numel();
      n += e;
      if (piece.layer < 0 || !IsLayerMatrix(model, piece.tensors[i])) cast16 += e;
    }
    const bool embed = piece.model_block == kEmbedBlock;
    l.max_piece_elems_ = std::max(l.max_piece_elems_, n);
    if (!embed) l.max_non_embed_elems_ = std::max(l.max_non_embed_elems_, n);
    if (piece.layer >= 0) l.max_layer_piece_elems_ = std::max(l.max_layer_piece_elems_, n);
    l.max_cast16_elems_ = std::max(l.max_cast16_elems_, cast16);
    if (!embed) l.max_non_embed_cast16_elems_ = std::max(l.max_non_embed_cast16_elems_, cast16);
    l.of_model_[static_cast<size_t>(piece.model_block)].push_back(static_cast<BlockId>(l.specs_.size()));
    l.specs_.push_back(std::move(spec));
    l.pieces_.push_back(std::move(piece));
  };
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    const BlockSpec& spec = specs[static_cast<size_t>(b)];
    const bool layer = b != kEmbedBlock && b != HeadBlock(model);
    if (!layer || l.pieces_per_layer_ == 1) {
      FetchPiece p{b, layer ? static_cast<int>(b) - 1 : -1, 0, kLayerGroups, {}};
      for (int t = 0; t < static_cast<int>(spec.tensors.size()); ++t) p.tensors.push_back(t);
      add(spec, std::move(p));
      continue;
    }
    const std::vector<std::vector<int>> groups = LayerTensorGroups(model, static_cast<int>(b) - 1);
    for (const std::vector<int>& cut : l.cut_) {
      FetchPiece p{b, static_cast<int>(b) - 1, cut.front(), cut.back() + 1, {}};
      const bool refetched = p.begin_group < kMlpOutGroup && p.end_group != kLayerGroups;
      BlockSpec ps;
      ps.name = spec.name + "." + kGroupNames[cut.front()];
      if (cut.size() > 1) ps.name += std::string("-") + kGroupNames[cut.back()];
      for (int g : cut) {
        for (int t : groups[static_cast<size_t>(g)]) {
          p.tensors.push_back(t);
          ps.tensors.push_back(spec.tensors[static_cast<size_t>(t)]);
          if (refetched) l.backward_refetch_elems_ += spec.tensors[static_cast<size_t>(t)].numel();
        }
      }
      add(std::move(ps), std::move(p));
    }
  }
  return l;
}

int64_t FetchLayout::max_cast_elems(bool matrices16, bool with_embed) const {
  if (matrices16) return with_embed ? max_cast16_elems_ : max_non_embed_cast16_elems_;
  return with_embed ? max_piece_elems_ : max_non_embed_elems_;
}

std::string FetchLayout::Describe() const {
  if (pieces_per_layer_ == 1) return "whole layers";
  std::string out = std::to_string(pieces_per_layer_) + " pieces per layer:";
  for (size_t i = 0; i < cut_.size(); ++i) {
    out += std::string(i == 0 ? " " : " | ") + kGroupNames[cut_[i].front()];
    if (cut_[i].size() > 1) out += std::string("-") + kGroupNames[cut_[i].back()];
  }
  return out;
}

StatusOr<int64_t> ParseFetchUnit(const std::string& text, bool* automatic) {
  *automatic = text == "auto";
  if (text == "auto" || text == "layer") return 0;
  const int64_t n = ParseCount(text);
  if (n < 1) {
    return Status::InvalidArgument(
        "--fetch-unit: expected auto, layer or a positive element count like 300M, "
        "1.5e8, 2G or 50000, got \"" +
        text + "\"");
  }
  return n;
}

int64_t ModelWorkingSetBytes(const GptConfig& model, int batch, ComputeKernels kernels, int64_t param_elem_bytes,
                             int64_t max_non_embed_elems, LayerActivations activations) {
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  const int64_t embed = specs[kEmbedBlock].numel();
  const bool cast = param_elem_bytes != 4;
  // The embedding's own: its fp32 gradient, its fp32 cast with a tied head,
  // and its gathered copy (beside the head's).
  const int64_t fixed = ActivationBytes(model, batch, kernels, param_elem_bytes, activations) + 4 * embed +
                        (cast && model.tied_embeddings ? 4 * embed : 0) + param_elem_bytes * embed;
  // A block: gathered, an fp32 cast of it and its fp32 gradient. The
  // trainer casts only what is not a layer's matrix when the ops read
  // those in 16 bits (Trainer's scratch, `zinf plan`'s row); the whole
  // block's cast is counted here all the same, a margin that the cut
  // leaves to the engine's prefetch and cache.
  const int64_t per_elem = param_elem_bytes + (cast ? 4 : 0) + 4;
  return fixed + per_elem * max_non_embed_elems + Matmul16Bytes(model, batch, kernels, param_elem_bytes);
}

int TrainerGradBuffers(const GptConfig& model, int batch, ComputeKernels kernels, bool queued, int64_t device_bytes,
                       int64_t engine_bytes, int64_t param_elem_bytes, const FetchLayout& layout,
                       LayerActivations activations) {
  if (!queued || device_bytes <= 0) return 1;
  const int64_t two =
      engine_bytes +
      ModelWorkingSetBytes(model, batch, kernels, param_elem_bytes, layout.max_non_embed_elems(), activations) +
      4 * layout.max_layer_piece_elems();
  // A quarter of the device left to the engine's gathered blocks, prefetch
  // and cache and the CUDA context: the second buffer speeds the backward
  // up, but never at the cost of the blocks the forward fetches ahead.
  return two <= device_bytes / 4 * 3 ? 2 : 1;
}

int64_t TrainerScratch::bytes() const {
  int64_t sum = 0;
  for (int64_t n : {param_cast, embed_cast, grads, grads2, embed_grads}) sum += zero3::DeviceFootprint(n * 4);
  return sum;
}

TrainerScratch TrainerScratchFor(const FetchLayout& layout, bool tied, bool params16, bool matrices16,
                                 int grad_buffers) {
  const int64_t embed = layout.specs()[kEmbedBlock].numel();
  TrainerScratch s;
  s.param_cast = params16 ? layout.max_cast_elems(matrices16, /*with_embed=*/!tied) : 0;
  s.embed_cast = params16 && tied ? embed : 0;
  s.grads = layout.max_non_embed_elems();
  s.grads2 = grad_buffers > 1 ? layout.max_layer_piece_elems() : 0;
  s.embed_grads = embed;
  return s;
}

int64_t Matmul16Bytes(const GptConfig& model, int batch, ComputeKernels kernels, int64_t param_elem_bytes) {
  if (kernels != ComputeKernels::kCuda16 || param_elem_bytes != 2) return 0;  // the trainer's condition for it
  // The linear layers' widest in + out: GPT-2's MLP (C -> 4C and back),
  // Llama's gate/up and down (C <-> intermediate), q and o (C <-> n_head *
  // head_dim), the router (C -> n_experts; an expert's matmuls have at most N rows),
  // the shared expert's (C <-> shared_expert_size), a dense layer's among
  // routed ones (C <-> dense_width()), latent attention's kv_a_proj (C ->
  // kv_lora_rank + qk_rope_head_dim) and its matmuls out of the latents
  // (kv_lora_rank -> n_head * (nope + v_head_dim), q_lora_rank ->
  // attn_width()).
  const int64_t C = model.n_embd, N = int64_t{batch} * model.seq_len;
  const int64_t out = model.llama()
                          ? std::max<int64_t>({model.intermediate_size, model.attn_width(), model.n_experts,
                                               model.shared_expert_size, model.dense_width(), model.kv_a_width()})
                          : 4 * C;
  int64_t scratch = kernels::cuda::Matmul16ScratchBytes(N, C, out);
  if (model.llama() && model.mla()) {
    scratch = std::max({scratch, kernels::cuda::Matmul16ScratchBytes(N, model.kv_lora_rank, model.kv_b_width()),
                        kernels::cuda::Matmul16ScratchBytes(N, model.q_lora_rank, model.attn_width())});
  }
  return kernels::cuda::kLtWorkspaceBytes + scratch;
}

int64_t ResolveAutoFetchUnit(const GptConfig& model, int batch, ComputeKernels kernels, int64_t device_bytes,
                             int64_t param_elem_bytes) {
  if (device_bytes <= 0 || model.n_layer < 1) return 0;
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  auto fits = [&](const FetchLayout& l) {
    return ModelWorkingSetBytes(model, batch, kernels, param_elem_bytes, l.max_non_embed_elems(),
                                LayerActivations::kRecompute) <= device_bytes;
  };
  const FetchLayout whole = FetchLayout::Create(model, specs, 0);
  if (fits(whole)) return 0;
  const std::vector<int64_t> elems = GroupElems(model, specs);
  const int64_t floor = *std::max_element(elems.begin(), elems.end());
  for (int64_t unit = whole.layer_elems() / 2; unit > floor; unit /= 2) {
    if (fits(FetchLayout::Create(model, specs, unit))) return unit;
  }
  return floor;  // one group per piece where groups are large: the finest cut
}

DeviceFit DeviceFitFor(const Config& config, const Device& device, bool compute16) {
  DeviceFit f;
  f.batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  f.kernels = KernelsFor(device.kind() == DeviceKind::kCuda, compute16);
  f.device_bytes = static_cast<int64_t>(device.capacity_bytes());
  f.param_elem_bytes = ElementSizeBytes(zero3::WorkingType(config));
  return f;
}

StatusOr<int64_t> FetchUnitForDevice(const std::string& text, const GptConfig& model, const Config& config,
                                     const Device& device, bool compute16) {
  bool automatic = false;
  ZINF_ASSIGN_OR_RETURN(const int64_t unit, ParseFetchUnit(text, &automatic));
  if (!automatic) return unit;
  const DeviceFit f = DeviceFitFor(config, device, compute16);
  return ResolveAutoFetchUnit(model, f.batch, f.kernels, f.device_bytes, f.param_elem_bytes);
}

}  // namespace zinf::model
