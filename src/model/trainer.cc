// The Trainer (trainer.h): the block walk of one micro-batch, checkpoints,
// export.
#include "model/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/crc32c.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/units.h"
#include "device/device.h"
#include "kernels/cpu_kernels.h"
#include "model/data.h"
#include "model/hf_export.h"
#include "model/plan.h"
#include "model/safetensors.h"
#include "swap/checkpoint.h"
#include "swap/checkpoint_dirs.h"

namespace zinf::model {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Tensor t of block b as ExportSafetensors writes it (and InitFromSafetensors
// expects it): its shape without the vocabulary padding rows (the embedding
// and an untied lm_head), which are not part of the model.
std::vector<int64_t> ExportShape(const GptConfig& model, const std::vector<BlockSpec>& specs, BlockId b, size_t t) {
  std::vector<int64_t> shape = specs[static_cast<size_t>(b)].tensors[t].shape;
  const bool vocab_rows =
      (b == kEmbedBlock && t == kWte) || (b == HeadBlock(model) && static_cast<int>(t) == LmHeadIndex(model));
  if (vocab_rows) shape[0] = model.vocab_size;
  return shape;
}

}  // namespace

std::vector<std::string> GptTensorExportNames(const GptConfig& config, BlockId block) {
  if (config.llama()) {  // HF's names (LlamaForCausalLM)
    if (block == kEmbedBlock) return {"model.embed_tokens.weight"};
    if (block == HeadBlock(config)) {
      std::vector<std::string> n = {"model.norm.weight"};
      if (!config.tied_embeddings) n.push_back("lm_head.weight");
      return n;
    }
    std::vector<std::string> n;
    const std::string l = "model.layers." + std::to_string(block - 1) + ".";
    // Every layer's tensors have the same names (a dense layer among routed
    // ones has a dense layer's): those of a one-layer model's layer (not
    // the whole model's specs for each layer named).
    GptConfig one = config;
    one.n_layer = 1;
    one.dense_layers.clear();
    if (config.moe() && !config.moe_in(block - 1)) {
      one.dense_layers = {0};
      one.n_layer = 2;  // a routed layer besides
    }
    const std::vector<BlockSpec> specs = GptBlockSpecs(one);  // (a temporary's element would not outlive the loop)
    for (const TensorSpec& t : specs[1].tensors) {
      const char c = t.name[0];
      const bool attn = t.name[1] == '_' && (c == 'q' || c == 'k' || c == 'v' || c == 'o');
      const bool mlp = t.name.rfind("gate", 0) == 0 || t.name.rfind("up", 0) == 0 || t.name.rfind("down", 0) == 0 ||
                       t.name.rfind("experts.", 0) == 0 || t.name.rfind("shared_expert", 0) == 0;
      // The router's tensors under transformers' names.
      if (t.name == "router.weight") {
        n.push_back(l + "mlp.gate.weight");
        continue;
      }
      if (t.name == "router.score_correction_bias") {
        n.push_back(l + "mlp.gate.e_score_correction_bias");
        continue;
      }
      n.push_back(l + (attn ? "self_attn." : mlp ? "mlp." : "") + t.name);
    }
    return n;
  }
  if (block == kEmbedBlock) return {"wte", "wpe"};
  if (block == HeadBlock(config)) {
    std::vector<std::string> n = {"ln_f.weight", "ln_f.bias"};
    if (!config.tied_embeddings) n.push_back("lm_head.weight");
    return n;
  }
  const std::string h = "h." + std::to_string(block - 1) + ".";
  return {h + "ln_1.weight",        h + "ln_1.bias",        h + "attn.c_attn.weight", h + "attn.c_attn.bias",
          h + "attn.c_proj.weight", h + "attn.c_proj.bias", h + "ln_2.weight",        h + "ln_2.bias",
          h + "mlp.c_fc.weight",    h + "mlp.c_fc.bias",    h + "mlp.c_proj.weight",  h + "mlp.c_proj.bias"};
}

struct Trainer::Impl {
  Config config;
  TrainerOptions options;
  const GptConfig& model() const { return options.model; }
  int batch() const { return static_cast<int>(config.train_micro_batch_size_per_gpu); }

  std::unique_ptr<comm::Communicator> owned_comm;
  comm::Communicator* comm = nullptr;
  std::unique_ptr<Device> owned_device;
  Device* device = nullptr;
  FetchLayout layout;      // the engine's blocks: the model's, layers cut by options.fetch_unit
  int64_t fetch_unit = 0;  // the unit the layout was cut by (agreed by the ranks); 0: whole layers
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Ops<float>> ops;
  TimedOps* timed_ops = nullptr;  // ops, when wall_clock_breakdown times them
  std::unique_ptr<GptCompute<float>> compute;

  Tokens tokens;  // the token file mapped, or the built-in corpus
  std::string data_identity;
  size_t num_train_tokens = 0;
  std::optional<DataLoader> train_loader;
  std::vector<int32_t> inputs, targets;

  // Device scratch: fp32 copies of acquired blocks (two: the head and, when
  // tied, the embedding at once), one block's gradients, the embedding's
  // gradients (alive through a whole backward pass).
  float* param_scratch = nullptr;
  float* embed_scratch = nullptr;
  float* grad_scratch = nullptr;
  // With kernels on a stream and room for it (TrainerGradBuffers): a
  // second buffer for the layers' gradients, taken by turns with the first,
  // so that one block's gradient is copied to the host while the next
  // block's backward computes into the other. Each buffer's last copy out:
  // the stream waits for it before the buffer is written again.
  float* grad_scratch2 = nullptr;
  std::shared_ptr<Event> grad_copied[2];
  int grad_turn = 0;  // the buffer the last layer backward took
  float* embed_grads = nullptr;
  int64_t scratch_bytes = 0;

  int64_t steps_done = 0;
  double compute_seconds = 0.0;  // accumulates inside a step

  // Kernels and the engine's copies may still be queued (after a step that
  // failed half way) and read the activations and scratch freed here: the
  // ops' stream drains first, then the engine's (its destructor).
  ~Impl() {
    if (ops != nullptr) ops->Synchronize().IgnoreError();
    compute.reset();
    engine.reset();
    if (device != nullptr) {
      for (float* p : {param_scratch, embed_scratch, grad_scratch, grad_scratch2, embed_grads}) device->Free(p);
    }
    ops.reset();
  }

  const BlockSpec& spec(BlockId b) const { return engine->block(b); }

  // The summed losses of the next `batches` batches of `loader`, forward
  // only (with `cross_entropy`, less the routers' load-balancing loss). The
  // walk is not the training order: it is kept out of the prefetch record.
  StatusOr<double> ForwardLossSum(DataLoader& loader, int64_t batches, bool cross_entropy = false) {
    // A forward-only trainer has no training order: its passes are the
    // order the prefetch follows (each one ended by EndForwardPass).
    const bool trains = !options.engine.forward_only;
    if (trains) engine->SetTracing(false);
    double sum = 0.0;
    Status s;
    for (int64_t i = 0; i < batches && s.ok(); ++i) {
      loader.Next(inputs.data(), targets.data());
      StatusOr<double> loss = MicroBatch(/*backward=*/false);
      if (loss.ok()) {
        sum += cross_entropy ? compute->cross_entropy() : *loss;
      } else {
        s = loss.status();
      }
      if (s.ok() && !trains) s = engine->EndForwardPass();
      // The batch's kernel times are no step's: dropped as they come, so
      // a long evaluation does not pile up timing marks.
      if (s.ok() && timed_ops != nullptr) s = timed_ops->Take().status();
    }
    if (trains) engine->SetTracing(true);
    ZINF_RETURN_IF_ERROR(s);
    return sum;
  }

