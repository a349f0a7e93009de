// UringEngine: IoEngine on io_uring.
//
// Design. `thread_count` worker threads each own one ring (nothing else
// touches a ring's SQ or CQ). A request is cut into block_size pieces,
// numbered across its segments; piece k goes to worker (k + r) % thread_count,
// where r rotates per request so that small requests spread over the rings
// too. Submit() hands the request to each worker it involves through that
// worker's bounded queue (capacity max_requests: a request enters a queue at
// most once, so it never overflows) and returns; each worker keeps up to
// queue_depth pieces in flight, feeding completions through HandleCompletion
// and retrying from a fixed table of in-flight pieces. When a worker's last
// piece of a request completes it finishes its part in the RequestTable; the
// last part completes the ticket.
//
// Files are opened with O_DIRECT and registered in every ring (fixed files);
// memory given to RegisterMemory is registered as fixed buffers (split into
// pieces of at most 1 GiB, the kernel's limit). Either registration failing
// (RLIMIT_MEMLOCK for a non-root user, an old kernel) only costs speed: the
// engine logs once and uses plain READ/WRITE.
//
// The hot path does not allocate: requests, parts and in-flight pieces live in
// tables sized at construction.
//
// Thread-safety: as IoEngine.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "aio/file.h"
#include "aio/io_engine.h"
#include "aio/request_table.h"

namespace zinf::aio {

// The scheduler slice (ns) each ring's thread asks for (uring_engine.cc says why).
inline constexpr uint64_t kRingThreadSliceNs = 100'000;

// The fair-scheduler slice (ns) of thread `tid` of this process (0: the
// calling thread), as the kernel reports it; 0 when it reports none
// (kernels before 6.12) or the thread is gone.
uint64_t ThreadSchedulerSliceNs(int tid);

// The bookkeeping behind IoQueueTime for one queue: Change is told of every
// piece entering or leaving flight, with a monotonic time, and adds the time
// since the last change to the state that held until then. Change is called
// by one thread (the queue's owner); time() by any.
class QueueClock {
 public:
  QueueClock(int queue_depth, int64_t now_ns) : queue_depth_(queue_depth), last_ns_(now_ns) {}
  // Pieces in flight in direction `op` change by `delta` at `now_ns`.
  void Change(IoOp op, int delta, int64_t now_ns);
  IoQueueTime time() const;

 private:
  enum { kReadOnly, kWriteOnly, kMixed, kFull };
  const int queue_depth_;
  int64_t last_ns_;
  std::array<int, 2> in_flight_{};  // by IoOp
  std::array<std::atomic<int64_t>, 4> ns_{};
};

class UringEngine final : public IoEngine {
 public:
  // kUnavailable when the kernel refuses io_uring (or its opcodes).
  static StatusOr<std::unique_ptr<UringEngine>> Create(const IoEngineOptions& options);
  // Waits for outstanding requests, then stops the workers.
  ~UringEngine() override;

  std::string_view name() const override { return "io_uring"; }
  const IoEngineOptions& options() const override { return options_; }
  StatusOr<FileId> OpenFile(const std::string& path, const OpenOptions& open) override;
  Status CloseFile(FileId file) override;
  const FileInfo& file_info(FileId file) const override { return files_.Get(file).info(); }
  Status RegisterMemory(void* base, size_t bytes) override;
  using IoEngine::Submit;
  StatusOr<IoTicket> Submit(IoOp op, std::span<const IoSegment> segments) override;
  Status Wait(IoTicket ticket) override { return requests_.Wait(ticket); }
  bool IsDone(IoTicket ticket) override { return requests_.IsDone(ticket); }
  Status WaitAll() override { return requests_.WaitAll(); }
  Status Sync(FileId file) override;
  StatusOr<int64_t> FileSize(FileId file) override;
  Status Truncate(FileId file, int64_t size_bytes) override;
  Status Allocate(FileId file, int64_t size_bytes) override;
  Status sticky_error() const override { return requests_.sticky_error(); }
  IoQueueTime queue_time() const override;

  // Whether fixed buffers / fixed files are in use (for reports and tests).
  bool buffers_registered() const { return region_count_.load() > 0; }
  bool files_registered() const { return fixed_files_; }

  static constexpr int kMaxRegions = 64;
  static constexpr int64_t kMaxRegionBytes = int64_t{1} << 30;

  class Worker;

 private:
  explicit UringEngine(const IoEngineOptions& options);

  friend class Worker;
  // A registered memory range: pieces inside it use buffer `index`.
  struct Region {
    const char* base = nullptr;
    int64_t bytes = 0;
  };
  // The fixed-buffer index covering [p, p+len), or -1.
  int RegionOf(const char* p, int64_t len) const;

  IoEngineOptions options_;
  FileTable files_;
  RequestTable requests_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> rotation_{0};
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  std::array<bool, FileTable::kMaxFiles> file_fixed_{};  // written before the file's first request
  std::mutex register_mu_;
  std::array<Region, kMaxRegions> regions_{};
  std::atomic<int> region_count_{0};
};

}  // namespace zinf::aio
