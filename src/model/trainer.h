// Trainer: the reference GPT trained through the ZeRO-3 Engine.
//
// One optimizer step is gradient_accumulation_steps micro-batches of
// train_micro_batch_size_per_gpu sequences per rank. Each micro-batch walks
// the blocks the way the engine expects (engine.h): forward embed, layers,
// head (which also runs the head's backward at once, so the logits never
// need to be kept), then backward layers in reverse (each recomputing its
// forward, activation checkpointing, unless TrainerOptions::activations
// keeps every layer's) and the embedding, handing every
// block's gradients to ReduceGradients. A block's parameters exist on the
// device only between its Acquire and Release, cast to fp32 for the kernels
// when the engine keeps them in 16 bits; gradients go back as fp32.
//
// With a tied head the head needs the embedding block too: it is acquired
// twice per micro-batch in the forward direction and its gradient buffer
// collects the head's and the embedding's contributions before one
// ReduceGradients.
//
// Checkpoints: `<save_dir>/rank-<r>/step-<8 digits>/` per rank (the engine's
// crash-safe format) with a `latest` pointer beside them, under the folder
// rules of swap/checkpoint_dirs.h (resume step, orphans, pruning); the manifest
// carries the model config, the data's identity, the loader position and
// the step, so a resumed run sees exactly the batches it would have seen.
//
// Thread-safety: one thread drives a Trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/data.h"
#include "model/fetch_layout.h"
#include "model/gpt.h"
#include "model/timed_ops.h"
#include "zero3/engine_hooks.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::comm {
class Communicator;
}

