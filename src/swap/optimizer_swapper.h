// OptimizerSwapper: the fp32 optimizer state of one rank's shard (master
// weights, Adam m and v, the fp32 gradient accumulator), walked in
// sub-groups for the optimizer step.
//
// Design. The shard's `total_elems` elements are cut into sub-groups of
// `sub_group_elems` (the last one shorter when it does not divide). Step()
// runs Adam on one sub-group at a time while, with pipeline_read, sub-group
// k+1 (and further ones when buffer_count gives more buffers) is read from
// NVMe and, with pipeline_write, sub-group k-1 is being written back; Adam
// writes the new working parameters into the caller's buffer in the same
// pass, and callbacks hear of each stepped slice and each finished
// sub-group (so a caller running Step on another thread can use the new
// parameters of the first slices while later ones are still being stepped).
//
// Gradients. With gradients_in_store (the default) the fp32 gradient is a
// fourth array of the state, set by SetGradients (or range by range through
// a GradientWindow, as the engine does on NVMe) and read back by Step; a
// caller that holds the gradient in RAM anyway (the engine's accumulator
// with the state in RAM) turns it off and hands the gradient to Step. Each sub-group in flight holds one
// pinned buffer per array read (master, m, v and, in the store, the
// gradient), so the pipeline needs arrays * (1 + pipeline_read +
// pipeline_write) buffers of PaddedBytes(sub_group_elems * 4) bytes from
// the caller's pool: a pool too small is a configuration error found in
// Create, never a deadlock in Step. The buffers are leased once, at Create.
//
// Tiers, one code path. With device kNvme the state lives in a SwapStore
// (tensors "<prefix>.master.<k>", ".exp_avg.", ".exp_avg_sq.", and ".grad."
// with gradients_in_store) and a sub-group is swapped into the pipeline's
// buffers; with kCpu it lives in pinned RAM (a PinnedPool of its own, a
// buffer per array and sub-group) and the same loop hands Adam the resident
// buffers, with nothing to read or write. Both
// give bit-identical results: Adam is elementwise and the same kernels run
// on the same sub-group boundaries.
//
// Errors. An I/O error or a checksum mismatch in Step stops the step after
// waiting for every transfer in flight, and names the sub-group; the state
// on NVMe is then partly stepped, and the caller must resume from a
// checkpoint (the swap store's errors are sticky).
//
// Thread-safety: one thread at a time (thread-compatible). The CpuAdam's
// thread pool must not be used by anyone else during Step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "optim/cpu_adam.h"
#include "swap/checkpoint.h"
#include "swap/swap_store.h"
#include "zinf/config.h"
#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf::swap {

struct OptimizerSwapperOptions {
  int64_t total_elems = 0;                      // elements in this rank's shard
  int64_t sub_group_elems = 0;                  // zero_optimization.sub_group_size
  OffloadDevice device = OffloadDevice::kNvme;  // kCpu or kNvme
  bool pipeline_read = false;                   // offload_optimizer.pipeline_read
  bool pipeline_write = false;                  // offload_optimizer.pipeline_write
  SwapStoreOptions store;                       // kNvme: paths, stripe, checksums, run id
  std::string prefix = "optim";                 // tensor name prefix in the store
  bool pin_memory = true;                       // kCpu: page-lock the resident state
  // The fp32 gradient is part of the state (SetGradients); off: Step takes
  // it from the caller (StepIo::grads).
  bool gradients_in_store = true;
  // offload_optimizer.buffer_count: with pipeline_read, buffers beyond what
  // the pipeline needs (whole sub-groups of `arrays` buffers) read further
  // ahead. 0: just what it needs.
  int64_t buffer_count = 0;
  // The most elements Step hands Adam at once (StepIo::on_stepped hears of
  // each slice): a positive multiple of optim::kChunkElems, so slicing adds
  // no chunk boundary the thread pool would not make anyway (and Adam is
  // elementwise: the same bits for any slicing).
  int64_t step_slice_elems = int64_t{1} << 23;
};

// What one Step reads and writes besides the state.
struct StepIo {
  // Receives total_elems new working parameters as `params_dtype` (kBf16,
  // kF16, or kF32: a copy of the master weights); null: none are written.
  void* params = nullptr;
  ElementType params_dtype = ElementType::kBf16;
  // > 0: `params` is a ring of that many elements, a multiple of
  // sub_group_elems (or >= total_elems): element i goes to i % ring, so a
  // sub-group never wraps. The caller drains it in on_sub_group.
  int64_t params_ring_elems = 0;
  // total_elems fp32 gradients; required without gradients_in_store, and
  // must be null with it.
  const float* grads = nullptr;
  // Ranges of the shard (sorted, disjoint) stepped without weight decay;
  // null: decay everywhere. Not owned; read during Step.
  const std::vector<optim::ElemRange>* no_decay = nullptr;
  // Called, on Step's thread, each time a longer prefix of the shard is
  // stepped: elements [0, end) have their new state and their new
  // parameters in `params`. Step walks each sub-group in slices of at most
  // step_slice_elems, so a caller waiting for the first elements of a large
  // sub-group (DeepSpeed's default sub_group_size is 1e9) waits for one
  // slice, not for the sub-group. An error stops the step.
  std::function<Status(int64_t end)> on_stepped;
  // Called, on Step's thread, after sub-group k's new parameters are in
  // `params` (after on_stepped for its end) and before sub-group k+1 is
  // stepped; an error stops the step.
  std::function<Status(int64_t k)> on_sub_group;
  // With gradients_in_store: sub-group k's gradient where the caller holds
  // it in RAM already (the values the store holds), so that Step does not
  // read it back; null, or a null result: read from the store. Called on
  // Step's thread; the memory must not change until Step returns.
  std::function<const float*(int64_t k)> held_grads;
};
// A StepIo that writes bf16 parameters to `params` and takes the gradient
// from the store.
inline StepIo OutputTo(void* params) {
  StepIo io;
  io.params = params;
  return io;
}

// Options from the DeepSpeed config for a shard of `total_elems` elements,
// with the gradient supplied to Step (gradients_in_store off), as the
// engine runs it.
OptimizerSwapperOptions OptimizerSwapperOptionsFromConfig(const ZeroConfig& zero, int64_t total_elems);

class OptimizerSwapper {
 public:
  // The arrays a sub-group has: master, m, v, and the gradient when stored.
  static int ArraysOf(const OptimizerSwapperOptions& o) { return o.gradients_in_store ? kArrays : kGrad; }
  // Pinned buffers the pipeline needs: (3 + gradients_in_store) *
  // (1 + pipeline_read + pipeline_write), 0 with device kCpu.
  static int64_t RequiredBuffers(const OptimizerSwapperOptions& options);
  // Pinned buffers it uses when the pool has them: RequiredBuffers, or with
  // pipeline_read options.buffer_count rounded down to whole sub-groups if
  // that is more. Each sub-group beyond the required ones is read one step
  // further ahead.
  static int64_t PoolBuffers(const OptimizerSwapperOptions& options);
  // Bytes each pipeline buffer must hold (one fp32 sub-group, padded).
  static int64_t RequiredBufferBytes(const OptimizerSwapperOptions& options, int64_t alignment_bytes);
  // Sub-groups of the shard: total_elems / sub_group_elems, rounded up.
  static int64_t NumSubGroups(const OptimizerSwapperOptions& options);
  // kCpu: the pool of the resident state Create makes (a buffer per array and
  // sub-group); buffer_count 0 with kNvme.
  static aio::PinnedPoolOptions ResidentPoolOptions(const OptimizerSwapperOptions& options);

  // kNvme: lays out and preallocates the swap store over `engine` and leases
  // the pipeline buffers from `pool`, up to PoolBuffers (neither owned; both
  // must outlive the swapper). kCpu: allocates the resident state; engine
  // and pool may be null.
  // Errors: kInvalidArgument for bad sizes, an unsupported device, or a pool
  // with too few or too small buffers (naming what the pipeline needs), and
  // SwapStore::Create's errors. The state starts unset: call Initialize.
  static StatusOr<std::unique_ptr<OptimizerSwapper>> Create(const OptimizerSwapperOptions& options,
                                                            aio::IoEngine* engine, aio::PinnedPool* pool);
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  int64_t total_elems() const { return options_.total_elems; }
  int64_t num_sub_groups() const { return num_sub_groups_; }
  // First element and element count of sub-group k.
  int64_t sub_group_begin(int64_t k) const { return k * options_.sub_group_elems; }
  int64_t sub_group_elems(int64_t k) const;
  // The store holding the state (kNvme); null with kCpu. Checkpoints go
  // through CheckpointBlobs: m and v marked zero (ZeroMoments) are not in
  // the store until the first step writes them.
  SwapStore* store() const { return store_.get(); }
  bool gradients_in_store() const { return options_.gradients_in_store; }
  // The store's tensor of sub-group k's gradient, for a caller that fills it
  // range by range (GradientWindow). Precondition: kNvme with
  // gradients_in_store; not while Step runs.
  TensorId GradientTensor(int64_t k) const { return Tensor(kGrad, k); }

  // Sets the master weights from `master` (total_elems fp32) and zeroes m,
  // v and (when stored) the gradient.
  Status Initialize(const float* master);
  // The initial state streamed in instead of a whole-shard array: master
  // weights [begin, begin + count) from `src` (any order, any ranges; a
  // sub-group covered in part is read and rewritten, and its elements no
  // call has set yet are zero), then ZeroMoments once every element is set.
  Status WriteMaster(int64_t begin, int64_t count, const float* src);
  // Zeroes m, v and (when stored) the gradient; the master weights stay.
  // On NVMe m and v are not written: each sub-group's are marked zero,
  // their reads become a memset of the buffer, and the sub-group's first
  // write-back (Step) puts them on disk. A model's state starts
  // without writing its moments' zeros (8 of its 12 bytes a parameter) or
  // reading them back in the first step. (A stored gradient is written:
  // GradientWindow reads the store's tensor itself.)
  Status ZeroMoments();
  // Sets the fp32 gradient from `grads` (total_elems fp32). Only with
  // gradients_in_store (else kFailedPrecondition).
  Status SetGradients(const float* grads);
  // Copies the state out (total_elems each; a null pointer skips that
  // array; `grads` must be null without gradients_in_store).
  Status ReadState(float* master, float* exp_avg, float* exp_avg_sq, float* grads);
  // Master weights [begin, begin + count), reading only the sub-groups that
  // overlap the range, handed to `sink` a sub-group's part at a time, in
  // order: sink(at, src, n) takes elements [begin + at, begin + at + n)
  // (`src` valid during the call). From NVMe the next sub-group is read
  // while `sink` takes one.
  using MasterSink = std::function<void(int64_t at, const float* src, int64_t n)>;
  Status ReadMaster(int64_t begin, int64_t count, const MasterSink& sink);
  // The same range copied to `dst`.
  Status ReadMaster(int64_t begin, int64_t count, float* dst);

  // What a checkpoint of this state holds: master, m and v of every
  // sub-group (not the gradient, which a step consumes), named
  // "master.<k>", "exp_avg.<k>", "exp_avg_sq.<k>" whatever the tier, so a
  // checkpoint saved from NVMe loads into RAM-resident state and back as
  // long as total_elems and sub_group_elems agree. The refs point into this
  // object (swap tensors or resident buffers): use them for SaveCheckpoint
  // (kSave: arrays still marked zero are first written out, which only a
  // checkpoint before the first step meets) or LoadCheckpoint (kRestore:
  // prefetched reads are dropped; call Restored once the load has written
  // every blob, which drops the marks: a load refused before writing
  // leaves them, and the zeros they stand for) while no Step runs.
  enum class BlobUse { kSave, kRestore };
  StatusOr<std::vector<BlobRef>> CheckpointBlobs(BlobUse use);
  void Restored();

  // The bytes of master, m and v the next Step reads and writes on NVMe
  // (m and v marked zero are not read); 0 with kCpu. Not while Step runs.
  int64_t StepStateBytes() const;

  // One optimizer step over every sub-group (see the file comment).
  Status Step(const optim::CpuAdam& adam, const optim::AdamStepArgs& args, const StepIo& io);

  // Starts reading master, m and v of the first sub-groups the next Step
  // walks (one per sub-group of pipeline buffers), so that Step begins on
  // state already in memory. Reads only, never the gradient (Step reads a
  // stored one when it gets there): call it while no Step runs, e.g. while
  // the last micro-batch's gradient is still being accumulated, in RAM or
  // into the store. Does nothing when the reads are already under way, or with
  // device kCpu. Initialize, ZeroMoments, SetGradients, ReadState,
  // ReadMaster and CheckpointBlobs drop them first.
  Status PrefetchStep();
  // Waits for the prefetched reads and forgets them (their errors too: the
  // next Step reads again and reports).
  void DropPrefetch();

 private:
  static constexpr int kMaster = 0, kExpAvg = 1, kExpAvgSq = 2, kGrad = 3, kArrays = 4;
  struct Slot {
    int64_t sub_group = -1;
    std::array<aio::PinnedBuffer, kArrays> buffers;
    std::array<SwapHandle, kArrays> reads{};
    std::array<SwapHandle, kArrays> writes{};
  };

  explicit OptimizerSwapper(const OptimizerSwapperOptions& options) : options_(options) {}
  // Arrays kept per sub-group: master, m, v, and the gradient when stored.
  int arrays() const { return ArraysOf(options_); }
  TensorId Tensor(int array, int64_t k) const { return static_cast<TensorId>(k * arrays() + array); }
  float* Resident(int array, int64_t k) const;
  // Moves `array` of every sub-group between the state and a caller array.
  Status CopyIn(int array, const float* src);  // src null: zeros
  Status CopyOut(int array, float* dst);
  // Reads sub-group k's arrays into the slot; `with_grad` false leaves a
  // stored gradient out (PrefetchStep).
  Status StartRead(Slot& slot, int64_t k, bool with_grad = true);
  // StartRead unless the slot's reads of sub-group k are under way
  // (PrefetchStep: then only a stored gradient's read is started).
  // `with_grad` false: the gradient is not read (StepIo::held_grads).
  Status EnsureRead(Slot& slot, int64_t k, bool with_grad);
  Slot& SlotOf(int64_t k) { return slots_[static_cast<size_t>(k) % slots_.size()]; }
  Status FinishRead(Slot& slot);
  Status StartWrite(Slot& slot);
  Status FinishWrite(Slot& slot);
  Status Drain(Status first);  // waits for everything in flight, keeps the first error
  // Whether `array` of sub-group k is marked zero (zero_), and setting it.
  bool Zero(int array, int64_t k) const { return !zero_.empty() && zero_[static_cast<size_t>(k * arrays() + array)]; }
  void SetZero(int array, int64_t k, bool zero) {
    if (!zero_.empty()) zero_[static_cast<size_t>(k * arrays() + array)] = zero;
  }
  // Writes out the arrays marked zero (clearing the marks), one at a time:
  // only a checkpoint before the first step meets them.
  Status WriteZeros();

  OptimizerSwapperOptions options_;
  int64_t num_sub_groups_ = 0;
  std::unique_ptr<SwapStore> store_;                // kNvme
  std::vector<Slot> slots_;                         // kNvme: the pipeline's buffers
  std::unique_ptr<aio::PinnedPool> resident_pool_;  // kCpu
  std::vector<aio::PinnedBuffer> resident_;         // kCpu: [k * arrays() + array]
  std::vector<bool> master_set_;                    // per sub-group: master holds values (WriteMaster, Initialize)
  // kNvme, [k * arrays() + array]: the array of sub-group k is zero and not
  // on disk (ZeroMoments); only m and v are ever marked.
  std::vector<bool> zero_;
};

}  // namespace zinf::swap