  StatusOr<float*> AllocateFloats(int64_t n) {
    if (n == 0) return nullptr;
    ZINF_ASSIGN_OR_RETURN(void* p, device->Allocate(static_cast<size_t>(n) * sizeof(float)));
    scratch_bytes += n * static_cast<int64_t>(sizeof(float));
    return static_cast<float*>(p);
  }

  using LayerParams = GptCompute<float>::LayerParams;

  // A layer piece's tensors at their layer places (AtLayerPlaces), acquired:
  // its matrices in the engine's 16-bit type when the ops read them so (no
  // fp32 copy, the same bits), the rest as AcquireAsFloat gives them. The
  // piece stays acquired.
  StatusOr<LayerParams> AcquireLayerPiece(BlockId e) {
    const ElementType type = engine->param_type();
    if (!ops->reads_weights16() || !kernels::cpu::IsWeight16(type)) {
      ZINF_ASSIGN_OR_RETURN(auto p, AcquireAsFloat(e, param_scratch));
      return LayerParams{AtLayerPlaces(e, p), {}, ElementType::kBf16};
    }
    const std::vector<int>& places = layout.piece(e).tensors;
    auto matrix = [&](size_t t) { return IsLayerMatrix(model(), places[t]); };
    std::vector<const void*> kept;
    ZINF_ASSIGN_OR_RETURN(auto p, AcquireAsFloat(e, param_scratch, matrix, &kept));
    return LayerParams{AtLayerPlaces(e, p), AtLayerPlaces(e, kept), type};
  }

  // The block's tensors as fp32 device arrays: the engine's own when it
  // keeps fp32, else cast into `scratch`. With `keep16`: the tensors it
  // picks are not cast when the engine keeps 16 bits; they go to `*kept`
  // as they are (null in the result; `*kept` is null for the others). The
  // block stays acquired.
  StatusOr<std::vector<const float*>> AcquireAsFloat(BlockId b, float* scratch,
                                                     const std::function<bool(size_t)>& keep16 = nullptr,
                                                     std::vector<const void*>* kept = nullptr) {
    ZINF_ASSIGN_OR_RETURN(std::vector<void*> ptrs, engine->Acquire(b));
    std::vector<const float*> out;
    out.reserve(ptrs.size());
    const ElementType type = engine->param_type();
    int64_t offset = 0;
    const auto t0 = Clock::now();
    if (kept != nullptr) kept->assign(ptrs.size(), nullptr);
    for (size_t t = 0; t < ptrs.size(); ++t) {
      if (type == ElementType::kF32) {
        out.push_back(static_cast<const float*>(ptrs[t]));
        continue;
      }
      if (keep16 && keep16(t)) {
        (*kept)[t] = ptrs[t];
        out.push_back(nullptr);
        continue;
      }
      const int64_t n = spec(b).tensors[t].numel();
      ops->CastIn(scratch + offset, ptrs[t], type, n);
      out.push_back(scratch + offset);
      offset += n;
    }
    compute_seconds += SecondsSince(t0);
    return out;
  }

  // Gradient arrays of block `b` laid out in `buf`, as they are.
  std::vector<float*> GradArrays(BlockId b, float* buf) const {
    std::vector<float*> out;
    int64_t offset = 0;
    for (const TensorSpec& t : spec(b).tensors) {
      out.push_back(buf + offset);
      offset += t.numel();
    }
    return out;
  }
  // The same, zeroed (for kernels that add into them).
  std::vector<float*> ZeroedGrads(BlockId b, float* buf) {
    std::vector<float*> out = GradArrays(b, buf);
    ops->Zero(buf, spec(b).numel());
    return out;
  }

  static std::vector<const void*> AsConst(const std::vector<float*>& v) { return {v.begin(), v.end()}; }

  // Kernel time: waits for the queued kernels.
  Status SyncCompute() {
    const auto t0 = Clock::now();
    Status s = ops->Synchronize();
    compute_seconds += SecondsSince(t0);
    return s;
  }

  // Hands block b back after the kernels queued on it: behind the ops'
  // stream when they queue on one (the engine reuses the memory once they
  // have run; the host does not wait), else once they have been checked.
  Status ReleaseAfterCompute(BlockId b) {
    if (void* stream = ops->stream()) return engine->Release(b, stream);
    ZINF_RETURN_IF_ERROR(SyncCompute());
    return engine->Release(b);
  }

  template <typename F>
  Status Timed(F&& f) {
    const auto t0 = Clock::now();
    Status s = f();
    compute_seconds += SecondsSince(t0);
    return s;
  }

  // A layer piece's tensors (piece order) at their places among the layer's
  // tensors (GptCompute's order); the other places null.
  template <typename P>
  std::vector<P> AtLayerPlaces(BlockId piece, const std::vector<P>& v) const {
    std::vector<P> out(spec_tensor_count(layout.piece(piece).model_block), nullptr);
    const std::vector<int>& places = layout.piece(piece).tensors;
    for (size_t i = 0; i < v.size(); ++i) out[static_cast<size_t>(places[i])] = v[i];
    return out;
  }
  size_t spec_tensor_count(BlockId model_block) const {
    size_t n = 0;
    for (BlockId e : layout.pieces_of(model_block)) n += spec(e).tensors.size();
    return n;
  }

  // Layer l's forward, piece by piece: each piece is acquired right before
  // its groups run and released right after.
  Status LayerForward(int l) {
    for (BlockId e : layout.pieces_of(LayerBlock(l))) {
      const FetchPiece& piece = layout.piece(e);
      ZINF_ASSIGN_OR_RETURN(LayerParams p, AcquireLayerPiece(e));
      ZINF_RETURN_IF_ERROR(
          Timed([&] { return compute->LayerForwardGroups(l, piece.begin_group, piece.end_group, p); }));
      ZINF_RETURN_IF_ERROR(ReleaseAfterCompute(e));
    }
    return Status::Ok();
  }

  // Layer l's recompute before its backward: walks the pieces forward; the
  // last piece stays acquired when the recompute needs it (its block id
  // and parameters are returned in *held / *held_params, else -1).
  Status LayerRecompute(int l, BlockId* held, LayerParams* held_params) {
    *held = -1;
    for (BlockId e : layout.pieces_of(LayerBlock(l))) {
      const FetchPiece& piece = layout.piece(e);
      if (piece.begin_group >= kMlpOutGroup) break;  // the recompute stops before the last group
      ZINF_ASSIGN_OR_RETURN(*held_params, AcquireLayerPiece(e));
      const int end = std::min(piece.end_group, static_cast<int>(kMlpOutGroup));
      ZINF_RETURN_IF_ERROR(
          Timed([&] { return compute->LayerRecomputeGroups(l, piece.begin_group, end, *held_params); }));
      if (piece.end_group == kLayerGroups) {
        *held = e;  // the last piece: its backward comes next
        break;
      }
      ZINF_RETURN_IF_ERROR(ReleaseAfterCompute(e));
    }
    return Status::Ok();
  }

