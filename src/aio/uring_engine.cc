#include "aio/uring_engine.h"

#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "aio/completion.h"
#include "aio/posix_engine.h"
#include "core/check.h"
#include "core/log.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

// A fixed-capacity FIFO; never allocates after construction.
template <typename T>
class FixedFifo {
 public:
  explicit FixedFifo(size_t capacity) : items_(capacity) {}
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  void push(T v) {
    ZINF_CHECK_MSG(size_ < items_.size(), "bounded FIFO overflow");
    items_[(head_ + size_) % items_.size()] = v;
    ++size_;
  }
  T& front() { return items_[head_]; }
  T pop() {
    T v = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --size_;
    return v;
  }

 private:
  std::vector<T> items_;
  size_t head_ = 0;
  size_t size_ = 0;
};

int64_t PiecesIn(const IoSegment& seg, int64_t bs) { return (seg.length + bs - 1) / bs; }

// The scheduler slice a ring's thread asks for: the shortest Linux takes.
// The thread wakes for every completion and works for microseconds before
// it waits again. With the default slice (1.4 ms on 2 cores, longer on
// more), a woken thread may wait for a computing one (Adam, checksums,
// matmuls) to use up its slice, long enough for the disk to finish the
// queue's 8 requests and sit idle. With this one the disk was idle in about
// a third as many samples, and the NVMe optimizer step ran 3-4% faster
// (zinf bench swap and the 510M scenario, on 2 cores). Linux 6.12 and later
// (custom slices of the fair scheduler); older kernels ignore it.

// struct sched_attr's first version (48 bytes), declared here because
// glibc declares it in some versions and not in others.
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;
  uint64_t deadline;
  uint64_t period;
};
static_assert(sizeof(SchedAttr) == 48);

// Asks for kRingThreadSliceNs for the calling thread, keeping its policy and
// nice value; left alone under a real-time or idle policy. Best effort: a
// kernel that refuses it logs once, at debug level.
void AskForShortSlice() {
  SchedAttr attr{};
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) return;
  if (attr.policy != SCHED_OTHER && attr.policy != SCHED_BATCH) return;
  attr.size = sizeof(attr);
  constexpr uint64_t kFlagResetOnFork = 0x01;  // SCHED_FLAG_RESET_ON_FORK
  attr.flags &= kFlagResetOnFork;              // the only flag passed back as it was
  attr.runtime = kRingThreadSliceNs;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    static std::once_flag once;
    const int err = errno;
    std::call_once(once, [err] {
      Log("aio").debug("io_uring: the kernel refuses a {} us slice for the ring's thread ({})",
                       kRingThreadSliceNs / 1000, std::strerror(err));
    });
  }
}

Status InitRing(io_uring* ring, int queue_depth) {
  io_uring_params params = {};
  params.flags = IORING_SETUP_COOP_TASKRUN;
  const unsigned entries = static_cast<unsigned>(std::max(queue_depth, 1));
  int rc = io_uring_queue_init_params(entries, ring, &params);
  if (rc == -EINVAL) {  // kernels before 5.19 lack COOP_TASKRUN
    params = {};
    rc = io_uring_queue_init_params(entries, ring, &params);
  }
  if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
  return Status::Ok();
}

}  // namespace

