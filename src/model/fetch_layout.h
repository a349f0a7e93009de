// Sub-block fetching: how the model's blocks (GptBlockSpecs: embed, one per
// layer, head) become the engine's blocks.
//
// The engine fetches, gathers and releases whole blocks; a block's gathered
// parameters (and the trainer's fp32 scratch for them) must fit on the
// device at once. One layer of a GPT-3-shape 175B model is 1.8 B
// parameters, too much for a 24 GB GPU, so a layer with more elements than
// the fetch unit is given to the engine as several blocks ("pieces"), each
// a run of whole consecutive groups of the layer (LayerTensorGroups: a norm,
// q/k/v, the attention output, a norm, the MLP input, the MLP output; with
// Gemma 3's sandwich norms, the attention and MLP outputs with theirs). The
// trainer acquires a piece right before the kernels that use it and
// releases it right after, and reduces a piece's gradients as soon as its
// backward is done. The finest cut is one non-empty group per piece: a tensor is
// never split, so the largest group (fc or fc_proj, 4 C^2) bounds a piece.
//
// Greedy cut: a piece takes groups in order while its elements stay within
// the unit (a group larger than the unit is a piece of its own; an empty
// group, OLMo 2's norm groups, stays in the piece before it unless that
// piece is over the unit, and no piece is empty). Every layer is cut the
// same way, at the groups the cut of a layer with each group's most
// elements over the layers takes (the layers have the same shape, but for
// a model's dense layers among routed ones).
// The embed and head blocks are never cut (the embedding is one tensor).
//
// The kernels run in the same order whatever the cut (GptCompute's group
// calls), and parameters, their initial values and the optimizer are
// elementwise, so a cut model computes the same losses and weights as the
// whole-layer model: bit for bit in fetch_layout_test and on 2 ranks
// (cli/train_fetch_unit_mpi_np2), clipping included. The one sum whose
// grouping follows the engine's blocks is the gradient norm's (partial sums
// per 4 KiB of the shard, in double): a cut that moves a block's padding
// could in principle move the clip factor's last bit.
//
// Thread-safety: immutable after Create.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/device.h"
#include "model/gpt.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::model {

// One engine block: a model block, or groups [begin_group, end_group) of a
// layer.
struct FetchPiece {
  BlockId model_block = 0;  // GptBlockSpecs index
  int layer = -1;           // the layer, or -1 for embed and head
  int begin_group = 0;      // layers only
  int end_group = kLayerGroups;
  std::vector<int> tensors;  // indices into the model block's tensors, in the piece's order
};

class FetchLayout {
 public:
  // `fetch_unit_elems` 0: every model block whole (the engine's blocks are
  // GptBlockSpecs'). `specs` are the model's blocks (GptBlockSpecs, with
  // whatever decay flags the caller set).
  static FetchLayout Create(const GptConfig& model, std::vector<BlockSpec> specs, int64_t fetch_unit_elems);
  static FetchLayout Create(const GptConfig& model, int64_t fetch_unit_elems) {
    return Create(model, GptBlockSpecs(model), fetch_unit_elems);
  }

  int64_t fetch_unit() const { return fetch_unit_; }
  // The engine's blocks, in the order the forward pass first uses them.
  const std::vector<BlockSpec>& specs() const { return specs_; }
  const FetchPiece& piece(BlockId engine_block) const { return pieces_[static_cast<size_t>(engine_block)]; }
  // The engine blocks of a model block, in forward order.
  const std::vector<BlockId>& pieces_of(BlockId model_block) const {
    return of_model_[static_cast<size_t>(model_block)];
  }
  BlockId embed() const { return pieces_of(kEmbedBlock).front(); }
  BlockId head() const { return static_cast<BlockId>(specs_.size()) - 1; }
  bool split() const { return pieces_per_layer_ > 1; }
  int pieces_per_layer() const { return pieces_per_layer_; }
  int64_t max_piece_elems() const { return max_piece_elems_; }  // over all engine blocks
  // Over all engine blocks but the embedding (which the trainer gives
  // scratch of its own).
  int64_t max_non_embed_elems() const { return max_non_embed_elems_; }
  // Over the layers' blocks (or pieces) only.
  int64_t max_layer_piece_elems() const { return max_layer_piece_elems_; }
  // The most elements the trainer casts to fp32 from one engine block (its
  // fp32 scratch): every tensor of it, or with `matrices16` (ops that read
  // the layers' matrices in 16 bits, IsLayerMatrix) every tensor but those;
  // `with_embed`: the embedding counts too (an untied one is cast in the
  // same scratch).
  int64_t max_cast_elems(bool matrices16, bool with_embed) const;
  int64_t layer_elems() const { return layer_elems_; }
  // Elements fetched twice in a backward pass, all layers: the pieces the
  // recompute acquires and releases before their own backward (all but
  // the last piece, and one holding only kMlpOutGroup).
  int64_t backward_refetch_elems() const { return backward_refetch_elems_; }
  // The cut of a layer, e.g. "whole layers" or "3 pieces per layer:
  // norm1-attn_out | norm2-mlp_in | mlp_out". Recorded in checkpoints: a
  // checkpoint resumes only under the same cut.
  std::string Describe() const;

 private:
  int64_t fetch_unit_ = 0;
  std::vector<BlockSpec> specs_;
  std::vector<FetchPiece> pieces_;
  std::vector<std::vector<BlockId>> of_model_;
  std::vector<std::vector<int>> cut_;  // groups of each piece of a layer
  int pieces_per_layer_ = 1;
  int64_t max_piece_elems_ = 0;
  int64_t max_non_embed_elems_ = 0;
  int64_t max_layer_piece_elems_ = 0;
  int64_t max_cast16_elems_ = 0;
  int64_t max_non_embed_cast16_elems_ = 0;
  int64_t layer_elems_ = 0;
  int64_t backward_refetch_elems_ = 0;
};

