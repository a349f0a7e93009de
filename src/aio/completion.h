// The one completion handler: what every engine does with the result of a
// piece (liburing's io_uring-cp.c, seastar's complete_with).
//
// A piece is one contiguous transfer of at most block_size bytes. The kernel
// (io_uring CQE res, or pread/pwrite's return) reports bytes moved or -errno;
// HandleCompletion turns that into resubmit, done, or a Status naming the
// file, offset and length that failed. No result is trusted: a zero, a short
// count, or more bytes than asked are all handled.
//
// Thread-safety: pure functions on caller-owned state.
#pragma once

#include <cstdint>
#include <span>

#include "aio/io_engine.h"
#include "zinf/status.h"

namespace zinf::aio {

// Consecutive EAGAIN/EINTR results tolerated for one piece before it fails;
// progress resets the count.
inline constexpr int kMaxPieceRetries = 64;

struct Piece {
  IoOp op = IoOp::kRead;
  FileId file = -1;
  int64_t offset = 0;  // file offset of the piece's first byte
  int64_t length = 0;  // bytes in the piece
  char* buffer = nullptr;
  int64_t done = 0;  // bytes moved so far
  int retries = 0;   // consecutive EAGAIN/EINTR

  int64_t next_offset() const { return offset + done; }
  int64_t remaining() const { return length - done; }
  char* next_buffer() const { return buffer + done; }
};

enum class PieceAction { kDone, kResubmit, kFailed };

// Applies `res` (bytes or -errno) to `piece`. On kFailed, `*error` names the
// op, file, offset and remaining length.
PieceAction HandleCompletion(Piece& piece, int64_t res, const FileInfo& file, Status* error);

class FileTable;

// Checks a request before it is queued: every file open, every offset,
// length and buffer aligned to its file's alignment, no negative lengths.
// Sets `*pieces` to the number of block_size pieces. Errors name the file,
// offset and length.
Status ValidateSegments(IoOp op, std::span<const IoSegment> segments, const FileTable& files, int64_t block_size_bytes,
                        int64_t* pieces);

// Test hook between the kernel and HandleCompletion (FaultInjector).
// Thread-safe: called from every worker thread.
class CompletionHook {
 public:
  struct Decision {
    int64_t res = 0;       // the result HandleCompletion will see
    int delay_rounds = 0;  // uring only: hold the completion for this many reap rounds
  };
  virtual ~CompletionHook() = default;
  // `res` is what the kernel returned for `piece` (before it is applied).
  virtual Decision OnCompletion(const Piece& piece, const FileInfo& file, int64_t res) = 0;
};

}  // namespace zinf::aio
