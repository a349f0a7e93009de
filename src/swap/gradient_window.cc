// GradientWindow (gradient_window.h).
#include "swap/gradient_window.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>

#include "core/crc32c.h"
#include "optim/array_ops.h"

namespace zinf::swap {

namespace {

// `cut` as ShardSquares uses it: at least 1, at most the shard.
int64_t ClampCut(int64_t cut, int64_t total) { return std::clamp<int64_t>(cut, 1, std::max<int64_t>(total, 1)); }

// Piece boundaries below p: multiples of kAtom and of `cut` in [0, p), each
// common multiple (of `lcm`) counted once.
int64_t BoundariesBelow(int64_t p, int64_t cut, int64_t lcm) {
  auto up = [p](int64_t d) { return (p + d - 1) / d; };
  return up(ShardSquares::kAtom) + up(cut) - up(lcm);
}

}  // namespace

ShardSquares::ShardSquares(int64_t total, int64_t cut) : total_(total), cut_(ClampCut(cut, total)) {
  lcm_ = std::lcm(kAtom, cut_);
  sums_.assign(static_cast<size_t>(PieceIndex(total_)), 0.0);
  bounds_.reserve(sums_.size() + 1);  // Add's most: every piece and the end
}

int64_t ShardSquares::FootprintBytes(int64_t total, int64_t cut) {
  const int64_t c = ClampCut(cut, total);
  const int64_t pieces = BoundariesBelow(total, c, std::lcm(kAtom, c));
  return pieces * int64_t{sizeof(double)} + (pieces + 1) * int64_t{sizeof(int64_t)};
}

int64_t ShardSquares::PieceIndex(int64_t p) const { return BoundariesBelow(p, cut_, lcm_); }

int64_t ShardSquares::NextBoundary(int64_t p) const {
  const int64_t a = (p / kAtom + 1) * kAtom, c = (p / cut_ + 1) * cut_;
  return std::min({a, c, total_});
}

Status ShardSquares::CheckRange(int64_t begin, int64_t n) const {
  const int64_t end = begin + n;
  if (begin < 0 || n < 0 || end > total_ || !IsBoundary(begin) || !IsBoundary(end)) {
    return Status::InvalidArgument("sum of squares: [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   ") is not a range of whole pieces of the shard");
  }
  return Status::Ok();
}

Status ShardSquares::Add(optim::ThreadPool& pool, optim::Isa isa, int64_t begin, const float* x, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckRange(begin, n));
  const int64_t end = begin + n;
  bounds_.clear();
  for (int64_t p = begin; p < end; p = NextBoundary(p)) bounds_.push_back(p - begin);
  const int64_t pieces = static_cast<int64_t>(bounds_.size());
  bounds_.push_back(n);
  return optim::SumSquaresPieces(pool, isa, x, bounds_.data(), pieces, sums_.data() + PieceIndex(begin));
}

Status ShardSquares::AddSerial(optim::Isa isa, int64_t begin, const float* x, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckRange(begin, n));
  // The pieces in batches, their offsets on the stack.
  constexpr int64_t kBatch = 64;
  int64_t bounds[kBatch + 1];
  const int64_t end = begin + n;
  int64_t index = PieceIndex(begin);
  for (int64_t p = begin; p < end;) {
    const int64_t first = p;
    int64_t pieces = 0;
    for (; pieces < kBatch && p < end; ++pieces, p = NextBoundary(p)) bounds[pieces] = p - first;
    bounds[pieces] = p - first;
    ZINF_RETURN_IF_ERROR(optim::SumSquaresPiecesSerial(isa, x + (first - begin), bounds, pieces, sums_.data() + index));
    index += pieces;
  }
  return Status::Ok();
}

double ShardSquares::Total() const {
  double sum = 0.0;
  for (double x : sums_) sum += x;
  return sum;
}

void ShardSquares::Reset() { std::fill(sums_.begin(), sums_.end(), 0.0); }

StatusOr<double> ShardSumSquares(optim::ThreadPool& pool, optim::Isa isa, const float* x, int64_t n, int64_t cut) {
  ShardSquares squares(n, cut);
  ZINF_RETURN_IF_ERROR(squares.Add(pool, isa, 0, x, n));
  return squares.Total();
}

int64_t GradientWindow::BufferCount(const OptimizerSwapperOptions& options, int64_t largest_add) {
  const int64_t sg = std::max<int64_t>(1, options.sub_group_elems);
  // A range of n >= 1 elements touches at most ceil((n - 1) / sg) + 1
  // sub-groups (its first element may be the last of one).
  const int64_t touched = largest_add < 1 ? 1 : (largest_add - 1 + sg - 1) / sg + 1;
  return std::max(kMinBuffers, std::min(touched, OptimizerSwapper::PoolBuffers(options)));
}