namespace zinf::model {

struct HfCheckpoint;

// Which tensors the optimizer's weight decay applies to.
enum class WeightDecayOn {
  kMatrices,  // all but biases and norm weights (GptBlockSpecs' flags; the HF Trainer)
  kAll,       // every tensor (plain torch AdamW) but the frozen ones (IsFrozenTensor: untrained in torch)
};
// "matrices" / "all"; anything else is kInvalidArgument naming the value.
StatusOr<WeightDecayOn> ParseWeightDecayOn(const std::string& name);
const char* WeightDecayOnName(WeightDecayOn on);

struct TrainerOptions {
  GptConfig model;
  // A token file (data.h); empty: the built-in corpus of corpus_bytes bytes.
  std::string data_path;
  int64_t corpus_bytes = 2 << 20;
  // The last eval_fraction of the tokens (0 to 0.5) are held out for
  // Evaluate; 0: none, and can_evaluate() is false.
  double eval_fraction = 0.05;
  // The order of the training batches (data.h); recorded in checkpoints.
  DataOrder data_order = DataOrder::kShuffled;
  uint64_t seed = 1234;  // initial weights and the data order
  // The initial fp32 weights, a range of a tensor at a time: elements
  // [first, first + count) of tensor t (GptBlockSpecs order) of model block
  // b into `out` (Engine::TensorFill), e.g. from a HF checkpoint
  // (ModelSource::InitialWeights, ReadHfTensor). Called in block order for
  // the ranges this rank's shards hold, straight into the engine's staging:
  // no block of weights is held in RAM. Empty: RandomInit(model, seed) (gpt.h).
  std::function<Status(BlockId block, size_t tensor, int64_t first, int64_t count, float* out)> initial_weights;
  WeightDecayOn weight_decay_on = WeightDecayOn::kMatrices;
  // Layers with more elements than this are fetched in pieces
  // (fetch_layout.h); 0: whole layers. The engine's blocks are the pieces;
  // initial_weights, exports and HF files still speak of model blocks.
  int64_t fetch_unit = 0;
  // Whether the backward recomputes each layer's activations from its
  // input (kept on the device, or offloaded to pinned host memory) or
  // finds them kept from the forward (gpt.h; the same bits). With several
  // ranks, one that recomputes makes those that keep recompute too.
  LayerActivations activations = LayerActivations::kRecompute;
  // On a CUDA device with 16-bit parameters (bf16 or fp16 enabled): the
  // linear layers' matmuls in that type on tensor cores (CudaOps' 16-bit
  // mode, cuda_ops.h). false: fp32 compute from the weights cast to fp32,
  // within float rounding of the host device. The host device computes in
  // fp32 either way.
  bool gpu_compute16 = true;
  // On the host device: its kernels queued on one of the device's streams
  // and run by that stream's thread, as a GPU runs them (ops.h, CreateOps),
  // so the trainer hands blocks and gradients over behind the stream. The
  // same bits either way; ignored on a CUDA device.
  bool host_stream = false;
  // Device buffers for the layers' fp32 gradients: 0 picks (two when the
  // kernels queue on a stream and the working set fits with the second,
  // fetch_layout.h TrainerGradBuffers), 1 or 2 forces. With two the copy of
  // one block's gradient to the host runs beside the next block's
  // backward; with one the backward waits for it. Same bits either way.
  int grad_buffers = 0;
  // Engine options (run id, threads); grad_type and hooks are set by the
  // trainer. With engine.forward_only (`zinf eval`) the trainer evaluates
  // only: no gradient scratch; Step, Resume, Save and the exports are
  // kFailedPrecondition (LoadWeights and InitFromSafetensors work); its
  // forward passes are the order the engine prefetches along.
  EngineOptions engine;
  // The device, communicators and I/O engine (null ones: the defaults);
  // the trainer computes on the device too.
  EngineHooks hooks;
};

// One optimizer step's account.
struct StepReport {
  int64_t step = 0;   // optimizer steps taken so far (this one included)
  double loss = 0.0;  // mean training loss of the step's micro-batches, mean over ranks
  double lr = 0.0;
  double grad_norm = 0.0;        // global L2 norm of the mean gradient, unscaled (inf/nan on an fp16 overflow)
  double loss_scale = 1.0;       // for the next step
  bool applied = true;           // false: an fp16 overflow skipped the update
  int64_t tokens = 0;            // tokens processed in the step, all ranks
  double seconds = 0.0;          // wall time of the step
  double compute_seconds = 0.0;  // in the model's kernels (including waiting for them)
  EngineCounters engine;         // the engine's counters moved by this step
  // With wall_clock_breakdown: each kernel call's time on the device, by Ops
  // method, and their sum (TimedOps); empty otherwise.
  KernelTimes kernels;
};

class Trainer {
 public:
  // Builds the engine over GptBlockSpecs cut by options.fetch_unit, the initial weights (RandomInit
  // with options.seed), the Ops for the engine's device, the activations and
  // the data. Errors: the engine's, the data's, kInvalidArgument for a
  // token >= vocab_size or a config the model cannot use (fp16 and bf16 both
  // on, a micro-batch that is not positive).
  static StatusOr<std::unique_ptr<Trainer>> Create(const Config& config, const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (see the file comment).
  StatusOr<StepReport> Step();
  // Mean loss over `batches` micro-batches of the held-out tokens (the same
  // ones every call: the eval loader restarts). Forward only.
  // kFailedPrecondition when the held-out tokens are too few for one batch
  // (can_evaluate() says so beforehand). Collective.
  StatusOr<double> Evaluate(int batches);
  bool can_evaluate() const;

  // The mean loss over every window of the training tokens in file order,
  // forward only (`zinf eval`): llm.c's convention, a micro-batch is B*T + 1
  // consecutive tokens, inputs the first B*T, targets shifted by one, the
  // next one starting B*T later; tokens after the last whole window are not
  // scored. With several ranks each scores its share of each global batch
  // (a last partial global batch is skipped). Does not move the training
  // loader. Collective.
  struct InOrderEval {
    double loss = 0.0;    // mean over windows (each of B*T positions)
    int64_t windows = 0;  // micro-batches scored, all ranks
    int64_t tokens = 0;   // positions scored, all ranks
  };
  StatusOr<InOrderEval> EvaluateInOrder();

  // Saves the state after step() steps to <save_dir>/rank-<r>/step-<step>.
  // Returns that directory. With `keep` > 0, once the new checkpoint is in
  // place and `latest` names it, this rank's older step directories beyond
  // the newest `keep` are removed (kInvalidArgument for keep 1 with several
  // ranks: a rank one save ahead would leave the others nothing to agree on
  // at resume).
  StatusOr<std::string> Save(const std::string& save_dir, int keep = 0);
  // Loads a checkpoint: `path` is a save_dir (its rank's `latest`) or a
  // step directory saved by this rank count. The model config and the data
  // must be those of the saving run (kFailedPrecondition naming what
  // differs). Must be called before the first Step.
  Status Resume(const std::string& path);
  // Loads only the weights (and optimizer state) of a checkpoint, as Resume
  // does, but checks only that its model config and layer cut are this
  // one's: the data, seed, batch and weight decay may differ, the step and
  // loader position stay at 0 (for evaluating a checkpoint on other data).
  // The engine's layout must still fit (the saving run's rank count and, but
  // with a forward-only engine, its sub-group size).
  Status LoadWeights(const std::string& path);
  // Replaces the initial weights by a safetensors file that
  // ExportSafetensors wrote (the names of GptTensorExportNames; F32, BF16 or
  // F16). kInvalidArgument naming the tensor when one is missing, has
  // another shape or dtype, or is not this model's; extra tensors are
  // errors too. Must be called before the first Step. Reads the ranges
  // this rank's shards hold, one at a time, straight into the engine.
  Status InitFromSafetensors(const std::string& path);

  // Writes the fp32 master weights, cast to `dtype` ("F32", "BF16" or
  // "F16"), as a safetensors file named by tensor ("wte", "h.0.ln1.weight",
  // ...), with the model config in its metadata. Collective (every rank
  // calls it); rank 0 writes.
  Status ExportSafetensors(const std::string& path, const std::string& dtype);
  // Writes the fp32 master weights as a Hugging Face model folder `dir`
  // (hf_export.h): under `source`'s names, layouts, config and tokenizer
  // files, or as a GPT2LMHeadModel when `source` is null. Streams block by
  // block. Collective (every rank calls it); rank 0 writes.
  Status ExportHfFolder(const std::string& dir, const std::string& dtype, const HfCheckpoint* source);

  int64_t step() const;
  // How the model's blocks are the engine's (engine().block(b) is
  // layout().specs()[b]).
  const FetchLayout& layout() const;
  int64_t tokens_per_step() const;
  const GptConfig& model() const;
  Engine& engine();
  int64_t activation_bytes() const;       // device bytes of activations and scratch
  int64_t host_activation_bytes() const;  // pinned host bytes of offloaded layer inputs (kOffload), else 0
  LayerActivations activations() const;   // options.activations
  std::string compute_name() const;       // the Ops' (ops.h): cpu-f32, cpu-f32-stream, cuda-f32 or cuda-16
  int64_t num_train_tokens() const;

  struct Impl;

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Safetensors names of the tensors of `block` (spec order), GPT-2 style.
std::vector<std::string> GptTensorExportNames(const GptConfig& config, BlockId block);

}  // namespace zinf::model
