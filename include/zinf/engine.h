// zinf::Engine: the ZeRO-3 core a training loop talks to.
//
// The model describes its parameters as blocks (a transformer layer, the
// embedding, the head), each a list of named tensors with shapes. The engine
// flattens each block into one buffer, splits it into world_size equal shards
// (padded at the end), and keeps this rank's shard at its home tier:
//   * the 16-bit (or fp32) working copy at offload_param.device:
//     none = device memory, cpu = pinned RAM, nvme = a ParamSwapper;
//   * the fp32 optimizer state (master, Adam m and v, fp32 gradient) at
//     offload_optimizer.device: cpu or none = pinned RAM, nvme = a pipelined
//     OptimizerSwapper walking sub_group_size sub-groups. (There is no GPU
//     Adam yet: "none" runs CPU Adam on RAM-resident state.)
//
// A training step, on every rank (SPMD: every rank makes the same calls in
// the same order; the engine's collectives depend on it):
//
//     for each micro-batch (gradient_accumulation_steps of them):
//       forward:  for each block b: ptrs = Acquire(b); compute;
//                 Release(b, stream)  // on a GPU: no wait for the compute
//       backward: for each block b (reversed): ptrs = Acquire(b);
//                 compute grads; ReduceGradients(b, grads, stream);
//                 Release(b, stream)
//       Step();   // the optimizer runs on the last micro-batch only
//
// Acquire returns device pointers to the block's full parameters (all
// shards all-gathered), valid until the matching Release. A prefetch
// coordinator records the order of Acquire calls in the first step and from
// then on fetches ahead (NVMe reads, host-to-device copies, all-gathers),
// bounded by stage3_prefetch_bucket_size and stage3_max_live_parameters; it
// keeps a released block when its next use is within
// stage3_max_reuse_distance elements, and blocks smaller than
// stage3_param_persistence_threshold stay gathered until the next Step. A
// changed order is noticed and recorded again (counters().order_changes).
//
// Gradients: ReduceGradients reduce-scatters the block's gradient (sum over
// ranks), copies this rank's shard to pinned memory and accumulates it, times
// 1 / (world_size * gradient_accumulation_steps), into the fp32 gradient.
// So the model hands in gradients of its own micro-batch's mean loss (times
// loss_scale() with fp16), and the optimizer sees the mean over the global
// batch.
//
// Step (at a gradient-accumulation boundary): global gradient norm (all-
// reduced over ranks), fp16 overflow check and loss-scale update (an
// overflow skips the step), clipping by gradient_clipping, Adam over the
// sub-groups with the LR schedule's lr, new working parameters written home.
// Step returns once the norm is known and the update has started: Adam and
// the optimizer state's NVMe traffic run on a worker thread, sub-group by
// sub-group in the shard's block order, under the next forward pass. An
// Acquire waits only for the elements that cover its block (the worker
// announces its progress every 8M elements at most); calls that
// touch the optimizer state or the gradients (ReduceGradients, Step,
// checkpoints, GetMasterParameters) and WaitForUpdate wait for all of it.
// The results are those of a synchronous step, bit for bit.
//
// Stages: 3 partitions parameters; 1 and 2 keep every block gathered
// between steps (parameters replicated, gradients and optimizer state
// partitioned), which is stage 3 with every block persistent. Stage 0 is
// refused.
//
// Errors are values; an error in the update leaves the optimizer state
// partly stepped (see OptimizerSwapper). It is returned by the first call
// that waits for the update, and by every later Acquire of a block it had
// not reached, ReduceGradients, Step and SaveCheckpoint, until
// LoadCheckpoint restores a saved state. An I/O error also leaves the
// optimizer's swap files failed (their errors are sticky), so after one the
// checkpoint is loaded into a new Engine.
//
// Thread-safety: thread-compatible: one thread drives an Engine. Pointers
// from Acquire may be read on the device (or, with the host stand-in, on
// any thread) until Release.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zinf/config.h"
#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf {

// Inside zinf only (src/zero3/engine_hooks.h): the device, communicators
// and I/O engine an Engine is built on, and access to them. Users leave
// EngineOptions::hooks null and never need either.
struct EngineHooks;
struct EngineAccess;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // elements per dimension; empty: a scalar
  // The optimizer's weight decay applies to this tensor (false: biases and
  // norm weights, as the HF Trainer leaves them undecayed).
  bool decay = true;
  int64_t numel() const;
};

struct BlockSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel() const;  // of all its tensors
};

using BlockId = int32_t;

struct EngineOptions {
  // Names this run's swap files (SwapStore run id); empty: random.
  std::string run_id;
  // CPU Adam threads; 0: one per physical core.
  int optimizer_threads = 0;
  // Element type of the gradients given to ReduceGradients: kF32, or the
  // working parameters' type.
  ElementType grad_type = ElementType::kF32;
  // Where the model computes. false: on the device, a GPU when one is
  // present (else the host stands in for it), so Acquire's pointers and
  // ReduceGradients' gradients are device memory. true: on the CPU even when
  // a GPU is present: Acquire's pointers are host memory, and
  // ReduceGradients takes gradients in any host memory (examples/). Ignored
  // when hooks name a device.
  bool host_device = false;
  // Forward passes only (evaluation, inference): the engine keeps the
  // working parameters at their home tier and gathers them, and nothing
  // else: no optimizer state (no optimizer swap files), no gradient
  // buffers. SetParameters writes the working parameters home at once;
  // LoadCheckpoint reads only a checkpoint's master weights, whatever its
  // sub-group size and optimizer tier; ReduceGradients, Step,
  // GetMasterParameters and SaveCheckpoint are kFailedPrecondition; each
  // pass ends with EndForwardPass (the prefetch follows the first).
  bool forward_only = false;
  // zinf's own code and tests only (not owned; read by Create): the
  // device, communicators and I/O engine to use. Null: the engine makes its
  // own (a GPU when present, else the host; MPI ranks under mpirun; io_uring
  // from the config's aio section).
  const EngineHooks* hooks = nullptr;
  // Progress of SaveCheckpoint and LoadCheckpoint: called at the start of
  // each with what it does ("saving checkpoint DIR"), it returns the
  // function that hears (bytes done, total bytes) on the calling thread, the
  // last call with done == total. Null (or returning null): no report.
  std::function<std::function<void(int64_t done, int64_t total)>(const std::string& what)> progress;
};

struct StepResult {
  bool boundary = false;    // this call ended a gradient-accumulation cycle
  bool applied = false;     // the optimizer ran (false on an fp16 overflow)
  double grad_norm = 0.0;   // global L2 norm of the loss-scaled mean gradient
  double lr = 0.0;          // the lr used (applied steps)
  double loss_scale = 1.0;  // the scale for the next micro-batch
};

// What moved where and how long it took (cumulative since Create).
struct EngineCounters {
  // Bytes per tier.
  int64_t nvme_read_bytes = 0;       // parameter shards read (ParamSwapper)
  int64_t nvme_write_bytes = 0;      // parameter shards written
  int64_t optimizer_nvme_bytes = 0;  // optimizer state read + written
  int64_t gradient_nvme_bytes = 0;   // fp32 gradient to and from NVMe (optimizer on nvme)
  int64_t h2d_bytes = 0;             // shard copies to the device
  int64_t d2h_bytes = 0;             // gradient shards to pinned memory
  int64_t allgather_bytes = 0;       // full blocks gathered
  int64_t reduce_scatter_bytes = 0;  // full gradients reduced
  // Nanoseconds the driving thread waited.
  int64_t nvme_wait_ns = 0;       // for parameter reads
  int64_t fetch_wait_ns = 0;      // in Acquire for a block's copies and gather
  int64_t allgather_ns = 0;       // in all-gather calls
  int64_t reduce_scatter_ns = 0;  // in ReduceGradients' collective and copy back
  int64_t optimizer_ns = 0;       // in the optimizer step and waiting for its update
  // Prefetching.
  int64_t fetches = 0;               // blocks gathered
  int64_t prefetches = 0;            // ... of which ahead of their Acquire
  int64_t prefetch_hits = 0;         // Acquire found a prefetched block ready
  int64_t resident_hits = 0;         // Acquire found a kept or persistent block
  int64_t evictions = 0;             // gathered blocks freed
  int64_t order_changes = 0;         // the acquire order differed from the record
  int64_t live_elems = 0;            // gathered non-persistent elements now
  int64_t peak_live_elems = 0;       // ... at most, since Create
  int64_t live_limit_overruns = 0;   // demanded fetches past max_live (all held)
  int64_t evictions_for_memory = 0;  // blocks evicted because a device allocation failed
};