aio::PinnedPoolOptions GradientWindow::PoolOptions(const OptimizerSwapperOptions& options, bool pin,
                                                   int64_t largest_add) {
  aio::PinnedPoolOptions po;
  po.name = "gradient window";
  po.buffer_count = 0;
  if (options.device != OffloadDevice::kNvme || !options.gradients_in_store) return po;
  po.buffer_count = BufferCount(options, largest_add);
  po.buffer_bytes = OptimizerSwapper::RequiredBufferBytes(options, options.store.alignment_bytes);
  po.alignment_bytes = options.store.alignment_bytes;
  po.pin = pin;
  po.require_pinned = false;
  po.huge_pages = true;  // streamed: 1 MiB requests stay whole (aio/pinned_pool.h)
  po.numa_node = -1;
  return po;
}

StatusOr<std::unique_ptr<GradientWindow>> GradientWindow::Create(OptimizerSwapper* swapper, aio::PinnedPool* pool,
                                                                 optim::ThreadPool* threads, optim::Isa isa,
                                                                 int64_t norm_cut) {
  if (swapper == nullptr || swapper->store() == nullptr || !swapper->gradients_in_store()) {
    return Status::InvalidArgument("gradient window: needs an optimizer state on NVMe that keeps the gradient");
  }
  if (pool == nullptr || threads == nullptr)
    return Status::InvalidArgument("gradient window: needs a pool and threads");
  std::unique_ptr<GradientWindow> w(new GradientWindow(swapper, threads, isa, norm_cut));
  const int64_t groups = swapper->num_sub_groups();
  const int64_t need = swapper->store()->PaddedBytes(swapper->sub_group_elems(0) * int64_t{sizeof(float)});
  if (pool->buffer_count() < kMinBuffers) {
    return Status::InvalidArgument("gradient window: " + std::to_string(pool->buffer_count()) +
                                   " buffers in its pool, at least " + std::to_string(kMinBuffers) + " needed");
  }
  w->buffers_.resize(static_cast<size_t>(pool->buffer_count()));
  for (Buffer& b : w->buffers_) {
    auto lease = pool->TryAcquire(need);
    if (!lease.ok()) {
      return lease.status().WithContext("gradient window: " + std::to_string(w->buffers_.size()) + " buffers");
    }
    b.data = std::move(lease).value();
    // Sub-group 0 is the largest.
    const size_t extents = static_cast<size_t>(w->store_.extent_count(swapper->GradientTensor(0)));
    b.crc.assign(extents, 0);
    b.sealed.assign(extents, 0);
  }
  w->touched_.assign(static_cast<size_t>(groups), false);
  w->squared_.assign(static_cast<size_t>(groups), false);
  return w;
}

GradientWindow::~GradientWindow() { Drain().IgnoreError(); }

GradientWindow::Buffer* GradientWindow::Holding(int64_t k) {
  for (Buffer& b : buffers_) {
    if (b.sub_group == k) return &b;
  }
  return nullptr;
}

Status GradientWindow::WaitRead(Buffer& b) {
  if (!b.read.valid()) return Status::Ok();
  Status s = store_.Wait(b.read);
  b.read = {};
  if (!s.ok()) b.sub_group = -1;
  return s;
}

Status GradientWindow::WaitWrite(Buffer& b) {
  if (!b.write.valid()) return Status::Ok();
  Status s = store_.Wait(b.write);
  b.write = {};
  return s;
}

// The squares are taken here, from the values going to the store, when they
// are the cycle's final ones (changed in its last micro-batch); a later Add
// to the sub-group takes them again.
Status GradientWindow::StartWrite(Buffer& b) {
  const int64_t k = b.sub_group;
  const int64_t n = swapper_.sub_group_elems(k);
  ZeroUnset(b);
  const TensorId tensor = swapper_.GradientTensor(k);
  if (b.last && Sealable(k)) {
    // The squares and crcs of what SetAndSeal did not seal, an extent per
    // task; the store takes every crc as given.
    ZINF_RETURN_IF_ERROR(SealRest(b));
    squared_[static_cast<size_t>(k)] = true;
    ZINF_ASSIGN_OR_RETURN(b.write, store_.checksums() ? store_.SwapOut(tensor, b.data.data(), b.crc.data())
                                                      : store_.SwapOut(tensor, b.data.data()));
  } else {
    if (b.last) {
      ZINF_RETURN_IF_ERROR(squares_.Add(threads_, isa_, swapper_.sub_group_begin(k), Floats(b), n));
      squared_[static_cast<size_t>(k)] = true;
    }
    ZINF_ASSIGN_OR_RETURN(b.write, store_.SwapOut(tensor, b.data.data()));
  }
  nvme_bytes_ += n * int64_t{sizeof(float)};
  b.dirty = false;
  return Status::Ok();
}