  // Layer l's backward: the recompute (none when the activations are
  // kept), then the pieces in reverse, each piece's gradients reduced as
  // soon as its groups are done. Whole layers: one acquire, as before
  // pieces existed.
  Status LayerBackward(int l) {
    const std::vector<BlockId>& pieces = layout.pieces_of(LayerBlock(l));
    BlockId held = -1;
    LayerParams held_params;
    if (!compute->keeps_activations()) ZINF_RETURN_IF_ERROR(LayerRecompute(l, &held, &held_params));
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      const BlockId e = *it;
      const FetchPiece& piece = layout.piece(e);
      if (e != held) {  // only one piece is acquired at a time: they share param_scratch
        ZINF_ASSIGN_OR_RETURN(held_params, AcquireLayerPiece(e));
      }
      // The groups set their tensors' gradients (kSet): no zeroing pass
      // over the scratch, and the CPU's weight matmuls do not read it.
      grad_turn = grad_scratch2 != nullptr ? 1 - grad_turn : 0;
      ZINF_ASSIGN_OR_RETURN(float* buf, ClaimGradBuffer(grad_turn));
      std::vector<float*> g = GradArrays(e, buf);
      ZINF_RETURN_IF_ERROR(Timed([&] {
        return compute->LayerBackwardGroups(l, piece.begin_group, piece.end_group, held_params, AtLayerPlaces(e, g),
                                            kernels::GradMode::kSet);
      }));
      ZINF_RETURN_IF_ERROR(ReduceAfterCompute(e, g, grad_turn));
    }
    return Status::Ok();
  }

  // Gradient buffer k (0: grad_scratch, 1: grad_scratch2), once the ops'
  // stream has been made to wait for its last copy to the host.
  StatusOr<float*> ClaimGradBuffer(int k) {
    if (grad_copied[k]) {  // kept until waited for: after a failed wait the next claim waits again
      ZINF_RETURN_IF_ERROR(device->WaitOn(ops->stream(), *grad_copied[k]).WithContext("trainer: gradient buffer"));
      grad_copied[k].reset();
    }
    return k == 0 ? grad_scratch : grad_scratch2;
  }

  // Hands block b back and its gradients `g` (in buffer k) over after the
  // kernels queued on them: behind the ops' stream when they queue on one
  // (the engine copies the gradients once the kernels have run, and
  // grad_copied[k] gets the event after those copies, which the stream
  // waits for before it writes buffer k again; the host does not wait),
  // else once they have been checked.
  Status ReduceAfterCompute(BlockId b, const std::vector<float*>& g, int k) {
    ZINF_RETURN_IF_ERROR(ReleaseAfterCompute(b));
    void* stream = ops->stream();
    if (stream == nullptr) return engine->ReduceGradients(b, AsConst(g));
    return EngineAccess::ReduceGradients(*engine, b, AsConst(g), stream, &grad_copied[k]);
  }

  // One micro-batch on the host arrays `inputs`/`targets`: forward, and
  // with `backward` the backward pass and every block's ReduceGradients.
  // Returns the mean loss.
  StatusOr<double> MicroBatch(bool backward) {
    ZINF_RETURN_IF_ERROR(compute->SetBatch(inputs.data(), targets.data()));
    const BlockId head = layout.head(), embed = layout.embed();
    {
      ZINF_ASSIGN_OR_RETURN(auto p, AcquireAsFloat(embed, model().tied_embeddings ? embed_scratch : param_scratch));
      ZINF_RETURN_IF_ERROR(Timed([&] { return compute->EmbedForward(p); }));
      ZINF_RETURN_IF_ERROR(ReleaseAfterCompute(embed));
    }
    for (int l = 0; l < model().n_layer; ++l) ZINF_RETURN_IF_ERROR(LayerForward(l));
    double loss = 0.0;
    {
      ZINF_ASSIGN_OR_RETURN(auto h, AcquireAsFloat(head, param_scratch));
      const float* lm_head = nullptr;
      if (model().tied_embeddings) {
        ZINF_ASSIGN_OR_RETURN(auto e, AcquireAsFloat(embed, embed_scratch));
        lm_head = e[kWte];
      } else {
        lm_head = h[LmHeadIndex(model())];
      }
      GptCompute<float>::HeadGrads grads;
      if (backward) {
        ZINF_ASSIGN_OR_RETURN(float* buf, ClaimGradBuffer(0));
        grads.head = ZeroedGrads(head, buf);
        std::vector<float*> eg = ZeroedGrads(embed, embed_grads);
        grads.lm_head = model().tied_embeddings ? eg[kWte] : grads.head[LmHeadIndex(model())];
      }
      const double scale = config.fp16.enabled ? engine->loss_scale() : 1.0;
      const auto t0 = Clock::now();
      StatusOr<double> l = compute->HeadForward(h, lm_head, backward ? &grads : nullptr, scale);
      compute_seconds += SecondsSince(t0);
      ZINF_RETURN_IF_ERROR(l.status());
      loss = *l;
      ZINF_RETURN_IF_ERROR(SyncCompute());
      ZINF_RETURN_IF_ERROR(engine->Release(head));
      if (model().tied_embeddings) ZINF_RETURN_IF_ERROR(engine->Release(embed));
      if (backward) ZINF_RETURN_IF_ERROR(engine->ReduceGradients(head, AsConst(grads.head)));
    }
    if (!backward) return loss;
    for (int l = model().n_layer - 1; l >= 0; --l) ZINF_RETURN_IF_ERROR(LayerBackward(l));
    // The embedding's backward needs only the tokens, not its weights.
    std::vector<float*> eg;
    int64_t offset = 0;
    for (const TensorSpec& t : spec(embed).tensors) {
      eg.push_back(embed_grads + offset);
      offset += t.numel();
    }
    ZINF_RETURN_IF_ERROR(Timed([&] { return compute->EmbedBackward(eg); }));
    ZINF_RETURN_IF_ERROR(SyncCompute());
    ZINF_RETURN_IF_ERROR(engine->ReduceGradients(embed, AsConst(eg)));
    return loss;
  }

  // A model block's fp32 master weights, from its pieces, into `master`
  // (one array per tensor, GptBlockSpecs order), reusing its arrays: a
  // caller reading layer after layer into the same one allocates (and the
  // kernel zeroes) nothing after the first. An array larger than its
  // tensor is given back first, so no more than one block is held (the
  // embedding's rows are not kept through the layers). Collective
  // (GetMasterParameters gathers).
  Status ReadModelBlock(BlockId model_block, std::vector<std::vector<float>>* master) {
    master->resize(spec_tensor_count(model_block));
    for (BlockId e : layout.pieces_of(model_block)) {
      const BlockSpec& s = spec(e);
      std::vector<float*> out;
      for (size_t i = 0; i < s.tensors.size(); ++i) {
        std::vector<float>& t = (*master)[static_cast<size_t>(layout.piece(e).tensors[i])];
        const auto n = static_cast<size_t>(s.tensors[i].numel());
        if (t.capacity() > n) std::vector<float>().swap(t);
        t.resize(n);
        out.push_back(t.data());
      }
      ZINF_RETURN_IF_ERROR(engine->GetMasterParameters(e, out));
    }
    return Status::Ok();
  }