Status ProbeUring() {
  io_uring ring;
  ZINF_RETURN_IF_ERROR(InitRing(&ring, 2));
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  Status st;
  if (probe == nullptr) {
    st = Status::Unavailable("io_uring: the kernel cannot list its opcodes (IORING_REGISTER_PROBE)");
  } else {
    for (int op : {IORING_OP_READ, IORING_OP_WRITE, IORING_OP_READ_FIXED, IORING_OP_WRITE_FIXED}) {
      if (!io_uring_opcode_supported(probe, op)) {
        st = Status::Unavailable("io_uring: the kernel lacks opcode " + std::to_string(op));
        break;
      }
    }
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return st;
}

// One ring and the thread that owns it.
class UringEngine::Worker {
 public:
  Worker(UringEngine* engine, int index)
      : engine_(engine),
        index_(index),
        bs_(engine->options_.block_size_bytes),
        qd_(engine->options_.queue_depth),
        threads_(engine->options_.thread_count),
        single_submit_(engine->options_.single_submit),
        overlap_(engine->options_.overlap_events),
        mix_run_(engine->options_.mix_run_pieces),
        queue_(engine->options_.max_requests),
        issue_{FixedFifo<uint32_t>(engine->options_.max_requests), FixedFifo<uint32_t>(engine->options_.max_requests)},
        parts_(engine->options_.max_requests),
        pieces_(qd_),
        free_ids_(qd_),
        retry_(qd_),
        delayed_(qd_) {
    for (int i = 0; i < qd_; ++i) free_ids_.push(i);
  }

  ~Worker() {
    if (thread_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stopping_ = true;
      }
      cv_.notify_one();
      thread_.join();
    }
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  Status Init() {
    ZINF_RETURN_IF_ERROR(InitRing(&ring_, qd_));
    ring_ready_ = true;
    return Status::Ok();
  }
  io_uring* ring() { return &ring_; }

  // This ring's share of UringEngine::queue_time (any thread).
  IoQueueTime queue_time() const { return queue_clock_.time(); }

  void Start() {
    thread_ = std::thread([this] {
      const std::string name = "zinf-aio-" + std::to_string(index_);
      pthread_setname_np(pthread_self(), name.c_str());
      AskForShortSlice();
      Run();
    });
  }

  // Called by Submit: this worker takes part in request `slot`, starting at
  // the request's piece `first_piece`.
  void Enqueue(uint32_t slot, int64_t first_piece) {
    {
      std::lock_guard lock(mu_);
      queue_.push({slot, first_piece});
    }
    cv_.notify_one();
  }

 private:
  struct NewPart {
    uint32_t slot;
    int64_t first_piece;
  };
  // This worker's share of one request (indexed by request slot).
  struct Part {
    size_t seg = 0;  // cursor: segment of the next piece
    int64_t piece_in_seg = 0;
    bool exhausted = false;  // no more pieces to issue
    bool queued = false;     // in issue_
    uint64_t order = 0;      // when this worker took it (mix_run_ 0)
    int inflight = 0;        // pieces issued and not completed
    Status status;
  };
  struct InflightPiece {
    uint32_t slot = 0;
    Piece piece;
  };
  struct Delayed {
    int id;
    int rounds;
    int64_t res;
  };

  // Pieces in flight in direction `op` change by `delta` (queue_time).
  void CountInFlight(IoOp op, int delta) { queue_clock_.Change(op, delta, NowNs()); }

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void Advance(Part& p, const std::vector<IoSegment>& segs, int64_t n) {
    p.piece_in_seg += n;
    while (p.seg < segs.size() && p.piece_in_seg >= PiecesIn(segs[p.seg], bs_)) {
      p.piece_in_seg -= PiecesIn(segs[p.seg], bs_);
      ++p.seg;
    }
    if (p.seg >= segs.size()) p.exhausted = true;
  }

  void TakeNewWork() {
    std::unique_lock lock(mu_);
    const bool idle = busy_ == 0 && issue_[0].empty() && issue_[1].empty();
    if (idle) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    while (!queue_.empty()) {
      const NewPart np = queue_.pop();
      Part& p = parts_[np.slot];
      p = Part{};
      Advance(p, engine_->requests_.slot(np.slot).segments, np.first_piece);
      ZINF_CHECK_MSG(!p.exhausted, "worker enqueued for a request with no piece for it");
      p.queued = true;
      p.order = taken_++;
      issue_[static_cast<int>(engine_->requests_.slot(np.slot).op)].push(np.slot);
    }
  }

  void MaybeFinish(uint32_t slot) {
    Part& p = parts_[slot];
    if (p.exhausted && p.inflight == 0 && !p.queued) {
      const Status st = p.status;
      p = Part{};
      engine_->requests_.FinishPart(slot, st);
    }
  }

  // The next piece to issue. Oldest request first in one direction; with
  // reads and writes both waiting, runs of mix_run_ pieces by turns (one
  // queue in submission order when mix_run_ is 0).
  bool NextPiece(uint32_t* slot_out, Piece* out) {
    while (!issue_[0].empty() || !issue_[1].empty()) {
      const int other = 1 - dir_;
      if (mix_run_ == 0 ? OlderFront(other) : (run_ >= mix_run_ || issue_[dir_].empty()) && !issue_[other].empty()) {
        dir_ = other;
        run_ = 0;
      }
      if (TakePiece(issue_[dir_], slot_out, out)) {
        ++run_;
        return true;
      }
      // A failed request left the front, or the queue was empty: choose again.
    }
    return false;
  }

  // Whether queue `d`'s oldest request came before the other queue's.
  bool OlderFront(int d) {
    if (issue_[d].empty()) return false;
    return issue_[1 - d].empty() || parts_[issue_[d].front()].order < parts_[issue_[1 - d].front()].order;
  }

  // The next piece of the oldest request in `q`; false when `q` is empty
  // or its oldest request has failed (taken off the queue and finished).
  bool TakePiece(FixedFifo<uint32_t>& q, uint32_t* slot_out, Piece* out) {
    if (q.empty()) return false;
    const uint32_t slot = q.front();
    Part& p = parts_[slot];
    RequestTable::Slot& req = engine_->requests_.slot(slot);
    if (!p.exhausted && req.failed.load(std::memory_order_relaxed)) p.exhausted = true;
    if (p.exhausted) {  // failed: issue nothing more
      q.pop();
      p.queued = false;
      MaybeFinish(slot);
      return false;
    }
    const IoSegment& seg = req.segments[p.seg];
    const int64_t at = p.piece_in_seg * bs_;
    *out = Piece{};
    out->op = req.op;
    out->file = seg.file;
    out->offset = seg.offset + at;
    out->length = std::min(bs_, seg.length - at);
    out->buffer = static_cast<char*>(seg.buffer) + at;
    *slot_out = slot;
    ++p.inflight;
    Advance(p, req.segments, threads_);
    if (p.exhausted) {
      q.pop();
      p.queued = false;
    }
    return true;
  }

  void Prep(int id) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    ZINF_CHECK_MSG(sqe != nullptr, "io_uring SQ full although in-flight pieces <= queue_depth");
    const Piece& pc = pieces_[id].piece;
    const bool fixed_file = engine_->fixed_files_ && engine_->file_fixed_[pc.file];
    const int fd = fixed_file ? pc.file : engine_->files_.Get(pc.file).fd();
    const auto len = static_cast<unsigned>(pc.remaining());
    const int buf_index = engine_->fixed_buffers_ ? engine_->RegionOf(pc.next_buffer(), pc.remaining()) : -1;
    if (pc.op == IoOp::kRead) {
      if (buf_index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, pc.next_buffer(), len, pc.next_offset(), buf_index);
      } else {
        io_uring_prep_read(sqe, fd, pc.next_buffer(), len, pc.next_offset());
      }
    } else {
      if (buf_index >= 0) {
        io_uring_prep_write_fixed(sqe, fd, pc.next_buffer(), len, pc.next_offset(), buf_index);
      } else {
        io_uring_prep_write(sqe, fd, pc.next_buffer(), len, pc.next_offset());
      }
    }
    if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(id));
    ++in_kernel_;
  }

  // Submits prepared SQEs and waits for `wait_nr` completions. io_uring
  // never fails this for a well-formed ring that is never overfilled, except
  // transiently; anything else is a bug in this file.
  void SubmitPrepared(unsigned wait_nr = 0) {
    for (int attempt = 0;; ++attempt) {
      const int rc = io_uring_submit_and_wait(&ring_, wait_nr);
      if (rc >= 0) return;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == -ENOMEM) {
        if (attempt > 8) std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const std::string msg = "io_uring_submit: " + std::string(std::strerror(-rc));
      internal::CheckFailed("io_uring_submit succeeded", __FILE__, __LINE__, msg.c_str());
    }
  }

  void Fill() {
    int prepared = 0;
    while (true) {
      int id;
      if (!retry_.empty()) {
        id = retry_.pop();
      } else {
        if (busy_ >= qd_) break;
        uint32_t slot;
        Piece piece;
        if (!NextPiece(&slot, &piece)) break;
        id = free_ids_.pop();
        pieces_[id] = {slot, piece};
        ++busy_;
        CountInFlight(piece.op, +1);
      }
      Prep(id);
      ++prepared;
      if (single_submit_) SubmitPrepared();
    }
    // Batched mode leaves the SQEs for Reap's io_uring_submit_and_wait: one
    // syscall submits the batch and waits for completions.
    (void)prepared;
  }

  void Complete(int id, int64_t res) {
    InflightPiece& ip = pieces_[id];
    const FileInfo& info = engine_->files_.Get(ip.piece.file).info();
    Status error;
    const PieceAction action = HandleCompletion(ip.piece, res, info, &error);
    if (action == PieceAction::kResubmit) {
      retry_.push(id);
      return;
    }
    Part& p = parts_[ip.slot];
    if (action == PieceAction::kFailed) {
      if (p.status.ok()) p.status = error;
      p.exhausted = true;
      engine_->requests_.slot(ip.slot).failed.store(true, std::memory_order_relaxed);
    }
    --p.inflight;
    --busy_;
    CountInFlight(ip.piece.op, -1);
    free_ids_.push(id);
    MaybeFinish(ip.slot);
  }

  void Reap() {
    if (in_kernel_ == 0) {
      // Nothing left to overtake a held completion: release them all.
      while (!delayed_.empty()) {
        const Delayed d = delayed_.pop();
        Complete(d.id, d.res);
      }
      return;
    }
    const unsigned wait_nr = overlap_ ? 1u : static_cast<unsigned>(in_kernel_);
    if (io_uring_cq_ready(&ring_) < wait_nr || io_uring_sq_ready(&ring_) > 0) SubmitPrepared(wait_nr);
    io_uring_cqe* cqe = nullptr;
    // Age the held completions before adding this round's.
    for (size_t n = delayed_.size(); n > 0; --n) {
      Delayed d = delayed_.pop();
      if (--d.rounds <= 0) {
        Complete(d.id, d.res);
      } else {
        delayed_.push(d);
      }
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      --in_kernel_;
      const int id = static_cast<int>(io_uring_cqe_get_data64(cqe));
      int64_t res = cqe->res;
      if (const auto& hook = engine_->options_.completion_hook) {
        const FileInfo& info = engine_->files_.Get(pieces_[id].piece.file).info();
        const CompletionHook::Decision d = hook->OnCompletion(pieces_[id].piece, info, res);
        if (d.delay_rounds > 0) {
          delayed_.push({id, d.delay_rounds, d.res});
          continue;
        }
        res = d.res;
      }
      Complete(id, res);
    }
    io_uring_cq_advance(&ring_, seen);
  }

  void Run() {
    for (;;) {
      TakeNewWork();
      {
        std::lock_guard lock(mu_);
        if (stopping_ && queue_.empty() && busy_ == 0 && issue_[0].empty() && issue_[1].empty()) return;
      }
      if (overlap_ || in_kernel_ == 0) Fill();
      Reap();
    }
  }

  UringEngine* engine_;
  const int index_;
  const int64_t bs_;
  const int qd_;
  const int threads_;
  const bool single_submit_;
  const bool overlap_;
  const int mix_run_;
  io_uring ring_ = {};
  bool ring_ready_ = false;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  FixedFifo<NewPart> queue_;  // guarded by mu_
  bool stopping_ = false;     // guarded by mu_

  // Owned by the worker thread:
  // Parts with pieces left, oldest first, by direction (IoOp).
  std::array<FixedFifo<uint32_t>, 2> issue_;
  int dir_ = 0;                        // the direction NextPiece issues
  int run_ = 0;                        // pieces issued in it since it last changed
  uint64_t taken_ = 0;                 // parts taken so far (Part::order)
  std::vector<Part> parts_;            // by request slot
  std::vector<InflightPiece> pieces_;  // by piece id (user_data)
  FixedFifo<int> free_ids_;
  FixedFifo<int> retry_;
  FixedFifo<Delayed> delayed_;
  int busy_ = 0;                          // piece ids in use: in the kernel, held, or awaiting retry
  QueueClock queue_clock_{qd_, NowNs()};  // pieces in use, by direction
  int in_kernel_ = 0;                     // submitted SQEs whose CQE has not been reaped
};