void GradientWindow::ZeroUnset(Buffer& b) {
  Unseal(b, 0, b.unset);
  std::memset(b.data.data(), 0, static_cast<size_t>(b.unset) * sizeof(float));
  b.unset = 0;
}

bool GradientWindow::Sealable(int64_t k) const {
  constexpr int64_t kAtomBytes = ShardSquares::kAtom * int64_t{sizeof(float)};
  return store_.stripe_bytes() % kAtomBytes == 0 && swapper_.sub_group_begin(k) % ShardSquares::kAtom == 0;
}

void GradientWindow::ExtentOf(int64_t k, int64_t e, int64_t* lo, int64_t* hi, int64_t* bytes) const {
  const int64_t stripe = store_.stripe_bytes(), per = stripe / int64_t{sizeof(float)};
  const int64_t n = swapper_.sub_group_elems(k);
  *lo = e * per;
  *hi = std::min(n, *lo + per);
  *bytes = store_.extent_bytes(swapper_.GradientTensor(k), e);
}

void GradientWindow::Unseal(Buffer& b, int64_t lo, int64_t hi) {
  if (hi <= lo) return;
  const int64_t per = store_.stripe_bytes() / int64_t{sizeof(float)};
  std::fill(b.sealed.begin() + lo / per, b.sealed.begin() + (hi - 1) / per + 1, uint8_t{0});
}

// Extent e's squares and crc from the bytes b holds: on a pool thread
// (AddSerial), beside other extents' tasks.
Status GradientWindow::SealOne(Buffer& b, int64_t e) {
  int64_t lo = 0, hi = 0, bytes = 0;
  ExtentOf(b.sub_group, e, &lo, &hi, &bytes);
  ZINF_RETURN_IF_ERROR(squares_.AddSerial(isa_, swapper_.sub_group_begin(b.sub_group) + lo, Floats(b) + lo, hi - lo));
  const size_t i = static_cast<size_t>(e);
  if (store_.checksums()) b.crc[i] = Crc32c(b.data.data() + e * store_.stripe_bytes(), static_cast<size_t>(bytes));
  b.sealed[i] = 1;
  return Status::Ok();
}

// fn(e) for each extent e in [first, end), one pool task per extent; the
// first error.
Status GradientWindow::EachExtent(int64_t first, int64_t end, optim::FunctionRef<Status(int64_t)> fn) {
  std::mutex mu;
  Status failed;
  threads_.ParallelFor(end - first, 1, [&](int64_t, int64_t t0, int64_t t1) {
    for (int64_t e = first + t0; e < first + t1; ++e) {
      Status s = fn(e);
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (failed.ok()) failed = s;
    }
  });
  return failed;
}

Status GradientWindow::SetAndSeal(Buffer& b, int64_t r_lo, int64_t r_hi, const float* src, float scale) {
  const int64_t per = store_.stripe_bytes() / int64_t{sizeof(float)};
  const int64_t old = b.unset;
  float* x = Floats(b);
  // The extents [r_lo, old) overlaps.
  return EachExtent(r_lo / per, (old - 1) / per + 1, [&](int64_t e) {
    int64_t lo = 0, hi = 0, bytes = 0;
    ExtentOf(b.sub_group, e, &lo, &hi, &bytes);
    const int64_t set_lo = std::max(lo, r_lo), set_hi = std::min(hi, r_hi);
    if (set_lo < set_hi) optim::SetScaledSerial(src + (set_lo - r_lo), scale, x + set_lo, set_hi - set_lo);
    const int64_t zero_lo = std::max(lo, r_hi), zero_hi = std::min(hi, old);
    if (zero_lo < zero_hi) std::memset(x + zero_lo, 0, static_cast<size_t>(zero_hi - zero_lo) * sizeof(float));
    b.sealed[static_cast<size_t>(e)] = 0;
    return lo < r_lo ? Status::Ok() : SealOne(b, e);  // below r_lo it holds no value yet
  });
}

Status GradientWindow::SealRest(Buffer& b) {
  return EachExtent(0, store_.extent_count(swapper_.GradientTensor(b.sub_group)),
                    [&](int64_t e) { return b.sealed[static_cast<size_t>(e)] ? Status::Ok() : SealOne(b, e); });
}