// The counters' change from `before` to `after` (both from counters()):
// every cumulative field is the difference; the levels (live_elems,
// peak_live_elems, order_changes) are `after`'s.
EngineCounters CountersSince(const EngineCounters& before, const EngineCounters& after);
// Adds a CountersSince result to a running total: cumulative fields add up,
// peak_live_elems is the larger, the other levels take `delta`'s.
void AddCounters(EngineCounters& total, const EngineCounters& delta);

class Engine {
 public:
  // Lays out `blocks`, creates the tiers, swap files and buffers. Errors:
  // kInvalidArgument (stage 0, fp16 and bf16 both on, an empty or duplicate
  // block or tensor, bad sizes), kUnavailable (a communicator that cannot be
  // had), and the swap and device layers' errors.
  static StatusOr<std::unique_ptr<Engine>> Create(const Config& config, const std::vector<BlockSpec>& blocks,
                                                  const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Initial values of a block: one host array of fp32 per tensor, in the
  // block's order (each rank takes its shard; all ranks should pass the same
  // values). Every block must be set before the first Acquire.
  Status SetParameters(BlockId block, const std::vector<const float*>& values);
  // The same, the values asked for a range at a time: fill(t, first, count,
  // out) writes elements [first, first + count) of tensor t (row-major fp32)
  // to `out`, for each range this rank's shard holds (each once, tensors in
  // order): no array of a whole block or tensor is needed (a checkpoint's
  // tensors read straight into the engine's staging). An error from `fill`
  // is returned, and the block keeps what it had (unset, or the values of
  // an earlier call).
  using TensorFill = std::function<Status(size_t tensor, int64_t first, int64_t count, float* out)>;
  Status SetParameters(BlockId block, const TensorFill& fill);

  // The block's full parameters on the device, one pointer per tensor (of
  // param_type()), valid until Release. Acquires nest. Collective.
  StatusOr<std::vector<void*>> Acquire(BlockId block);
  // Hands the block back. The work that reads the pointers must have
  // finished (on CUDA: the model's stream synchronised, or the engine is
  // free to reuse the memory at once). kFailedPrecondition when not acquired.
  Status Release(BlockId block);
  // Hands the block back while work that reads its pointers may still be
  // queued on `stream`: on CUDA a (non-default) cudaStream_t of the
  // engine's GPU; with the host standing in for the device, one of that
  // device's zinf Streams (zinf's tests). The engine records an event
  // there and reuses the memory only once it has completed (until then the
  // block counts against stage3_max_live_parameters), so the caller need
  // not wait. Null: as above.
  Status Release(BlockId block, void* stream);
  // One device pointer (host pointer with EngineOptions::host_device) per
  // tensor of grad_type elements (the gradient of this micro-batch).
  // Collective.
  Status ReduceGradients(BlockId block, const std::vector<const void*>& grads);
  // The same while the work that writes `grads` may still be queued on
  // `stream` (a stream as Release's): the engine's copies wait for it on
  // the engine's own stream, `stream` is made to wait for those copies
  // before its later work (so the next block's backward may rewrite the
  // same buffers once it is queued after this call), and the host part
  // (the accumulation, from the engine's staging; none when one rank's fp32
  // gradient is copied straight into the accumulator, which Step and
  // WaitForUpdate wait for) runs in the next call that touches the
  // gradient (ReduceGradients, Step, WaitForUpdate):
  // neither the caller nor the device waits here. Errors of the deferred
  // part are returned by that call, naming the block. Null: as above.
  Status ReduceGradients(BlockId block, const std::vector<const void*>& grads, void* stream);
  // Ends a micro-batch; at a boundary runs the optimizer (see above). No
  // block may be acquired. Collective.
  StatusOr<StepResult> Step();
  // Waits for the optimizer update Step started, if any, and returns its
  // error. Call it after the last Step of a run: an update that fails after
  // the last forward pass is otherwise only noticed by a later call. With
  // the optimizer on NVMe it also waits for the gradient writes
  // ReduceGradients left in flight.
  Status WaitForUpdate();

  // The fp32 master weights of a block, one host array per tensor (numel
  // each). Collective (gathers every rank's shard). For checks and saving.
  Status GetMasterParameters(BlockId block, const std::vector<float*>& out);

  // Saves this rank's training state as checkpoint directory `dir` (the
  // crash-safe format of swap/checkpoint.h: written new, fsynced, renamed
  // into place; `<parent of dir>/latest` then names it): the fp32 master
  // weights and Adam moments of this rank's shard, read from whichever tier
  // holds them, and the step count, LR-schedule position and loss-scaler
  // state, with `metadata` (the caller's keys; "engine." is reserved) in
  // the manifest. Only between optimizer steps: kFailedPrecondition while a
  // block is acquired, or while gradients handed to ReduceGradients since the
  // last optimizer step are pending (a checkpoint does not hold them). Not
  // collective: each rank saves its own directory. An existing `dir` is
  // refused, unless `replace_orphan` and `latest` does not name it (see
  // swap::SaveOptions::replace_orphan).
  Status SaveCheckpoint(const std::string& dir, const std::map<std::string, std::string>& metadata,
                        bool replace_orphan = false);
  // Restores what SaveCheckpoint saved into this engine, which must have
  // the same blocks, world size, rank and sub-group size (otherwise
  // kFailedPrecondition naming what differs); every blob is verified before
  // any state is touched (kCorruption naming the file and offset). Replaces
  // SetParameters (it may be called instead of it) and rewrites the working
  // parameters at their home tier from the restored master weights. Returns
  // the manifest's metadata. Same preconditions as SaveCheckpoint.
  // Forward-only: the master weights alone, streamed home block by block
  // (any sub-group size fits), each chunk verified as it is read; a
  // checkpoint refused before its weights are read (another layout, no
  // master weights of the shard's size) leaves the parameters as they
  // were; after an error while reading them the engine holds none
  // (Acquire refuses) until a load or SetParameters of every block
  // succeeds.
  StatusOr<std::map<std::string, std::string>> LoadCheckpoint(const std::string& dir);

  // Forward-only: one pass over the blocks (a batch's forward) is over; the
  // acquires since the last one are the order the engine prefetches along
  // from now on (what Step does for a training engine). kFailedPrecondition
  // on a training engine or while a block is acquired.
  Status EndForwardPass();

  // Tracing on (the default): Acquire calls are the prefetch order's record
  // and replay. Off, for a pass outside the training steps (an evaluation):
  // its acquires are neither recorded nor prefetched for, so the training
  // order stays intact.
  void SetTracing(bool on);

  int num_blocks() const;
  const BlockSpec& block(BlockId id) const;
  ElementType param_type() const;
  ElementType grad_type() const;
  int rank() const;
  int world_size() const;
  double loss_scale() const;
  int64_t optimizer_steps() const;  // applied steps
  EngineCounters counters() const;

  struct Impl;

 private:
  friend struct EngineAccess;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf
