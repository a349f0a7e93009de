// GradientWindow: the fp32 gradient accumulator of one rank's shard, kept in
// the OptimizerSwapper's store (gradients_in_store) instead of a whole-shard
// RAM buffer, and filled through a few pinned buffers of one sub-group each.
//
// Design. The caller hands ranges of the shard as its gradients arrive (a
// block's shard after its backward): Add(begin, count, g, scale) adds
// scale * g to the gradient over the sub-groups the range covers. A
// sub-group is brought into a buffer at its first Add of the accumulation
// cycle as zeros (no read: the cycle starts from a zero gradient; the
// values below the ranges added so far are zeroed only when needed, see
// Buffer::unset), at a later Add by reading it back, and goes back to the store with a write
// started as soon as an Add lands wholly below it (the backward pass hands
// blocks in descending shard order), so the write of one sub-group overlaps
// the filling of the next. In a later micro-batch the next lower sub-group
// is read ahead into a free buffer. Any order of ranges is correct; the
// descending one moves each sub-group once per micro-batch.
//
// Exactness. The arithmetic is the RAM accumulator's: zero + scale * g,
// then += scale * g per micro-batch (optim::AddScaled, elementwise), and the
// sum of squares of the final values is ShardSquares' (per piece, added in
// piece order): exactly what ShardSumSquares gives for an array in RAM
// whatever the sub-groups, so a caller that computes its norm with it on
// RAM-resident gradients gets the same bits. The squares are taken when a sub-group is written in
// the cycle's last micro-batch (Add's `last`), so the norm costs no
// extra read.
//
// Sealing. In the last micro-batch the pass that sets a range also takes,
// one store extent (stripe unit) at a time while its bytes are in cache,
// the extent's squares and crc32c, on the pool's threads (when the
// sub-group's extents are whole pieces of the norm: Sealable); the write
// hands the crcs to the store (SwapStore::SwapOut with checksums) and
// seals only what is left. One read of the gradient instead of three (the
// copy, the squares, the store's crc). Any later change to a sealed extent
// (an add over it, zeroing) unseals it first.
//
// Finish() ends the cycle: writes what is buffered, zeros the sub-groups
// no Add touched (so the step reads a zero gradient there, as the RAM
// accumulator would hold), reads back any touched sub-group whose squares
// were not taken, waits for every transfer, and returns the sum of squares.
// The buffers then still hold the last sub-groups the backward handed in
// (the first ones the step needs), and FinalGradient lends them to the
// step, which need not read them back. Reset() forgets the cycle without
// I/O (after a checkpoint load).
//
// Errors: the store's (sticky in the store), with the sub-group named.
//
// Thread-safety: thread-compatible; one thread at a time, and not while the
// swapper's Step runs (it reads the gradient from the store). FinalGradient
// alone may be called from another thread (the update worker, inside Step)
// while no other member is called: its answers change only in Add, Flush,
// Finish and Reset, which the engine calls only after the update is done. The thread
// pool is used for the adds, the squares and the crcs, so no one else may use it then.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "aio/pinned_pool.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "swap/optimizer_swapper.h"
#include "zinf/status.h"

namespace zinf::swap {

// The gradient's sum of squares in an order that does not depend on how the
// shard is cut into sub-groups, so that a fitted pipeline (sub-groups split
// to fit offload_optimizer.buffer_count, multiples of kAtom elements), the
// config's sub-groups and an array in RAM give the same bits. The shard is
// cut into pieces at every multiple of kAtom and of `cut` (the config's
// sub_group_size): every sub-group boundary of either kind is a piece
// boundary. Each piece's squares are summed in one kernel pass
// (optim::SumSquaresPieces) and the pieces' sums are added in index order.
// Holds one double per piece (8 bytes per kAtom elements) and Add's scratch
// of one offset per piece, both allocated in the constructor: Add and Total
// allocate nothing, so one object serves every step.
class ShardSquares {
 public:
  static constexpr int64_t kAtom = 1024;  // one 4 KiB alignment unit of fp32
  ShardSquares(int64_t total, int64_t cut);
  // The heap bytes a ShardSquares(total, cut) holds.
  static int64_t FootprintBytes(int64_t total, int64_t cut);
  // Takes the squares of shard elements [begin, begin + n), x[0] being
  // element `begin`; begin and begin + n must be piece boundaries (or the
  // shard's end). Replaces what an earlier Add gave for those pieces.
  Status Add(optim::ThreadPool& pool, optim::Isa isa, int64_t begin, const float* x, int64_t n);
  // Add on the calling thread, without the pool or Add's scratch: calls on
  // disjoint ranges may run at once (each piece's sum is its own double),
  // but not beside Add, Total or Reset.
  Status AddSerial(optim::Isa isa, int64_t begin, const float* x, int64_t n);
  // Whether `p` is a piece boundary (where Add's ranges may begin and end).
  bool IsBoundary(int64_t p) const { return p == total_ || p % kAtom == 0 || p % cut_ == 0; }
  double Total() const;  // pieces never added count 0
  void Reset();