StatusOr<GradientWindow::Buffer*> GradientWindow::Victim(const Buffer* keep) {
  Buffer* best = nullptr;
  for (Buffer& b : buffers_) {
    if (&b == keep) continue;
    // Empty first, then clean ones (their write may still be in flight),
    // then one read ahead, then the least recently used.
    auto rank = [](const Buffer& x) { return x.sub_group < 0 ? 0 : x.dirty ? 3 : x.read.valid() ? 2 : 1; };
    if (best == nullptr || rank(b) < rank(*best) || (rank(b) == rank(*best) && b.used < best->used)) best = &b;
  }
  if (best->dirty) ZINF_RETURN_IF_ERROR(StartWrite(*best));
  ZINF_RETURN_IF_ERROR(WaitRead(*best));
  ZINF_RETURN_IF_ERROR(WaitWrite(*best));
  best->Hold(-1);
  return best;
}

StatusOr<GradientWindow::Buffer*> GradientWindow::Acquire(int64_t k) {
  Buffer* b = Holding(k);
  if (b != nullptr) {
    ZINF_RETURN_IF_ERROR(WaitRead(*b));
    ZINF_RETURN_IF_ERROR(WaitWrite(*b));  // the buffer changes below
    if (b->sub_group == k) return b;
  }
  ZINF_ASSIGN_OR_RETURN(b, Victim(nullptr));
  const size_t bytes = static_cast<size_t>(store_.PaddedBytes(swapper_.sub_group_elems(k) * int64_t{sizeof(float)}));
  if (touched_[static_cast<size_t>(k)]) {
    b->unset = 0;
    ZINF_ASSIGN_OR_RETURN(b->read, store_.SwapIn(swapper_.GradientTensor(k), b->data.data()));
    nvme_bytes_ += swapper_.sub_group_elems(k) * int64_t{sizeof(float)};
    b->sub_group = k;
    ZINF_RETURN_IF_ERROR(WaitRead(*b));
  } else {
    // The cycle starts from a zero gradient: the padding now, the values
    // as the Adds come (Buffer::unset).
    const int64_t n = swapper_.sub_group_elems(k);
    std::memset(b->data.data() + n * int64_t{sizeof(float)}, 0, bytes - static_cast<size_t>(n) * sizeof(float));
    b->unset = n;
    b->sub_group = k;
  }
  return b;
}

// Sub-group k, touched earlier in the cycle, read into a buffer that holds
// nothing unwritten and is not being written, while the caller works on
// `keep`. Best effort: nothing waits here.
void GradientWindow::ReadAhead(int64_t k, const Buffer* keep) {
  if (k < 0 || !touched_[static_cast<size_t>(k)] || Holding(k) != nullptr) return;
  for (Buffer& b : buffers_) {
    if (&b == keep || b.dirty || b.read.valid() || (b.write.valid() && !store_.IsDone(b.write))) continue;
    if (!WaitWrite(b).ok()) return;  // the store's error is sticky: the next Add reports it
    auto h = store_.SwapIn(swapper_.GradientTensor(k), b.data.data());
    if (!h.ok()) return;
    b.read = *h;
    b.unset = 0;
    b.Hold(k);
    b.used = ++clock_;
    nvme_bytes_ += swapper_.sub_group_elems(k) * int64_t{sizeof(float)};
    return;
  }
}