UringEngine::UringEngine(const IoEngineOptions& options) : options_(options), requests_(options.max_requests) {}

StatusOr<std::unique_ptr<UringEngine>> UringEngine::Create(const IoEngineOptions& options) {
  ZINF_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.simulate_uring_unavailable) {
    return Status::Unavailable("io_uring_queue_init: refused (simulated for a test)");
  }
  ZINF_RETURN_IF_ERROR(ProbeUring());
  std::unique_ptr<UringEngine> engine(new UringEngine(options));
  engine->fixed_files_ = options.register_files;
  engine->fixed_buffers_ = options.register_buffers;
  for (int i = 0; i < options.thread_count; ++i) {
    auto w = std::make_unique<Worker>(engine.get(), i);
    ZINF_RETURN_IF_ERROR(w->Init());
    if (engine->fixed_files_) {
      const int rc = io_uring_register_files_sparse(w->ring(), FileTable::kMaxFiles);
      if (rc < 0) {
        Log("aio").warn("io_uring: cannot register files ({}); using plain file descriptors", std::strerror(-rc));
        engine->fixed_files_ = false;
      }
    }
    if (engine->fixed_buffers_) {
      const int rc = io_uring_register_buffers_sparse(w->ring(), kMaxRegions);
      if (rc < 0) {
        Log("aio").warn("io_uring: cannot register buffers ({}); using unregistered buffers", std::strerror(-rc));
        engine->fixed_buffers_ = false;
      }
    }
    engine->workers_.push_back(std::move(w));
  }
  for (auto& w : engine->workers_) w->Start();
  return engine;
}