 private:
  int64_t PieceIndex(int64_t p) const;  // pieces starting before boundary p
  int64_t NextBoundary(int64_t p) const;
  Status CheckRange(int64_t begin, int64_t n) const;

  int64_t total_, cut_, lcm_;
  std::vector<double> sums_;
  std::vector<int64_t> bounds_;  // Add's scratch
};

// ShardSquares(n, cut) over an array in RAM: what GradientWindow::Finish
// returns for the same gradient. Allocates a ShardSquares per call; a caller
// that sums every step keeps one and calls Add(0, ...) and Total().
StatusOr<double> ShardSumSquares(optim::ThreadPool& pool, optim::Isa isa, const float* x, int64_t n, int64_t cut);

class GradientWindow {
 public:
  // The fewest buffers the window uses: one to fill, one being written
  // behind it, one read ahead (micro-batches after the first).
  static constexpr int64_t kMinBuffers = 3;
  // The buffers it uses when the largest range one Add hands over has
  // `largest_add` elements: one per sub-group such a range can touch, so a
  // block's gradient is taken in without waiting for the writes of its
  // first sub-groups (they drain under the next block's backward). At
  // least kMinBuffers, at most as many as the optimizer pipeline's pool
  // (OptimizerSwapper::PoolBuffers): pinned memory beside that pool's, up
  // to as much again, which BufferPlan counts and `zinf plan` prints.
  static int64_t BufferCount(const OptimizerSwapperOptions& options, int64_t largest_add);
  // The pinned pool a window needs for `options` (BufferCount buffers of
  // one padded fp32 sub-group), or buffer_count 0 when the gradient is not
  // in an NVMe store.
  static aio::PinnedPoolOptions PoolOptions(const OptimizerSwapperOptions& options, bool pin, int64_t largest_add);

  // `swapper` must keep the gradient in its NVMe store; `pool` gives at
  // least kMinBuffers buffers of at least RequiredBufferBytes (the window
  // takes them all). None is owned; all must outlive the window.
  // `norm_cut`: the config's sub_group_size (ShardSquares' `cut`).
  static StatusOr<std::unique_ptr<GradientWindow>> Create(OptimizerSwapper* swapper, aio::PinnedPool* pool,
                                                          optim::ThreadPool* threads, optim::Isa isa, int64_t norm_cut);
  ~GradientWindow();
  GradientWindow(const GradientWindow&) = delete;
  GradientWindow& operator=(const GradientWindow&) = delete;

  // gradient[begin, begin + count) += scale * g (from zero at the first
  // touch of a sub-group in the cycle). `last`: this is the cycle's last
  // micro-batch. Returns once `g` may be reused; writes may be in flight.
  Status Add(int64_t begin, int64_t count, const float* g, float scale, bool last);
  // Writes what is buffered and waits for every transfer; the buffers keep
  // their values, and the cycle goes on.
  Status Flush();
  // Ends the cycle (see the file comment); the gradient's sum of squares.
  StatusOr<double> Finish();
  // Forgets the cycle: waits for transfers in flight, drops the buffers.
  void Reset();
  // After Finish: sub-group k's final gradient when a buffer still holds
  // it (the values the store holds, padding zeroed), else null. Valid until
  // the next Add, Flush, Finish or Reset.
  const float* FinalGradient(int64_t k) const;
  // The elements of the sub-groups FinalGradient lends (0 outside that time).
  int64_t FinalGradientElems() const;

  // Bytes read from and written to the store so far.
  int64_t nvme_bytes() const { return nvme_bytes_; }

