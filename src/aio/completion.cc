#include "aio/completion.h"

#include <cerrno>
#include <cstdio>
#include <string>

#include "aio/file.h"

namespace zinf::aio {

PieceAction HandleCompletion(Piece& piece, int64_t res, const FileInfo& file, Status* error) {
  const std::string_view op = IoOpName(piece.op);
  if (res == -EAGAIN || res == -EINTR) {
    if (++piece.retries <= kMaxPieceRetries) return PieceAction::kResubmit;
    *error = ErrnoStatus(static_cast<int>(-res), op, file.path, piece.next_offset(), piece.remaining())
                 .WithContext("gave up after " + std::to_string(kMaxPieceRetries) + " retries");
    return PieceAction::kFailed;
  }
  if (res < 0) {
    *error = ErrnoStatus(static_cast<int>(-res), op, file.path, piece.next_offset(), piece.remaining());
    return PieceAction::kFailed;
  }
  const auto where = [&] {
    return std::string(op) + " " + file.path + " offset " + std::to_string(piece.next_offset()) + " length " +
           std::to_string(piece.remaining());
  };
  if (res > piece.remaining()) {
    *error = Status::Internal(where() + ": kernel reported " + std::to_string(res) + " bytes");
    return PieceAction::kFailed;
  }
  if (res == 0) {
    if (piece.op == IoOp::kRead) {
      *error = Status::Corruption(where() + ": unexpected end of file (file truncated?)");
    } else {
      *error = Status::IoError(where() + ": write made no progress");
    }
    return PieceAction::kFailed;
  }
  piece.done += res;
  piece.retries = 0;
  if (piece.done == piece.length) return PieceAction::kDone;
  // A short transfer. Under O_DIRECT the rest can only be resubmitted from an
  // aligned offset; an unaligned short read means the file ended mid-block.
  if (file.direct && piece.next_offset() % file.alignment_bytes != 0) {
    if (piece.op == IoOp::kRead) {
      *error = Status::Corruption(where() + ": unexpected end of file after a short read (file truncated?)");
    } else {
      *error = Status::IoError(where() + ": short write ended off the block boundary");
    }
    return PieceAction::kFailed;
  }
  return PieceAction::kResubmit;
}

Status ValidateSegments(IoOp op, std::span<const IoSegment> segments, const FileTable& files, int64_t block_size_bytes,
                        int64_t* pieces) {
  int64_t total = 0;
  for (const IoSegment& seg : segments) {
    if (!files.IsOpen(seg.file)) {
      return Status::InvalidArgument(std::string(IoOpName(op)) + ": file id " + std::to_string(seg.file) +
                                     " is not open (offset " + std::to_string(seg.offset) + " length " +
                                     std::to_string(seg.length) + ")");
    }
    const FileInfo& info = files.Get(seg.file).info();
    const int64_t a = info.alignment_bytes;
    const auto addr = reinterpret_cast<uintptr_t>(seg.buffer);
    if (seg.offset < 0 || seg.length < 0 || seg.offset % a != 0 || seg.length % a != 0 ||
        addr % static_cast<uintptr_t>(a) != 0 || (seg.length > 0 && seg.buffer == nullptr)) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%p", seg.buffer);
      return Status::InvalidArgument(
          std::string(IoOpName(op)) + " " + info.path + " offset " + std::to_string(seg.offset) + " length " +
          std::to_string(seg.length) + " buffer " + buf + ": offset, length and buffer address must be " +
          "non-negative multiples of " + std::to_string(a) + " bytes (the file's O_DIRECT alignment)");
    }
    total += (seg.length + block_size_bytes - 1) / block_size_bytes;
  }
  *pieces = total;
  return Status::Ok();
}

}  // namespace zinf::aio