void QueueClock::Change(IoOp op, int delta, int64_t now_ns) {
  const int64_t ns = now_ns - last_ns_;
  last_ns_ = now_ns;
  const int reads = in_flight_[0], writes = in_flight_[1];
  if (reads > 0 || writes > 0) {
    const int state = reads > 0 && writes > 0 ? kMixed : reads > 0 ? kReadOnly : kWriteOnly;
    ns_[state].fetch_add(ns, std::memory_order_relaxed);
    if (reads + writes >= queue_depth_) ns_[kFull].fetch_add(ns, std::memory_order_relaxed);
  }
  in_flight_[static_cast<int>(op)] += delta;
}

IoQueueTime QueueClock::time() const {
  IoQueueTime t;
  t.read_only_ns = ns_[kReadOnly].load(std::memory_order_relaxed);
  t.write_only_ns = ns_[kWriteOnly].load(std::memory_order_relaxed);
  t.mixed_ns = ns_[kMixed].load(std::memory_order_relaxed);
  t.full_ns = ns_[kFull].load(std::memory_order_relaxed);
  return t;
}

IoQueueTime UringEngine::queue_time() const {
  IoQueueTime sum;
  for (const auto& w : workers_) sum += w->queue_time();
  return sum;
}

UringEngine::~UringEngine() {
  requests_.WaitAll().IgnoreError();  // the owner saw (or chose not to see) the errors
  workers_.clear();                   // stops and joins each worker, then exits its ring
}