// Parses --fetch-unit: "auto", "layer" (whole layers: 0) or a positive
// element count ("300M", "1.5e8", "50000"; K/M/B as powers of 1000).
// kInvalidArgument naming the flag and the text otherwise. `automatic`
// is set for "auto" (the count is then ResolveAutoFetchUnit's).
StatusOr<int64_t> ParseFetchUnit(const std::string& text, bool* automatic);

// The kernels that compute the model, for what they allocate: the host
// device's CpuOps, or CudaOps in fp32 or in its 16-bit mode (kCuda16:
// --gpu-compute 16, the default, which takes effect with 16-bit parameters;
// with fp32 ones it is kCuda).
enum class ComputeKernels { kHost, kCuda, kCuda16 };
inline ComputeKernels KernelsFor(bool cuda, bool compute16) {
  return !cuda ? ComputeKernels::kHost : compute16 ? ComputeKernels::kCuda16 : ComputeKernels::kCuda;
}

// "auto": whole layers unless the model's working set with whole layers
// does not fit the device at all, else the largest cut whose working set
// does. The working set of pieces of at most E elements (the trainer's
// WorkingSetError): one gathered piece at `param_elem_bytes`, the trainer's
// fp32 cast of it (when the parameters are not fp32) and its fp32
// gradient, the embedding's fp32 gradient and a micro-batch's activations
// (recomputed: the cut does not depend on --activations, so a checkpoint
// resumes whatever the activations), at most `device_bytes` (the engine's
// resident parameters and cache are
// not counted: a run that fitted before is never cut). Candidate units halve
// from the layer's size down to its largest group. Returns the unit in
// elements, 0 (whole layers) when device_bytes is 0 or whole layers fit.
int64_t ResolveAutoFetchUnit(const GptConfig& model, int batch, ComputeKernels kernels, int64_t device_bytes,
                             int64_t param_elem_bytes);
// That working set for engine blocks of at most `max_non_embed_elems`
// elements (the embedding apart) with `activations` (the attention fused
// where `kernels` fuse it: plan.h FusedAttention), Matmul16Bytes included.
int64_t ModelWorkingSetBytes(const GptConfig& model, int batch, ComputeKernels kernels, int64_t param_elem_bytes,
                             int64_t max_non_embed_elems, LayerActivations activations);
// The fp32 gradient buffers the trainer keeps for the layers' blocks:
// two when its kernels queue on a stream (`queued`: always on a GPU; on
// the host device with TrainerOptions::host_stream) and the
// engine's fixed device memory (`engine_bytes`: a device-resident home,
// persistent blocks, gradient buffers), the working set
// (ModelWorkingSetBytes, which counts one buffer) and a second buffer of
// the largest layer piece fit three quarters of `device_bytes` (the rest
// left to the blocks the engine gathers and prefetches, and the CUDA
// context), so that a block's gradient is copied to the host while the
// next block computes into the other buffer; else one, and each block's
// backward waits for the copy before it writes.
int TrainerGradBuffers(const GptConfig& model, int batch, ComputeKernels kernels, bool queued, int64_t device_bytes,
                       int64_t engine_bytes, int64_t param_elem_bytes, const FetchLayout& layout,
                       LayerActivations activations);
// The trainer's fp32 device scratch (trainer.cc Trainer::Create), array by
// array, in elements: with 16-bit parameters (`params16`) the cast of a
// block (FetchLayout::max_cast_elems: the untied embedding too; with
// `matrices16` a block's vectors only) and the tied embedding's own cast;
// a block's gradients (the embedding apart), a second buffer for a layer's
// (`grad_buffers` 2: TrainerGradBuffers), and the embedding's gradients.
// `zinf plan` counts the same (bytes()).
struct TrainerScratch {
  int64_t param_cast = 0, embed_cast = 0, grads = 0, grads2 = 0, embed_grads = 0;
  int64_t elems() const { return param_cast + embed_cast + grads + grads2 + embed_grads; }
  int64_t bytes() const;  // each array of fp32 as the devices round it
};
TrainerScratch TrainerScratchFor(const FetchLayout& layout, bool tied, bool params16, bool matrices16,
                                 int grad_buffers);

// Device bytes of CudaOps' 16-bit mode for this model and micro-batch (the
// cuBLASLt workspace and the operand scratch of its largest linear layer)
// with kCuda16 and 16-bit parameters; 0 otherwise.
int64_t Matmul16Bytes(const GptConfig& model, int batch, ComputeKernels kernels, int64_t param_elem_bytes);

// What an `auto` choice (--fetch-unit, --activations) is sized against when
// training under `config` on `device` with --gpu-compute `compute16`: the
// config's micro-batch, the kernels, the device's capacity, and the
// parameter width (bf16/fp16: 2 bytes).
struct DeviceFit {
  int batch = 1;
  ComputeKernels kernels = ComputeKernels::kHost;
  int64_t device_bytes = 0;
  int64_t param_elem_bytes = 4;
};
DeviceFit DeviceFitFor(const Config& config, const Device& device, bool compute16);

// The unit a --fetch-unit `text` asks for when training `model` under
// `config` on `device`: ParseFetchUnit's, and for "auto"
// ResolveAutoFetchUnit's for DeviceFitFor(config, device, compute16).
StatusOr<int64_t> FetchUnitForDevice(const std::string& text, const GptConfig& model, const Config& config,
                                     const Device& device, bool compute16);

}  // namespace zinf::model