  // A model block's initial values, `fill` speaking of its tensors
  // (GptBlockSpecs order), into each of its pieces.
  Status SetModelBlock(BlockId model_block, const std::function<Status(size_t, int64_t, int64_t, float*)>& fill) {
    for (BlockId piece : layout.pieces_of(model_block)) {
      const std::vector<int>& tensors = layout.piece(piece).tensors;  // the model block's tensors it holds
      ZINF_RETURN_IF_ERROR(engine->SetParameters(piece, [&](size_t t, int64_t first, int64_t count, float* out) {
        return fill(static_cast<size_t>(tensors[t]), first, count, out);
      }));
    }
    return Status::Ok();
  }
  // `local` on this rank, else kAborted when another rank's failed (`what`: "resume", "export").
  Status AgreeAcrossRanks(Status local, const char* what = "resume");
  // kFailedPrecondition naming `what` on a forward-only trainer.
  Status Trains(const char* what) const {
    if (!options.engine.forward_only) return Status::Ok();
    return Status::FailedPrecondition(std::string("trainer: ") + what +
                                      " on a forward-only trainer (TrainerOptions::engine.forward_only)");
  }

  std::map<std::string, std::string> Metadata() const {
    const LoaderPosition pos = train_loader->position();
    return {{"trainer.step", std::to_string(steps_done)},
            {"trainer.loader_epoch", std::to_string(pos.epoch)},
            {"trainer.loader_batch", std::to_string(pos.batch)},
            {"trainer.model", GptConfigToJson(model())},
            {"trainer.data", data_identity},
            {"trainer.seed", std::to_string(options.seed)},
            {"trainer.weight_decay_on", WeightDecayOnName(options.weight_decay_on)},
            {"trainer.fetch_layout", layout.Describe()},
            {"trainer.fetch_unit", std::to_string(fetch_unit)},
            {"trainer.micro_batch", std::to_string(batch())},
            {"trainer.gradient_accumulation_steps", std::to_string(config.gradient_accumulation_steps)},
            {"trainer.data_order", DataOrderName(options.data_order)},
            {"trainer.train_tokens", std::to_string(num_train_tokens)}};
  }

  // What a checkpoint made before a key existed implies for it (absent:
  // the key is then not checked).
  static std::optional<std::string> ImpliedWhenMissing(const std::string& key) {
    if (key == "trainer.data_order") return std::string("shuffled");
    return std::nullopt;
  }

  Status ResumeFrom(const std::string& path, bool weights_only);
};

StatusOr<WeightDecayOn> ParseWeightDecayOn(const std::string& name) {
  if (name == "matrices") return WeightDecayOn::kMatrices;
  if (name == "all") return WeightDecayOn::kAll;
  return Status::InvalidArgument("weight decay on '" + name + "': expected matrices or all");
}

const char* WeightDecayOnName(WeightDecayOn on) { return on == WeightDecayOn::kAll ? "all" : "matrices"; }

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

