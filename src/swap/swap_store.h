// SwapStore: named tensors (byte blobs) on one or more NVMe paths.
//
// Design. The store is created with its full list of tensors, so the layout is
// fixed from the start: every tensor begins on a stripe boundary of one
// logical space, and the logical space is striped round-robin over one file
// per path in units of `stripe_bytes` (unit u lives in file u % N at data
// offset (u / N) * stripe_bytes). A tensor therefore is a list of extents, one
// per stripe unit, each a contiguous, aligned (file, offset, length) range;
// swapping a tensor is one IoEngine request whose segments are its extents,
// so the engine spreads it over every path and ring at once.
//
// Files. `<path>/<prefix>.<i>.swp`, each opening with a header block (magic,
// format version, data size, stripe size, element size, tensor count, layout
// hash, run id, header crc32c). A run (not the store: one process may hold
// several stores on a path) locks each path with LockSwapDirectory, so a
// second run never replaces its files as stale. All files are created (write new, fallocate,
// fsync, rename) and fully preallocated in Create, so a full disk is found at
// start; before allocating, Create compares what each filesystem needs with
// what it has free and refuses with one message listing every path. An
// existing file whose header does not match this layout and run (another
// layout, an older format, another run, not a zinf file at all) is stale:
// replaced (StalePolicy::kReplace, logged) or refused (kRefuse). A matching
// file is reused as space only: the store never returns bytes it has not
// written itself: a swap-in of a range that was never swapped out (or whose
// last swap-out failed) is kFailedPrecondition, never data.
//
// Checksums. With `checksums`, SwapOut computes a crc32c per extent (on the
// calling thread, before submitting), or records the ones its caller took
// while making the bytes, and Wait on a SwapIn verifies every
// extent it read; a mismatch is kCorruption naming file, offset, length and
// tensor.
//
// Buffers. A buffer handed to SwapIn/SwapOut must be aligned to
// alignment_bytes() and hold the transfer rounded up to alignment_bytes()
// (PaddedBytes); the padding of the last extent is written and read like the
// rest. It belongs to the store until the handle has been waited on. Buffers
// come from an aio::PinnedPool (register its region with the engine).
//
// Errors. The engine's first I/O error is sticky: after a failed transfer
// every later SwapIn/SwapOut fails with kAborted. The tensor ranges a failed
// swap-out touched become unreadable (kFailedPrecondition); the caller's
// buffer is left as it was, and nothing else the store holds changes.
//
// Thread-safety: every method may be called from any thread (one internal
// lock, not held during I/O or checksumming). Many transfers may be
// outstanding at once (up to `max_outstanding`), waited on in any order; the
// caller must not have a swap-out outstanding on a range that another
// outstanding transfer also covers (kFailedPrecondition).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "aio/handle_table.h"
#include "aio/io_engine.h"
#include "core/file_lock.h"
#include "zinf/status.h"

namespace zinf::swap {

using TensorId = int32_t;

struct TensorSpec {
  std::string name;                // unique, non-empty
  int64_t size_bytes = 0;          // > 0
  int32_t element_size_bytes = 1;  // 1, 2, 4 or 8; recorded in headers and the layout hash
};

enum class StalePolicy {
  kReplace,  // delete the stale file and create a new one (logged as a warning)
  kRefuse,   // fail Create with kFailedPrecondition naming the file and why
};

struct SwapStoreOptions {
  std::vector<std::string> paths;    // one swap file per path (directories, created if missing)
  std::string file_prefix = "zinf";  // files are <path>/<file_prefix>.<i>.swp
  int64_t stripe_bytes = 1 << 20;    // multiple of alignment_bytes
  int64_t alignment_bytes = 4096;    // power of two; at least every file's O_DIRECT alignment
  bool checksums = true;             // crc32c per extent, verified on swap-in
  // Identifies the run that owns the files (at most 32 bytes); empty: random.
  // A file with the same layout and run id is reused; any other is stale.
  std::string run_id;
  StalePolicy stale_policy = StalePolicy::kReplace;
  int max_outstanding = 64;  // transfers submitted and not yet waited on
};

// An outstanding transfer; spent by Wait. Zero is never valid.
struct SwapHandle {
  uint64_t id = 0;
  bool valid() const { return id != 0; }
};

// The on-disk header of a swap file (little-endian, one alignment block).
struct SwapFileHeader {
  static constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'S', 'W', 'A', 'P'};
  static constexpr uint32_t kFormatVersion = 1;
  static constexpr int kEncodedBytes = 108;