Status GradientWindow::Add(int64_t begin, int64_t count, const float* g, float scale, bool last) {
  final_.clear();  // the buffers change below
  const int64_t total = swapper_.total_elems();
  if (begin < 0 || count < 0 || begin > total - count) {
    return Status::InvalidArgument("gradient window: range [" + std::to_string(begin) + ", +" + std::to_string(count) +
                                   ") outside " + std::to_string(total));
  }
  if (count == 0) return Status::Ok();
  const int64_t sg = swapper_.sub_group_elems(0);
  const int64_t first = begin / sg, end_group = (begin + count - 1) / sg;
  // Highest sub-group first: the order in which the backward pass goes on.
  for (int64_t k = end_group; k >= first; --k) {
    const int64_t lo = std::max(begin, swapper_.sub_group_begin(k));
    const int64_t hi = std::min(begin + count, swapper_.sub_group_begin(k) + swapper_.sub_group_elems(k));
    auto b = Acquire(k);
    if (!b.ok()) return b.status().WithContext("gradient sub-group " + std::to_string(k));
    Buffer& buf = **b;
    buf.used = ++clock_;
    touched_[static_cast<size_t>(k)] = true;
    if (last) squared_[static_cast<size_t>(k)] = false;
    const int64_t r_lo = lo - swapper_.sub_group_begin(k), r_hi = hi - swapper_.sub_group_begin(k);
    float* dst = Floats(buf) + r_lo;
    if (r_hi <= buf.unset && last && Sealable(k)) {  // below everything set so far, final values
      ZINF_RETURN_IF_ERROR(SetAndSeal(buf, r_lo, r_hi, g + (lo - begin), scale));
      buf.unset = r_lo;
    } else if (r_hi <= buf.unset) {  // the same, not sealed: set, zeroing any gap above
      Unseal(buf, r_lo, buf.unset);
      std::memset(Floats(buf) + r_hi, 0, static_cast<size_t>(buf.unset - r_hi) * sizeof(float));
      ZINF_RETURN_IF_ERROR(optim::SetScaled(threads_, g + (lo - begin), scale, dst, hi - lo));
      buf.unset = r_lo;
    } else {
      if (r_lo < buf.unset) ZeroUnset(buf);  // straddles the unset part (out of the backward's order)
      Unseal(buf, r_lo, r_hi);
      ZINF_RETURN_IF_ERROR(optim::AddScaled(threads_, g + (lo - begin), scale, dst, hi - lo));
    }
    buf.dirty = true;
    buf.last = buf.last || last;
    // Sub-groups wholly above this range are done for now: write them back
    // while the caller goes on.
    for (Buffer& other : buffers_) {
      if (other.dirty && other.sub_group > k) {
        Status s = StartWrite(other);
        if (!s.ok()) return s.WithContext("gradient sub-group " + std::to_string(other.sub_group));
      }
    }
    // The range reaches the sub-group's start: the next one down comes next.
    if (lo == swapper_.sub_group_begin(k)) ReadAhead(k - 1, &buf);
  }
  return Status::Ok();
}

Status GradientWindow::Drain() {
  Status first;
  for (Buffer& b : buffers_) {
    Status r = WaitRead(b);
    Status w = WaitWrite(b);
    if (first.ok()) first = r;
    if (first.ok()) first = w;
  }
  return first;
}

Status GradientWindow::Flush() {
  final_.clear();
  Status s;
  for (Buffer& b : buffers_) {
    if (s.ok() && b.dirty) s = StartWrite(b);
  }
  Status d = Drain();
  return s.ok() ? d : s;
}

StatusOr<double> GradientWindow::Finish() {
  Status s = Flush();
  Status d;
  // Untouched sub-groups: zeros for the step. Touched ones never squared
  // (not added to in the last micro-batch): read back for their squares
  // (or found in a buffer: written, so the store's values).
  // Highest first, so the buffers end up holding the lowest sub-groups,
  // which the step needs first (FinalGradient); the squares are summed by
  // piece, in any order.
  for (int64_t k = swapper_.num_sub_groups() - 1; s.ok() && k >= 0; --k) {
    const size_t i = static_cast<size_t>(k);
    if (touched_[i] && squared_[i]) continue;
    auto b = Acquire(k);  // zeros when untouched, else read back
    if (!b.ok()) {
      s = b.status().WithContext("gradient sub-group " + std::to_string(k));
      break;
    }
    (*b)->last = true;
    (*b)->used = ++clock_;
    if (!touched_[i]) {
      s = StartWrite(**b);
    } else {
      s = squares_.Add(threads_, isa_, swapper_.sub_group_begin(k), Floats(**b), swapper_.sub_group_elems(k));
    }
    (*b)->last = false;
  }
  d = Drain();
  if (s.ok()) s = d;
  const double sum = squares_.Total();
  std::vector<int64_t> held;
  for (const Buffer& b : buffers_) held.push_back(b.sub_group);
  Reset();
  if (!s.ok()) return s;
  final_ = std::move(held);  // every write is done: what they hold is what the store holds
  return sum;
}

int64_t GradientWindow::FinalGradientElems() const {
  int64_t n = 0;
  for (int64_t k : final_) n += k >= 0 ? swapper_.sub_group_elems(k) : 0;
  return n;
}

const float* GradientWindow::FinalGradient(int64_t k) const {
  for (size_t i = 0; i < final_.size(); ++i) {
    if (final_[i] == k) return reinterpret_cast<const float*>(buffers_[i].data.data());
  }
  return nullptr;
}

void GradientWindow::Reset() {
  final_.clear();
  Drain().IgnoreError();
  for (Buffer& b : buffers_) {
    b.Hold(-1);
    b.dirty = false;
    b.unset = 0;
  }
  std::fill(touched_.begin(), touched_.end(), false);
  std::fill(squared_.begin(), squared_.end(), false);
  squares_.Reset();
}

}  // namespace zinf::swap