// The model's own device memory (activations for a micro-batch, fp32
// scratch for the largest block's parameters and gradients, the embedding's
// gradient) did not fit beside the engine's: an out-of-memory error that
// says what the working set is, with the engine's least (what it holds now
// and one gathered block of the largest size), and what budget would hold
// it; other errors pass through.
Status WorkingSetError(const Trainer::Impl& m, const Status& s, int64_t engine_bytes, int64_t scratch_elems,
                       int64_t max_block) {
  if (s.code() != StatusCode::kOutOfMemory) return s;
  const int64_t capacity = static_cast<int64_t>(m.device->capacity_bytes());
  const int64_t scratch = scratch_elems * static_cast<int64_t>(sizeof(float));
  const bool cuda = m.device->kind() == DeviceKind::kCuda;
  const int64_t activations = ActivationBytes(m.model(), m.batch(), KernelsFor(cuda, m.options.gpu_compute16),
                                              ElementSizeBytes(m.engine->param_type()), m.options.activations);
  const int64_t gathered = max_block * ElementSizeBytes(m.engine->param_type());
  const int64_t need = engine_bytes + gathered + activations + scratch;
  return Status::OutOfMemory(
      "device out of memory for the model's working set: activations " + FormatBytes(activations) + " (micro-batch " +
      std::to_string(m.batch()) + " x " + std::to_string(m.model().seq_len) + " tokens) and fp32 scratch " +
      FormatBytes(scratch) + " (the largest block or piece, " + FormatCount(max_block) +
      " parameters, and the embedding's gradient), beside the engine's " + FormatBytes(engine_bytes) +
      " and one gathered block of " + FormatBytes(gathered) + ", need at least " + FormatBytes(need) +
      "; the device has " + FormatBytes(capacity) + ": raise --device-budget to more than " + FormatBytes(need) +
      " (`zinf plan` itemizes it), " +
      (m.options.activations == LayerActivations::kKeep
           ? "recompute the layers' activations (--activations recompute keeps one layer's, not every layer's), "
       : m.options.activations == LayerActivations::kRecompute
           ? "keep the layer inputs in pinned host memory (--activations offload, or the config's "
             "activation_checkpointing.cpu_checkpointing), "
           : "") +
      "fetch layers in smaller pieces with --fetch-unit (now " + m.layout.Describe() +
      "), or lower train_micro_batch_size_per_gpu / --seq-len (" + s.message() + ")");
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const Config& config, const TrainerOptions& options) {
  auto m = std::make_unique<Impl>();
  m->config = config;
  m->options = options;
  if (config.train_micro_batch_size_per_gpu <= 0 || config.train_micro_batch_size_per_gpu > (1 << 20)) {
    return Status::InvalidArgument("train_micro_batch_size_per_gpu must be in 1..2^20, got " +
                                   std::to_string(config.train_micro_batch_size_per_gpu));
  }

  // Ranks: MPI when launched with several, else one.
  ZINF_ASSIGN_OR_RETURN(m->comm, comm::HostCommunicator(options.hooks.host_communicator, m->owned_comm));
  m->device = options.hooks.device;
  if (m->device == nullptr) {
    ZINF_ASSIGN_OR_RETURN(m->owned_device, CreateDevice(DeviceOptions{}));
    m->device = m->owned_device.get();
  }

  // Data first: a bad file is reported before anything big is allocated.
  if (options.data_path.empty()) {
    if (m->model().vocab_size < ByteTokenizer::kVocabSize) {
      return Status::InvalidArgument(
          "the built-in corpus needs vocab_size >= " + std::to_string(ByteTokenizer::kVocabSize) +
          " (bytes and end-of-text), the model has " + std::to_string(m->model().vocab_size));
    }
    m->tokens = Tokens(BuiltinCorpusTokens(options.corpus_bytes, options.seed));
    m->data_identity =
        "builtin-corpus bytes=" + std::to_string(options.corpus_bytes) + " seed=" + std::to_string(options.seed);
  } else {
    ZINF_ASSIGN_OR_RETURN(m->tokens, Tokens::Map(options.data_path, m->model().vocab_size));
    m->data_identity = m->tokens.Identity();
  }
  const double eval_fraction = std::clamp(options.eval_fraction, 0.0, 0.5);
  const auto all = static_cast<size_t>(m->tokens.size());
  m->num_train_tokens = all - static_cast<size_t>(static_cast<double>(all) * eval_fraction);
  const TokenView train = m->tokens.view().Sub(0, static_cast<int64_t>(m->num_train_tokens));
  ZINF_ASSIGN_OR_RETURN(DataLoader loader,
                        DataLoader::Create(train, m->batch(), m->model().seq_len, options.seed, m->comm->rank(),
                                           m->comm->world_size(), options.data_order));
  m->train_loader.emplace(std::move(loader));
  const size_t bt = static_cast<size_t>(m->batch()) * static_cast<size_t>(m->model().seq_len);
  m->inputs.resize(bt);
  m->targets.resize(bt);

  // The engine, then the weights.
  std::vector<BlockSpec> specs = GptBlockSpecs(m->model());
  if (options.weight_decay_on == WeightDecayOn::kAll) {
    for (BlockSpec& b : specs) {
      for (TensorSpec& t : b.tensors) t.decay = !IsFrozenTensor(t);
    }
  }
  EngineHooks hooks = options.hooks;
  hooks.device = m->device;
  hooks.host_communicator = m->comm;
  EngineOptions eo = options.engine;
  eo.hooks = &hooks;
  eo.grad_type = ElementType::kF32;
  if (options.fetch_unit < 0) {
    return Status::InvalidArgument("fetch unit must be >= 0 elements (0: whole layers), got " +
                                   std::to_string(options.fetch_unit));
  }
  // Every rank must cut layers alike (the engine's blocks are collective):
  // the smallest unit any rank asked for (ranks with smaller devices resolve
  // `auto` smaller). 0, whole layers, is the largest.
  double neg_unit = options.fetch_unit == 0 ? -1e300 : -static_cast<double>(options.fetch_unit);  // max = -min
  ZINF_RETURN_IF_ERROR(m->comm->AllReduce(&neg_unit, &neg_unit, 1, ElementType::kF64, comm::ReduceOp::kMax, nullptr));
  m->fetch_unit = neg_unit <= -1e300 ? 0 : static_cast<int64_t>(-neg_unit);
  m->layout = FetchLayout::Create(m->model(), specs, m->fetch_unit);
  // Likewise the activations: a recompute acquires blocks that a backward
  // on kept activations does not, so one rank that recomputes makes every
  // rank recompute (ranks with smaller devices resolve `auto` so). Where
  // a rank keeps its layer inputs (on the device or offloaded) is its own.
  double recompute = options.activations != LayerActivations::kKeep ? 1.0 : 0.0;
  ZINF_RETURN_IF_ERROR(m->comm->AllReduce(&recompute, &recompute, 1, ElementType::kF64, comm::ReduceOp::kMax, nullptr));
  if (recompute > 0 && options.activations == LayerActivations::kKeep) {
    m->options.activations = LayerActivations::kRecompute;
  }
  ZINF_ASSIGN_OR_RETURN(m->engine, Engine::Create(config, m->layout.specs(), eo));
  // Initial weights by model block (the same values however layers are
  // cut). Setting them is each rank's own work; a rank whose reads fail
  // says so to the others (which would otherwise go on to the first step's
  // collectives and wait there for it).
  // Random ones are drawn for this rank's ranges alone, as the engine
  // stages them (no block whole in RAM).
  std::function<Status(BlockId, size_t, int64_t, int64_t, float*)> initial = options.initial_weights;
  if (!initial) {
    initial = [random = RandomInit(m->model(), options.seed)](BlockId b, size_t t, int64_t first, int64_t count,
                                                              float* out) {
      random.Fill(b, t, first, count, out);
      return Status::Ok();
    };
  }
  Status loaded = Status::Ok();
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()) && loaded.ok(); ++b) {
    loaded = m->SetModelBlock(
        b, [&](size_t t, int64_t first, int64_t count, float* out) { return initial(b, t, first, count, out); });
  }
  ZINF_RETURN_IF_ERROR(m->AgreeAcrossRanks(loaded, "load the initial weights"));

  // Kernels, activations and scratch on the engine's device.
  const auto engine_bytes = static_cast<int64_t>(m->device->bytes_in_use());
  ZINF_ASSIGN_OR_RETURN(
      m->ops, CreateOps(*m->device, options.gpu_compute16 && kernels::cpu::IsWeight16(m->engine->param_type()),
                        options.host_stream));
  if (config.wall_clock_breakdown) {  // every kernel call timed on the device (StepReport::kernels)
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<TimedOps> timed, TimedOps::Create(std::move(m->ops), *m->device));
    m->timed_ops = timed.get();
    m->ops = std::move(timed);
  }
  // The embedding has scratch of its own (its gradients; with a tied head
  // its fp32 cast, which its forward uses too), so the blocks' scratch is
  // sized by the others: the largest layer piece, or the head. The fp32
  // cast holds what AcquireAsFloat casts of one block: with ops that read
  // the layers' matrices in 16 bits (AcquireLayerPiece), all but those.
  // TrainerScratchFor sizes each array; `zinf plan` counts the same.
  const int64_t max_block = m->layout.max_piece_elems();
  const bool cast = m->engine->param_type() != ElementType::kF32;
  // A second gradient buffer for the layers when the ops queue on a stream
  // and the working set fits with it (`zinf plan` counts the same).
  const int grad_buffers =
      options.grad_buffers > 0
          ? options.grad_buffers
          : TrainerGradBuffers(
                m->model(), m->batch(), KernelsFor(m->device->kind() == DeviceKind::kCuda, options.gpu_compute16),
                m->ops->stream() != nullptr, static_cast<int64_t>(m->device->capacity_bytes()), engine_bytes,
                ElementSizeBytes(m->engine->param_type()), m->layout, m->options.activations);
  TrainerScratch sizes =
      TrainerScratchFor(m->layout, m->model().tied_embeddings, cast, m->ops->reads_weights16(), grad_buffers);
  if (options.engine.forward_only) sizes.grads = sizes.grads2 = sizes.embed_grads = 0;  // no backward
  const std::pair<float**, int64_t> scratch[] = {{&m->param_scratch, sizes.param_cast},
                                                 {&m->embed_scratch, sizes.embed_cast},
                                                 {&m->grad_scratch, sizes.grads},
                                                 {&m->grad_scratch2, sizes.grads2},
                                                 {&m->embed_grads, sizes.embed_grads}};
  const int64_t scratch_elems = sizes.elems();
  auto compute = GptCompute<float>::Create(m->model(), m->batch(), m->ops.get(), m->device, m->options.activations);
  if (!compute.ok()) return WorkingSetError(*m, compute.status(), engine_bytes, scratch_elems, max_block);
  m->compute = std::move(*compute);
  for (const auto& [dst, n] : scratch) {
    auto p = m->AllocateFloats(n);
    // The second gradient buffer is a speed-up: chosen by the trainer and
    // not there, the backward takes one.
    if (!p.ok() && dst == &m->grad_scratch2 && options.grad_buffers == 0) continue;
    if (!p.ok()) return WorkingSetError(*m, p.status(), engine_bytes, scratch_elems, max_block);
    *dst = *p;
  }
  // The layers' gradients are set in the scratch, never added to it
  // (GradMode::kSet): it starts as NaN, so a tensor some backward failed to
  // write reaches the engine as NaN (the norm, then every loss), not as an
  // earlier layer's values that would still train.
  if (m->grad_scratch != nullptr) {
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> s, m->device->CreateStream());
    ZINF_RETURN_IF_ERROR(s->MemsetAsync(m->grad_scratch, 0xFF, static_cast<size_t>(sizes.grads) * sizeof(float)));
    if (m->grad_scratch2 != nullptr) {
      ZINF_RETURN_IF_ERROR(s->MemsetAsync(m->grad_scratch2, 0xFF, static_cast<size_t>(sizes.grads2) * sizeof(float)));
    }
    ZINF_RETURN_IF_ERROR(s->Synchronize().WithContext("trainer: filling the gradient scratch"));
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(m)));
}