  uint32_t format_version = kFormatVersion;
  uint32_t header_bytes = 0;  // data starts here
  uint32_t file_index = 0;
  uint32_t file_count = 0;
  uint64_t data_bytes = 0;     // bytes after the header
  uint64_t logical_bytes = 0;  // the whole striped space
  uint64_t stripe_bytes = 0;
  uint64_t tensor_count = 0;
  uint32_t element_size_bytes = 0;  // common element size of the tensors, 0 when mixed
  uint64_t layout_hash = 0;
  std::string run_id;  // at most 32 bytes

  // Writes kEncodedBytes bytes (with the trailing crc32c) to `out`.
  void Encode(char* out) const;
  // kCorruption (with `file` in the message) for a bad magic or crc.
  static StatusOr<SwapFileHeader> Decode(const char* in, int64_t bytes, std::string_view file);
};

class SwapStore {
 public:
  // Lays out `tensors`, checks free space, creates or reuses and preallocates
  // every file. `engine` is not owned and must outlive the store. Errors:
  // kInvalidArgument (no paths, a bad option, a duplicate or empty name, a
  // size <= 0), kNoSpace (what each path needs and has), kFailedPrecondition
  // (a stale file under kRefuse), and I/O errors naming the file.
  static StatusOr<std::unique_ptr<SwapStore>> Create(aio::IoEngine* engine, std::vector<TensorSpec> tensors,
                                                     const SwapStoreOptions& options);
  // Waits for this store's outstanding transfers, then closes its files.
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // The id of `name`, or kNotFound.
  StatusOr<TensorId> Find(std::string_view name) const;
  int tensor_count() const { return static_cast<int>(tensors_.size()); }
  const TensorSpec& tensor(TensorId id) const { return tensors_[static_cast<size_t>(id)].spec; }
  int64_t alignment_bytes() const { return alignment_; }
  int64_t stripe_bytes() const { return stripe_; }
  // `bytes` rounded up to alignment_bytes(): what a buffer for them must hold.
  int64_t PaddedBytes(int64_t bytes) const;
  // Bytes each file takes on disk (header + data), and the files' paths.
  int64_t file_bytes() const { return header_bytes_ + data_bytes_per_file_; }
  const std::vector<std::string>& file_paths() const { return file_paths_; }
  const std::string& run_id() const { return run_id_; }
  uint64_t layout_hash() const { return layout_hash_; }

  // Starts writing all of tensor `id` from `buffer` (PaddedBytes(size) bytes).
  StatusOr<SwapHandle> SwapOut(TensorId id, const void* buffer);
  // The same, with the checksums the caller took itself as it made the
  // bytes (one pass over them instead of two): extent_crcs[e] is the
  // crc32c of buffer bytes [e * stripe_bytes(), min((e + 1) *
  // stripe_bytes(), PaddedBytes(size))), for each of extent_count(id)
  // extents (not null). They are recorded as given: a wrong one makes the
  // next swap-in of its extent fail with kCorruption, as a bad disk would.
  // Without `checksums` they are not used.
  StatusOr<SwapHandle> SwapOut(TensorId id, const void* buffer, const uint32_t* extent_crcs);
  bool checksums() const { return options_.checksums; }
  // The extents (stripe units) tensor `id` (a valid id) spans, and the
  // bytes of extent e (< extent_count): buffer bytes [e * stripe_bytes(),
  // + extent_bytes), the last one's padding included.
  int64_t extent_count(TensorId id) const {
    return static_cast<int64_t>(tensors_[static_cast<size_t>(id)].extents.size());
  }
  int64_t extent_bytes(TensorId id, int64_t e) const {
    return tensors_[static_cast<size_t>(id)].extents[static_cast<size_t>(e)].length;
  }
  // Starts reading all of tensor `id` into `buffer`.
  StatusOr<SwapHandle> SwapIn(TensorId id, void* buffer);
  // The same for bytes [offset, offset + length) of the tensor: `offset` a
  // multiple of stripe_bytes(), `length` > 0 and a multiple of stripe_bytes()
  // unless the range ends at the tensor's end (kInvalidArgument otherwise).
  StatusOr<SwapHandle> SwapOutRange(TensorId id, int64_t offset_bytes, int64_t length_bytes, const void* buffer);
  StatusOr<SwapHandle> SwapInRange(TensorId id, int64_t offset_bytes, int64_t length_bytes, void* buffer);

  // Blocks until the transfer is done; verifies checksums of a swap-in.
  // Waiting on an unknown or spent handle is a programmer error (checked).
  Status Wait(SwapHandle handle);
  // Whether the transfer has finished (it still needs its Wait); does not block.
  bool IsDone(SwapHandle handle) const;
  // Waits for every outstanding transfer of this store; the first error.
  // Must not race with Wait on the same handles from another thread.
  Status WaitAll();

  // Whether every byte of tensor `id` (a valid id) has been swapped out
  // successfully.
  bool IsWritten(TensorId id) const;

 private:
  struct Extent {
    int32_t file = 0;         // index into files_
    int64_t file_offset = 0;  // bytes from the start of the file
    int64_t length = 0;       // padded bytes
  };
  struct Tensor {
    TensorSpec spec;
    int64_t logical_offset = 0;
    std::vector<Extent> extents;
    // Guarded by mu_:
    std::vector<uint32_t> crc;     // per extent, valid when written[k]
    std::vector<uint8_t> written;  // per extent: last swap-out succeeded
    std::vector<int32_t> busy;     // per extent: >0 readers outstanding, -1 a writer
  };
  // One transfer between Start and its Wait: the payload of a handle.
  struct Slot {
    aio::IoOp op = aio::IoOp::kRead;
    TensorId tensor = -1;
    int64_t first_extent = 0;
    int64_t extent_count = 0;
    char* buffer = nullptr;
    aio::IoTicket ticket;
    std::vector<aio::IoSegment> segments;  // capacity kept between uses
    std::vector<uint32_t> crc;             // swap-out: the crcs to commit on success
  };

  explicit SwapStore(int max_outstanding) : slots_(max_outstanding) {}
  Status Layout(std::vector<TensorSpec> tensors);
  Status CheckSpace() const;
  Status OpenFiles();
  Status OpenOneFile(int index);
  // `crcs`: a swap-out's checksums, one per extent of the range, or null
  // to take them here.
  StatusOr<SwapHandle> Start(aio::IoOp op, TensorId id, int64_t offset_bytes, int64_t length_bytes, char* buffer,
                             const uint32_t* crcs = nullptr);
  std::string DescribeRange(const Tensor& t, int64_t first_extent, int64_t count) const;
  void ReleaseSlot(uint32_t index);  // mu_ held
  // The slot of a transfer not yet waited for; checked (mu_ held).
  uint32_t SlotOf(SwapHandle handle, const char* caller) const;

  aio::IoEngine* engine_ = nullptr;
  SwapStoreOptions options_;
  std::string run_id_;
  int64_t alignment_ = 4096;
  int64_t stripe_ = 0;
  int64_t header_bytes_ = 0;
  int64_t logical_bytes_ = 0;
  int64_t data_bytes_per_file_ = 0;
  uint32_t common_element_size_ = 0;
  uint64_t layout_hash_ = 0;
  std::vector<std::string> file_paths_;
  std::vector<aio::FileId> files_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, TensorId> by_name_;

  mutable std::mutex mu_;
  // Outstanding transfers (max_outstanding). The table is guarded by mu_; a
  // slot's payload belongs to the thread in Start or Wait that holds it.
  aio::HandleTable<Slot> slots_;
};

// "swap files on zero_optimization.<section>.nvme_path [a, b]": the context
// that names the config key in errors about a section's swap files (a path
// that is a file, read-only, full).
std::string NvmePathContext(std::string_view section, const std::vector<std::string>& paths);

// Creates swap directory `dir` if missing and locks it for rank `rank` of
// this run (`<dir>/zinf-r<rank>.lock`, core/file_lock.h); hold the lock while
// the run's stores use `dir`. kFailedPrecondition naming `dir` and the
// holder's pid when another run holds it; mkdir's and open's errors.
StatusOr<FileLock> LockSwapDirectory(const std::string& dir, int rank);

}  // namespace zinf::swap
