// IoEngine: the one interface through which every byte goes to or comes from
// a file (leveldb's Env, tigerbeetle's io/).
//
// The engine is byte-oriented: a request moves bytes between caller memory
// (normally a PinnedPool buffer) and (file, offset) ranges. It knows nothing of
// tensors or parameters. Three implementations:
//   * UringEngine  - io_uring, O_DIRECT, registered buffers and files;
//                    `thread_count` rings, each owned by one worker thread.
//   * PosixEngine  - pread/pwrite on the caller's thread; the reference.
//   * FaultyEngine - wraps either and injects seeded faults (fault_engine.h).
//
// Requests are asynchronous: Submit() returns an IoTicket at once; Wait(ticket)
// returns that request's Status. One caller may keep many requests
// outstanding (up to `max_requests`) and wait on them in any order.
//
// Every request is split into pieces of at most `block_size_bytes`; every piece's
// completion goes through one handler (completion.h): -EAGAIN/-EINTR resubmit,
// a short transfer advances and resubmits, anything else fails the request with
// a Status naming the file, offset and length of what failed. The first failed
// request makes its error sticky: later Submit() calls return kAborted with it.
//
// Alignment: every segment's offset and length must be multiples of the file's
// `alignment_bytes` (its logical block size under O_DIRECT) and its buffer
// must be aligned to the same; anything else is rejected with
// kInvalidArgument naming the offset and length. The layers above pad what
// they move to the alignment (swap::SwapStore::PaddedBytes, the checkpoint
// files' zero-padded tails); there is no byte-granular path.
//
// Thread-safety: Submit, Wait, IsDone and WaitAll may be called from any
// thread. OpenFile, CloseFile and RegisterMemory may be called from any thread
// but must not race with outstanding requests that use that file or memory.
// A buffer handed to Submit belongs to the engine until its ticket has been
// waited on (or WaitAll returned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::aio {

enum class IoOp : uint8_t { kRead, kWrite };
std::string_view IoOpName(IoOp op);  // "read", "write"

// Index of a file opened by an engine; valid until CloseFile.
using FileId = int32_t;

// One contiguous transfer: `length` bytes between `buffer` and `file` at `offset`.
struct IoSegment {
  FileId file = -1;
  int64_t offset = 0;
  int64_t length = 0;
  void* buffer = nullptr;  // source for writes, destination for reads
};

// An outstanding request. Zero is never a valid ticket.
struct IoTicket {
  uint64_t id = 0;
  bool valid() const { return id != 0; }
  friend bool operator==(IoTicket a, IoTicket b) { return a.id == b.id; }
};

enum class EngineKind {
  kAuto,   // io_uring when the kernel allows it, else posix with one warning
  kUring,  // io_uring or an error
  kPosix,  // pread/pwrite
};
std::string_view EngineKindName(EngineKind kind);

// What to do when a filesystem refuses O_DIRECT (tmpfs on old kernels, some
// FUSE and network filesystems).
enum class DirectIo {
  kRequire,  // OpenFile fails with kUnavailable naming the path
  kPrefer,   // open buffered, warn once per file (the page cache is then used)
  kOff,      // always buffered (tests on tmpfs); alignment rules still apply
};

class CompletionHook;

// How full an engine's queues have been: wall time, summed over its rings,
// with pieces in flight (issued and not yet completed, retries included),
// by what was in flight. A ring with
// nothing in flight adds nothing. Tells a pipeline that does not keep the
// disk busy (queues below queue_depth, one direction at a time) from a
// disk that is slower for its pattern (queues full, both directions).
struct IoQueueTime {
  int64_t read_only_ns = 0;   // only reads in flight
  int64_t write_only_ns = 0;  // only writes in flight
  int64_t mixed_ns = 0;       // reads and writes in flight together
  int64_t full_ns = 0;        // queue_depth pieces in flight (any direction)
  int64_t busy_ns() const { return read_only_ns + write_only_ns + mixed_ns; }
  IoQueueTime& operator+=(const IoQueueTime& o) {
    read_only_ns += o.read_only_ns;
    write_only_ns += o.write_only_ns;
    mixed_ns += o.mixed_ns;
    full_ns += o.full_ns;
    return *this;
  }
  IoQueueTime operator-(const IoQueueTime& o) const {
    return {read_only_ns - o.read_only_ns, write_only_ns - o.write_only_ns, mixed_ns - o.mixed_ns, full_ns - o.full_ns};
  }
};