StatusOr<StepReport> Trainer::Step() {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.Trains("Step"));
  const auto t0 = Clock::now();
  const EngineCounters before = m.engine->counters();
  m.compute_seconds = 0.0;
  if (m.timed_ops != nullptr)
    ZINF_RETURN_IF_ERROR(m.timed_ops->Take().status());  // an evaluation's calls: not this step's
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < m.config.gradient_accumulation_steps; ++micro) {
    m.train_loader->Next(m.inputs.data(), m.targets.data());
    ZINF_ASSIGN_OR_RETURN(double loss, m.MicroBatch(/*backward=*/true));
    loss_sum += loss;
    const double scale_used = m.config.fp16.enabled ? m.engine->loss_scale() : 1.0;
    ZINF_ASSIGN_OR_RETURN(StepResult r, m.engine->Step());
    if (r.boundary) {
      ++m.steps_done;
      StepReport report;
      report.step = m.steps_done;
      double mean = loss_sum / static_cast<double>(m.config.gradient_accumulation_steps);
      ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&mean, &mean, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
      report.loss = mean / m.comm->world_size();
      report.lr = r.lr;
      report.grad_norm = r.grad_norm / scale_used;  // the engine's is of the loss-scaled gradient
      report.loss_scale = r.loss_scale;
      report.applied = r.applied;
      report.tokens = tokens_per_step();
      if (m.timed_ops != nullptr) {
        ZINF_ASSIGN_OR_RETURN(report.kernels, m.timed_ops->Take());
      }
      report.seconds = SecondsSince(t0);
      report.compute_seconds = m.compute_seconds;
      report.engine = CountersSince(before, m.engine->counters());
      return report;
    }
  }
  return Status::Internal("trainer: gradient_accumulation_steps micro-batches did not end an optimizer step");
}

bool Trainer::can_evaluate() const {
  const Impl& m = *impl_;
  const TokenView eval = m.tokens.view().Sub(static_cast<int64_t>(m.num_train_tokens),
                                             m.tokens.size() - static_cast<int64_t>(m.num_train_tokens));
  return DataLoader::Create(eval, m.batch(), m.model().seq_len, m.options.seed, m.comm->rank(), m.comm->world_size())
      .ok();
}

StatusOr<double> Trainer::Evaluate(int batches) {
  Impl& m = *impl_;
  const TokenView eval = m.tokens.view().Sub(static_cast<int64_t>(m.num_train_tokens),
                                             m.tokens.size() - static_cast<int64_t>(m.num_train_tokens));
  auto loader =
      DataLoader::Create(eval, m.batch(), m.model().seq_len, m.options.seed, m.comm->rank(), m.comm->world_size());
  if (!loader.ok()) {
    return Status::FailedPrecondition("trainer: the held-out tokens (" + std::to_string(eval.size()) +
                                      ") are too few for one evaluation batch");
  }
  batches = static_cast<int>(std::min<int64_t>(batches, loader->batches_per_epoch()));
  ZINF_ASSIGN_OR_RETURN(const double sum, m.ForwardLossSum(*loader, batches));
  double mean = batches > 0 ? sum / batches : 0.0;
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&mean, &mean, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
  return mean / m.comm->world_size();
}

StatusOr<Trainer::InOrderEval> Trainer::EvaluateInOrder() {
  Impl& m = *impl_;
  const TokenView train = m.tokens.view().Sub(0, static_cast<int64_t>(m.num_train_tokens));
  ZINF_ASSIGN_OR_RETURN(DataLoader loader,
                        DataLoader::Create(train, m.batch(), m.model().seq_len, m.options.seed, m.comm->rank(),
                                           m.comm->world_size(), DataOrder::kSequential));
  const int64_t batches = loader.batches_per_epoch();
  // Perplexity's cross-entropy: without the routers' load-balancing loss.
  ZINF_ASSIGN_OR_RETURN(double sum, m.ForwardLossSum(loader, batches, /*cross_entropy=*/true));
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&sum, &sum, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
  InOrderEval e;
  e.windows = batches * m.comm->world_size();
  e.tokens = e.windows * m.batch() * m.model().seq_len;
  e.loss = sum / static_cast<double>(e.windows);
  return e;
}

Status Trainer::InitFromSafetensors(const std::string& path) {
  Impl& m = *impl_;
  if (m.steps_done != 0) return Status::FailedPrecondition("trainer: InitFromSafetensors after training started");
  // The header first (every name, shape and dtype checked before any block
  // is set), then each range of a tensor as the engine's staging asks for
  // it (each rank its shard's): one range in RAM.
  ZINF_ASSIGN_OR_RETURN(SafetensorsHeader file, ReadSafetensorsHeader(path));
  const std::string where = "init from " + path + ": ";
  const std::vector<BlockSpec> model_specs = GptBlockSpecs(m.model());
  std::vector<std::vector<const SafetensorsHeader::Entry*>> entries(model_specs.size());
  size_t used = 0;
  for (BlockId b = 0; b < static_cast<BlockId>(model_specs.size()); ++b) {
    const BlockSpec& spec = model_specs[static_cast<size_t>(b)];
    const std::vector<std::string> names = GptTensorExportNames(m.model(), b);
    for (size_t t = 0; t < spec.tensors.size(); ++t) {
      const SafetensorsHeader::Entry* in = file.Find(names[t]);
      if (in == nullptr) return Status::InvalidArgument(where + "tensor " + names[t] + " is missing");
      ++used;
      // The export leaves the vocabulary padding rows out; they start at 0.
      const std::vector<int64_t> shape = ExportShape(m.model(), model_specs, b, t);
      if (in->shape != shape) {
        auto dims = [](const std::vector<int64_t>& v) {
          std::string out;
          for (int64_t d : v) out += (out.empty() ? "" : ", ") + std::to_string(d);
          return "[" + out + "]";
        };
        return Status::InvalidArgument(where + "tensor " + names[t] + " has shape " + dims(in->shape) +
                                       ", this model expects " + dims(shape));
      }
      if (!SafetensorsFloatType(in->dtype)) {
        return Status::InvalidArgument(where + "tensor " + names[t] + " is " + in->dtype + " (F32, BF16 or F16)");
      }
      entries[static_cast<size_t>(b)].push_back(in);
    }
  }
  if (used != file.tensors.size()) {
    std::set<std::string> known;
    for (BlockId b = 0; b < static_cast<BlockId>(model_specs.size()); ++b) {
      for (std::string& n : GptTensorExportNames(m.model(), b)) known.insert(std::move(n));
    }
    for (const auto& t : file.tensors) {
      if (known.count(t.name) == 0) {
        return Status::InvalidArgument(where + "tensor " + t.name + " is not part of this model");
      }
    }
  }
  // Each range the engine asks for, read from the file as it asks: RAM
  // holds one range's bytes, never a block in fp32 beside the staging.
  std::vector<std::byte> raw;
  for (BlockId b = 0; b < static_cast<BlockId>(model_specs.size()); ++b) {
    const auto& block_entries = entries[static_cast<size_t>(b)];
    const Status set = m.SetModelBlock(b, [&](size_t t, int64_t first, int64_t count, float* out) {
      const SafetensorsHeader::Entry& in = *block_entries[t];
      const int64_t es = SafetensorsDtypeBytes(in.dtype);
      // The vocabulary padding rows are not in the file: they start at 0.
      const int64_t stored = static_cast<int64_t>(in.end - in.begin) / es;
      const int64_t n = std::clamp<int64_t>(stored - first, 0, count);
      raw.resize(static_cast<size_t>(n * es));
      if (n > 0) {
        ZINF_RETURN_IF_ERROR(ReadSafetensorsTensor(path, in, static_cast<uint64_t>(first * es), raw)
                                 .WithContext(where + "tensor " + in.name));
      }
      kernels::cpu::CastIn(out, raw.data(), *SafetensorsFloatType(in.dtype), n);
      std::fill(out + n, out + count, 0.0f);
      return Status::Ok();
    });
    ZINF_RETURN_IF_ERROR(set.WithContext(where + "block " + std::to_string(b)));
  }
  return Status::Ok();
}

StatusOr<std::string> Trainer::Save(const std::string& save_dir, int keep) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.Trains("Save"));
  ZINF_RETURN_IF_ERROR(swap::CheckKeepCheckpoints(keep, m.comm->world_size()).WithContext("save"));
  const std::string rank_dir = swap::RankDirectory(save_dir, m.comm->rank());
  ZINF_RETURN_IF_ERROR(MakeDirectories(rank_dir));
  const std::string dir = swap::StepDirectory(rank_dir, m.steps_done);
  // The folder rules (checkpoint_dirs.h): a step directory here that
  // `latest` does not name is an orphan, and is replaced.
  ZINF_RETURN_IF_ERROR(m.engine->SaveCheckpoint(dir, m.Metadata(), /*replace_orphan=*/true));
  ZINF_RETURN_IF_ERROR(swap::PruneCheckpoints(rank_dir, m.steps_done, keep).WithContext("pruning old checkpoints"));
  return dir;
}

// Every rank must come out of Resume the same way: one rank's failure is
// everyone's (or the others would go on into collectives alone).
Status Trainer::Impl::AgreeAcrossRanks(Status local, const char* what) {
  if (comm->world_size() == 1) return local;
  double failed = local.ok() ? 0.0 : 1.0;
  ZINF_RETURN_IF_ERROR(comm->AllReduce(&failed, &failed, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
  if (!local.ok()) return local;
  if (failed > 0) {
    return Status::Aborted(std::string(what) + ": " + std::to_string(static_cast<int>(failed)) +
                           " other rank(s) failed to " + what + " (see their errors)");
  }
  return Status::Ok();
}

Status Trainer::Resume(const std::string& path) { return impl_->ResumeFrom(path, /*weights_only=*/false); }

Status Trainer::LoadWeights(const std::string& path) { return impl_->ResumeFrom(path, /*weights_only=*/true); }

Status Trainer::Impl::ResumeFrom(const std::string& path, bool weights_only) {
  Impl& m = *this;
  if (m.steps_done != 0) return Status::FailedPrecondition("trainer: Resume after training started");
  if (!weights_only && m.options.engine.forward_only) {
    return Status::FailedPrecondition("trainer: Resume on a forward-only trainer (LoadWeights loads the weights)");
  }

  // 1. The step to resume, agreed by every rank: each rank's own (its
  //    `latest`, or the step directory named), and the oldest of them, which
  //    every rank has (checkpoint_dirs.h).
  StatusOr<swap::ResumePoint> point = swap::FindResumePoint(path, m.comm->rank(), m.comm->world_size());
  ZINF_RETURN_IF_ERROR(m.AgreeAcrossRanks(point.status().WithContext("resume")));
  const int64_t step = point->step;
  double neg_lo = -static_cast<double>(step), hi = static_cast<double>(step);  // min as max of negations
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&neg_lo, &neg_lo, 1, ElementType::kF64, comm::ReduceOp::kMax, nullptr));
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&hi, &hi, 1, ElementType::kF64, comm::ReduceOp::kMax, nullptr));
  const int64_t lo = static_cast<int64_t>(-neg_lo);
  if (lo != static_cast<int64_t>(hi)) {
    Log("train").warn("resume: ranks' latest checkpoints differ (steps {} to {}): every rank resumes step {}", lo,
                      static_cast<int64_t>(hi), lo);
  }
  const std::string dir = point->Checkpoint(lo);

  // 2. The manifest must describe this run before any state is loaded.
  const std::map<std::string, std::string> mine = m.Metadata();
  std::map<std::string, std::string> md;
  Status checked = [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(md, swap::ReadCheckpointMetadata(dir));
    std::vector<std::string> keys = {"trainer.model"};
    if (!weights_only) {
      keys.insert(keys.end(), {"trainer.data", "trainer.seed", "trainer.micro_batch",
                               "trainer.gradient_accumulation_steps", "trainer.data_order", "trainer.train_tokens"});
    }
    for (const std::string& key : keys) {
      auto it = md.find(key);
      const std::optional<std::string> implied = ImpliedWhenMissing(key);
      if (it == md.end() && !implied && key == "trainer.train_tokens") continue;  // older checkpoints
      const std::string theirs = it != md.end() ? it->second : implied ? *implied : std::string("<missing>");
      if (theirs != mine.at(key)) {
        return Status::FailedPrecondition("resume from " + dir + ": " + key + " was " + theirs + ", this run has " +
                                          mine.at(key) +
                                          "; resume with the saving run's model, data, batch, --data-order and "
                                          "--holdout");
      }
    }
    // The engine's blocks are the layers' pieces: another cut is another
    // set of blocks (checkpoints from before the key have whole layers).
    auto cut = md.find("trainer.fetch_layout");
    const std::string their_cut = cut == md.end() ? std::string("whole layers") : cut->second;
    if (their_cut != mine.at("trainer.fetch_layout")) {
      // The unit the saving run resolved (`auto` included), when it recorded one.
      auto unit = md.find("trainer.fetch_unit");
      const std::string flag = unit == md.end()      ? std::string("the saving run's")
                               : unit->second == "0" ? std::string("layer")
                                                     : unit->second;
      return Status::FailedPrecondition("resume from " + dir + ": trainer.fetch_layout was " + their_cut +
                                        ", this run has " + mine.at("trainer.fetch_layout") +
                                        "; resume with --fetch-unit " + flag + ", which cuts layers the same way");
    }
    // Checkpoints from before the key decayed every tensor. The weights
    // alone do not depend on it.
    if (weights_only) return Status::Ok();
    auto it = md.find("trainer.weight_decay_on");
    const std::string theirs = it == md.end() ? std::string("all") : it->second;
    if (theirs != mine.at("trainer.weight_decay_on")) {
      return Status::FailedPrecondition("resume from " + dir + ": trainer.weight_decay_on was " + theirs +
                                        ", this run has " + mine.at("trainer.weight_decay_on") +
                                        "; resume with --weight-decay-on " + theirs);
    }
    return Status::Ok();
  }();
  ZINF_RETURN_IF_ERROR(m.AgreeAcrossRanks(checked));

  // 3. Load (verifying every blob first), then the trainer's own position.
  Status loaded = [&]() -> Status {
    ZINF_RETURN_IF_ERROR(m.engine->LoadCheckpoint(dir).status());
    if (weights_only) return Status::Ok();
    auto number = [&](const std::string& key) { return swap::ManifestInteger(dir, md, key, /*min_value=*/0); };
    ZINF_ASSIGN_OR_RETURN(int64_t saved_step, number("trainer.step"));
    ZINF_ASSIGN_OR_RETURN(int64_t epoch, number("trainer.loader_epoch"));
    ZINF_ASSIGN_OR_RETURN(int64_t batch, number("trainer.loader_batch"));
    ZINF_RETURN_IF_ERROR(m.train_loader->Seek({epoch, batch}).WithContext("resume from " + dir));
    m.steps_done = saved_step;
    return Status::Ok();
  }();
  return m.AgreeAcrossRanks(loaded);
}