 private:
  struct Buffer {
    aio::PinnedBuffer data;
    int64_t sub_group = -1;  // whose values it holds (-1: none)
    SwapHandle read, write;  // in flight
    bool dirty = false;      // changed since read or written
    bool last = false;       // changed in the cycle's last micro-batch
    int64_t used = 0;        // for least-recently-used choice
    // Elements [0, unset) of a sub-group first touched in this cycle hold
    // no value yet (zero, in the cycle's sense): descending ranges are set
    // from the gradient instead of zeroed and added to (SetScaled, same
    // bits), and what is left is zeroed before anything reads the buffer.
    int64_t unset = 0;
    // Per store extent of the sub-group (one stripe unit): whether its
    // crc32c (`crc`) and its pieces' squares (in squares_) were taken of
    // the bytes it holds now (SetAndSeal, in the pass that set them, or
    // SealRest before the write).
    // uint8_t, not bool: pool threads write neighbouring flags at once.
    std::vector<uint32_t> crc;
    std::vector<uint8_t> sealed;
    // Takes sub-group k (-1: none) with nothing known of its values: not
    // changed in the last micro-batch, no extent sealed.
    void Hold(int64_t k) {
      sub_group = k;
      last = false;
      std::fill(sealed.begin(), sealed.end(), uint8_t{0});
    }
  };

  GradientWindow(OptimizerSwapper* swapper, optim::ThreadPool* threads, optim::Isa isa, int64_t norm_cut)
      : swapper_(*swapper),
        store_(*swapper->store()),
        threads_(*threads),
        isa_(isa),
        squares_(swapper->total_elems(), norm_cut) {}
  float* Floats(Buffer& b) { return reinterpret_cast<float*>(b.data.data()); }
  Buffer* Holding(int64_t k);
  // A buffer holding sub-group k's current values: read back, or (first
  // touch in the cycle) zero, its values unset (Buffer::unset).
  StatusOr<Buffer*> Acquire(int64_t k);
  // A buffer free for another sub-group: its write waited for.
  StatusOr<Buffer*> Victim(const Buffer* keep);
  Status StartWrite(Buffer& b);
  void ZeroUnset(Buffer& b);
  // Sub-group k's extents can be sealed one by one: each is a range of
  // whole pieces of the norm (ShardSquares), which holds when the stripe's
  // elements (stripe_bytes / 4) and the sub-group's start are multiples of
  // ShardSquares::kAtom.
  bool Sealable(int64_t k) const;
  // Elements [r_lo, r_hi) of b's sub-group set to scale * src (SetScaled)
  // and [r_hi, unset) zeroed, one pool task per extent, each extent then
  // wholly set (from r_lo up) sealed while its bytes are in cache. Only in
  // the cycle's last micro-batch (the squares are of final values).
  Status SetAndSeal(Buffer& b, int64_t r_lo, int64_t r_hi, const float* src, float scale);
  // Seals every extent of b not sealed yet (before b is written).
  Status SealRest(Buffer& b);
  // Extents overlapping elements [lo, hi) of b change: no longer sealed.
  void Unseal(Buffer& b, int64_t lo, int64_t hi);
  // Extent e of sub-group k: elements [*lo, *hi) and its bytes (the last
  // one's padding included), as SwapStore cuts the tensor.
  void ExtentOf(int64_t k, int64_t e, int64_t* lo, int64_t* hi, int64_t* bytes) const;
  Status SealOne(Buffer& b, int64_t e);
  Status EachExtent(int64_t first, int64_t end, optim::FunctionRef<Status(int64_t)> fn);
  Status WaitRead(Buffer& b);
  Status WaitWrite(Buffer& b);
  void ReadAhead(int64_t k, const Buffer* keep);
  Status Drain();

  OptimizerSwapper& swapper_;
  SwapStore& store_;
  optim::ThreadPool& threads_;
  optim::Isa isa_;
  std::vector<Buffer> buffers_;
  std::vector<bool> touched_;   // per sub-group: added to in this cycle
  std::vector<bool> squared_;   // per sub-group: squares_ holds its final values
  std::vector<int64_t> final_;  // after Finish: the sub-group each buffer holds (-1: none)
  ShardSquares squares_;
  int64_t clock_ = 0;
  int64_t nvme_bytes_ = 0;
};

}  // namespace zinf::swap