// Engine options; FromAioConfig() fills the DeepSpeed `aio` knobs.
struct IoEngineOptions {
  EngineKind kind = EngineKind::kAuto;
  DirectIo direct_io = DirectIo::kPrefer;
  int64_t block_size_bytes = 1 << 20;  // a request is split into pieces of this size
  int queue_depth = 8;                 // pieces in flight per ring
  int thread_count = 1;                // rings, one worker thread each
  // DeepSpeed's aio.single_submit: one io_uring_submit per piece instead of
  // one per batch of pieces.
  bool single_submit = false;
  // DeepSpeed's aio.overlap_events: refill the ring as soon as any piece
  // completes; when false, a batch of `queue_depth` pieces is submitted and
  // all of it is reaped before the next batch goes out.
  bool overlap_events = true;
  // With reads and writes both waiting in a ring, it issues runs of this
  // many pieces in each direction by turns, so the disk serves the two
  // together (a virtual or SSD disk often moves more mixed than in
  // one-way stretches); each direction keeps its requests' order. 0: one
  // queue, oldest request first.
  int mix_run_pieces = 4;
  bool register_buffers = true;  // io_uring fixed buffers for RegisterMemory regions
  bool register_files = true;    // io_uring fixed files
  int max_requests = 1024;       // outstanding (submitted, not yet waited) requests
  // Test hook: sees (and may rewrite) the raw result of every piece. Used by
  // FaultyEngine; must be thread-safe. Null in production.
  std::shared_ptr<CompletionHook> completion_hook;
  // Test hook: behave as if the kernel refused io_uring (exercises the fallback).
  bool simulate_uring_unavailable = false;
};

IoEngineOptions FromAioConfig(const AioConfig& aio);
// kInvalidArgument naming the option when a value is out of range.
Status ValidateOptions(const IoEngineOptions& options);

struct OpenOptions {
  bool create = false;    // O_CREAT
  bool truncate = false;  // O_TRUNC
  bool read_only = false;
};

// What an engine knows about one of its open files.
struct FileInfo {
  std::string path;
  bool direct = false;          // opened with O_DIRECT
  int64_t alignment_bytes = 0;  // offsets, lengths and buffers must be multiples
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring", "posix", "faulty(io_uring)".
  virtual std::string_view name() const = 0;
  virtual const IoEngineOptions& options() const = 0;

  // Opens `path` (O_DIRECT per options().direct_io) and registers it with
  // every ring. Errors name the path.
  virtual StatusOr<FileId> OpenFile(const std::string& path, const OpenOptions& open) = 0;
  // Closes a file; no request on it may be outstanding.
  virtual Status CloseFile(FileId file) = 0;
  // Path, O_DIRECT and alignment of an open file. `file` must be open.
  virtual const FileInfo& file_info(FileId file) const = 0;

  // Registers [base, base+bytes) (a PinnedPool's memory) so that pieces inside
  // it use io_uring fixed buffers. Optional: unregistered memory works too.
  // kResourceExhausted past the engine's region table; the memory must
  // outlive the engine.
  virtual Status RegisterMemory(void* base, size_t bytes) = 0;

  // Starts a request: all `segments` are read (or written); the ticket
  // completes when every byte has moved or one piece has failed. An empty
  // span or zero lengths complete at once. kInvalidArgument for a bad file
  // or misaligned segment, kResourceExhausted when `max_requests` are
  // outstanding, kAborted when an earlier error is sticky.
  virtual StatusOr<IoTicket> Submit(IoOp op, std::span<const IoSegment> segments) = 0;
  StatusOr<IoTicket> Submit(IoOp op, const IoSegment& segment) { return Submit(op, {&segment, 1}); }

  // Blocks until `ticket` has completed and returns its status; the ticket is
  // then spent. Waiting on an unknown or spent ticket is a programmer error.
  virtual Status Wait(IoTicket ticket) = 0;
  // True when `ticket` has completed (Wait will not block).
  virtual bool IsDone(IoTicket ticket) = 0;
  // Waits for every outstanding request, spends every ticket and returns the
  // first error among them.
  virtual Status WaitAll() = 0;

  // fdatasync: writes to `file` that have completed become durable.
  virtual Status Sync(FileId file) = 0;
  virtual StatusOr<int64_t> FileSize(FileId file) = 0;
  // ftruncate; no request on the file may be outstanding.
  virtual Status Truncate(FileId file, int64_t size_bytes) = 0;
  // fallocate(0, size): reserves blocks so later writes cannot hit ENOSPC.
  // Falls back to ftruncate where the filesystem lacks fallocate.
  virtual Status Allocate(FileId file, int64_t size_bytes) = 0;

  // The first error of any request, or OK.
  virtual Status sticky_error() const = 0;

  // Time with pieces in flight so far (IoQueueTime); the difference of two
  // calls covers what ran between them. All zero for an engine that
  // keeps no queue (posix moves one piece at a time on the caller's thread).
  virtual IoQueueTime queue_time() const { return {}; }

  // Submit + Wait.
  Status Read(FileId file, int64_t offset, void* buffer, int64_t length);
  Status Write(FileId file, int64_t offset, const void* buffer, int64_t length);
};

// Makes an engine per options.kind. kAuto probes io_uring (ring setup and the
// READ/WRITE(_FIXED) opcodes) and falls back to PosixEngine with one warning
// when the kernel refuses it; kUring returns kUnavailable instead.
StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineOptions& options);

// Whether io_uring works here, and why not when it does not.
Status ProbeUring();

}  // namespace zinf::aio