Status Trainer::ExportSafetensors(const std::string& path, const std::string& dtype) {
  Impl& m = *impl_;
  if (!SafetensorsFloatType(dtype)) {
    return Status::InvalidArgument("export: dtype must be F32, BF16 or F16, got '" + dtype + "'");
  }
  ZINF_RETURN_IF_ERROR(m.Trains("ExportSafetensors"));
  const ElementType type = *SafetensorsFloatType(dtype);  // checked above
  const int es = ElementSizeBytes(type);
  // Block by block into a file laid out up front (SafetensorsWriter): one
  // block's weights in RAM at a time, whatever the model's size. Rank 0
  // writes; the gathers are collective, so after a write error it keeps
  // gathering with the others and every rank returns the error at the end.
  const std::vector<BlockSpec> model_specs = GptBlockSpecs(m.model());
  auto export_shape = [&](BlockId b, size_t t) { return ExportShape(m.model(), model_specs, b, t); };
  std::optional<SafetensorsWriter> writer;
  Status written;  // rank 0's first write error
  if (m.comm->rank() == 0) {
    std::vector<SafetensorsSpec> specs;
    for (BlockId b = 0; b < static_cast<BlockId>(model_specs.size()); ++b) {
      const std::vector<std::string> names = GptTensorExportNames(m.model(), b);
      for (size_t t = 0; t < names.size(); ++t) specs.push_back({names[t], dtype, export_shape(b, t)});
    }
    const std::map<std::string, std::string> metadata = {
        {"format", "pt"},
        {"zinf.model", GptConfigToJson(m.model())},
        {"zinf.step", std::to_string(m.steps_done)},
        {"zinf.layout", "linear weights are [out_features, in_features]; lm_head is wte when tied"}};
    StatusOr<SafetensorsWriter> w = SafetensorsWriter::Create(path, specs, metadata);
    if (w.ok()) {
      writer.emplace(std::move(w).value());
    } else {
      written = w.status();
    }
  }
  ZINF_RETURN_IF_ERROR(m.AgreeAcrossRanks(written, "export"));
  // Progress in bytes of the blocks as exported (vocabulary padding
  // included), on rank 0, which writes; done once the file is written.
  std::function<void(int64_t, int64_t)> progress;
  int64_t total_bytes = 0, done_bytes = 0;
  if (m.options.engine.progress && m.comm->rank() == 0) {
    progress = m.options.engine.progress("exporting " + path);
    for (BlockId b = 0; b < m.engine->num_blocks(); ++b) total_bytes += m.engine->block(b).numel() * es;
    if (progress) progress(0, total_bytes);
  }
  std::vector<std::vector<float>> master;  // one block's, reused
  std::vector<std::byte> bytes;            // one tensor's, reused
  for (BlockId b = 0; b < static_cast<BlockId>(model_specs.size()); ++b) {
    const BlockSpec& spec = model_specs[static_cast<size_t>(b)];
    if (progress) done_bytes += spec.numel() * es;
    ZINF_RETURN_IF_ERROR(m.ReadModelBlock(b, &master));
    if (!writer || !written.ok()) continue;
    const std::vector<std::string> names = GptTensorExportNames(m.model(), b);
    for (size_t t = 0; t < spec.tensors.size() && written.ok(); ++t) {
      int64_t n = 1;
      for (int64_t d : export_shape(b, t)) n *= d;
      bytes.resize(static_cast<size_t>(n * es));
      kernels::cpu::CastOut(bytes.data(), type, master[t].data(), n);
      written = writer->Write(names[t], bytes);
    }
    if (progress) progress(std::min(done_bytes, total_bytes - 1), total_bytes);
  }
  if (writer && written.ok()) written = writer->Commit();
  ZINF_RETURN_IF_ERROR(m.AgreeAcrossRanks(written, "export"));
  if (progress) progress(total_bytes, total_bytes);
  return Status::Ok();
}

Status Trainer::ExportHfFolder(const std::string& dir, const std::string& dtype, const HfCheckpoint* source) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.Trains("ExportHfFolder"));
  auto read_block = [&](BlockId b, std::vector<std::vector<float>>* master) { return m.ReadModelBlock(b, master); };
  if (m.comm->rank() != 0) {  // the gathers are collective: follow rank 0's block order
    std::vector<std::vector<float>> master;
    for (BlockId b = 0; b <= HeadBlock(m.model()); ++b) ZINF_RETURN_IF_ERROR(read_block(b, &master));
    return Status::Ok();
  }
  return model::ExportHfFolder(dir, m.model(), source, dtype, read_block);
}

int64_t Trainer::step() const { return impl_->steps_done; }
const FetchLayout& Trainer::layout() const { return impl_->layout; }
int64_t Trainer::tokens_per_step() const {
  const Impl& m = *impl_;
  return static_cast<int64_t>(m.batch()) * m.model().seq_len * m.config.gradient_accumulation_steps *
         m.comm->world_size();
}
const GptConfig& Trainer::model() const { return impl_->model(); }
Engine& Trainer::engine() { return *impl_->engine; }
LayerActivations Trainer::activations() const { return impl_->options.activations; }
std::string Trainer::compute_name() const { return impl_->ops->name(); }
int64_t Trainer::activation_bytes() const { return impl_->compute->activation_bytes() + impl_->scratch_bytes; }
int64_t Trainer::host_activation_bytes() const { return impl_->compute->host_activation_bytes(); }
int64_t Trainer::num_train_tokens() const { return static_cast<int64_t>(impl_->num_train_tokens); }

}  // namespace zinf::model