StatusOr<FileId> UringEngine::OpenFile(const std::string& path, const OpenOptions& open) {
  ZINF_ASSIGN_OR_RETURN(File file, OpenForIo(path, open, options_.direct_io));
  const int fd = file.fd();
  ZINF_ASSIGN_OR_RETURN(FileId id, files_.Add(std::move(file)));
  bool fixed = fixed_files_;
  for (auto& w : workers_) {
    if (!fixed) break;
    int fds[1] = {fd};
    const int rc = io_uring_register_files_update(w->ring(), static_cast<unsigned>(id), fds, 1);
    if (rc < 0) {
      Log("aio").warn("io_uring: cannot register {} ({}); using its plain descriptor", path, std::strerror(-rc));
      fixed = false;
    }
  }
  file_fixed_[id] = fixed;
  return id;
}

Status UringEngine::CloseFile(FileId file) {
  ZINF_RETURN_IF_ERROR(files_.CheckOpen(file, "close"));
  if (file_fixed_[file]) {
    for (auto& w : workers_) {
      int fds[1] = {-1};
      io_uring_register_files_update(w->ring(), static_cast<unsigned>(file), fds, 1);
    }
    file_fixed_[file] = false;
  }
  return files_.Remove(file);
}

Status UringEngine::RegisterMemory(void* base, size_t bytes) {
  if (!fixed_buffers_ || bytes == 0) return Status::Ok();
  std::lock_guard lock(register_mu_);
  char* p = static_cast<char*>(base);
  int64_t left = static_cast<int64_t>(bytes);
  int count = region_count_.load();
  while (left > 0) {
    if (count >= kMaxRegions) {
      return Status::ResourceExhausted("io_uring: more than " + std::to_string(kMaxRegions) +
                                       " registered memory regions");
    }
    const int64_t n = std::min(left, kMaxRegionBytes);
    iovec iov = {p, static_cast<size_t>(n)};
    for (auto& w : workers_) {
      const int rc = io_uring_register_buffers_update_tag(w->ring(), static_cast<unsigned>(count), &iov, nullptr, 1);
      if (rc < 0) {
        Log("aio").warn("io_uring: cannot register {} of memory ({}); that memory uses unregistered I/O",
                        FormatBytes(n), std::strerror(-rc));
        return Status::Ok();
      }
    }
    regions_[count] = {p, n};
    region_count_.store(++count);
    p += n;
    left -= n;
  }
  return Status::Ok();
}

