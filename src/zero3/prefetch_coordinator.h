// PrefetchCoordinator: decides what to fetch ahead and what to keep, from
// the order in which blocks were acquired in an earlier step. Pure logic:
// the engine does the fetching; this class only records and answers.
//
// Recording: in the first step every OnAcquire appends to the trace;
// OnStepEnd freezes it. Replaying: each OnAcquire is checked against the
// trace at the cursor. A different block means the order changed (a model
// with data-dependent control flow, a changed accumulation count): the
// trace is cut at the cursor, the coordinator goes back to recording from
// there, and order_changes() counts it; fewer acquires than recorded are
// noticed at OnStepEnd and handled the same way. A stale plan is never a
// wrong fetch: it only gathers a block that is not needed soon (the engine
// evicts it), never a wrong one in place of the one asked for, and every
// rank sees the same order (SPMD), so collectives stay matched.
//
// Distances are in elements (padded block numel), as DeepSpeed's
// stage3_max_reuse_distance and stage3_prefetch_bucket_size are.
//
// Thread-safety: thread-compatible (the engine's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace zinf::zero3 {

struct PrefetchOptions {
  int64_t prefetch_bucket_elems = 50'000'000;        // stage3_prefetch_bucket_size
  int64_t max_reuse_distance_elems = 1'000'000'000;  // stage3_max_reuse_distance
};

class PrefetchCoordinator {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // `block_elems[b]`: the elements a gather of block b brings in.
  PrefetchCoordinator(const PrefetchOptions& options, std::vector<int64_t> block_elems);

  // Records or checks one acquire (see the file comment).
  void OnAcquire(int block);
  // The end of an optimizer step: freezes a recording, or notices a short step.
  void OnStepEnd();

  bool replaying() const { return replaying_; }
  int64_t order_changes() const { return order_changes_; }
  const std::vector<int>& trace() const { return trace_; }

  // The blocks to fetch next, in order of use: the distinct blocks after the
  // cursor whose elements, with those before them, fit in `window_elems`
  // (at least the first, when it is not `skip`ped). Only while replaying.
  // `skip(b)` true: b is already gathered or on its way (not counted).
  std::vector<int> Upcoming(int64_t window_elems, const std::function<bool(int)>& skip) const;
  // Elements acquired from the cursor until `block`'s next use (kNever
  // when it is not used again this step or while recording).
  int64_t NextUseDistance(int block) const;
  // Keep `block` gathered on release: its next use is within the reuse
  // distance.
  bool KeepOnRelease(int block) const { return NextUseDistance(block) <= options_.max_reuse_distance_elems; }
  const PrefetchOptions& options() const { return options_; }

 private:
  PrefetchOptions options_;
  std::vector<int64_t> block_elems_;
  std::vector<int> trace_;
  size_t cursor_ = 0;  // replaying: the next expected position in trace_
  bool replaying_ = false;
  int64_t order_changes_ = 0;
};

}  // namespace zinf::zero3