int UringEngine::RegionOf(const char* p, int64_t len) const {
  const int n = region_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const Region& r = regions_[i];
    if (p >= r.base && p + len <= r.base + r.bytes) return i;
  }
  return -1;
}

StatusOr<IoTicket> UringEngine::Submit(IoOp op, std::span<const IoSegment> segments) {
  int64_t pieces = 0;
  ZINF_RETURN_IF_ERROR(ValidateSegments(op, segments, files_, options_.block_size_bytes, &pieces));
  const int threads = options_.thread_count;
  const int parts = static_cast<int>(std::min<int64_t>(pieces, threads));
  const int rot = static_cast<int>(rotation_.fetch_add(1, std::memory_order_relaxed) % threads);
  uint32_t slot = 0;
  ZINF_ASSIGN_OR_RETURN(IoTicket ticket, requests_.Allocate(op, segments, parts, pieces, &slot));
  // Piece k goes to worker (k + rot) % threads: worker w starts at (w - rot) mod threads.
  for (int w = 0; w < threads; ++w) {
    const int64_t first = ((w - rot) % threads + threads) % threads;
    if (first < pieces) workers_[w]->Enqueue(slot, first);
  }
  return ticket;
}

Status UringEngine::Sync(FileId file) { return files_.Sync(file); }
StatusOr<int64_t> UringEngine::FileSize(FileId file) { return files_.Size(file); }
Status UringEngine::Truncate(FileId file, int64_t size_bytes) { return files_.Truncate(file, size_bytes); }
Status UringEngine::Allocate(FileId file, int64_t size_bytes) { return files_.Allocate(file, size_bytes); }

uint64_t ThreadSchedulerSliceNs(int tid) {
  SchedAttr attr{};
  if (syscall(SYS_sched_getattr, tid, &attr, sizeof(attr), 0) != 0) return 0;
  return attr.runtime;
}

}  // namespace zinf::aio
