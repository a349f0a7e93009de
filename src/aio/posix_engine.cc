#include "aio/posix_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "aio/completion.h"

namespace zinf::aio {

PosixEngine::PosixEngine(const IoEngineOptions& options) : options_(options), requests_(options.max_requests) {}

StatusOr<FileId> PosixEngine::OpenFile(const std::string& path, const OpenOptions& open) {
  ZINF_ASSIGN_OR_RETURN(File file, OpenForIo(path, open, options_.direct_io));
  return files_.Add(std::move(file));
}

Status PosixEngine::CloseFile(FileId file) { return files_.Remove(file); }

Status PosixEngine::RegisterMemory(void* base, size_t bytes) {
  (void)base;
  (void)bytes;
  return Status::Ok();  // nothing to register for pread/pwrite
}

Status PosixEngine::RunPiece(Piece& piece) {
  const File& file = files_.Get(piece.file);
  for (;;) {
    ssize_t n = piece.op == IoOp::kRead
                    ? ::pread(file.fd(), piece.next_buffer(), piece.remaining(), piece.next_offset())
                    : ::pwrite(file.fd(), piece.next_buffer(), piece.remaining(), piece.next_offset());
    int64_t res = n < 0 ? -errno : n;
    if (options_.completion_hook) res = options_.completion_hook->OnCompletion(piece, file.info(), res).res;
    Status error;
    switch (HandleCompletion(piece, res, file.info(), &error)) {
      case PieceAction::kDone: return Status::Ok();
      case PieceAction::kResubmit: continue;
      case PieceAction::kFailed: return error;
    }
  }
}

StatusOr<IoTicket> PosixEngine::Submit(IoOp op, std::span<const IoSegment> segments) {
  int64_t pieces = 0;
  ZINF_RETURN_IF_ERROR(ValidateSegments(op, segments, files_, options_.block_size_bytes, &pieces));
  uint32_t slot = 0;
  ZINF_ASSIGN_OR_RETURN(IoTicket ticket, requests_.Allocate(op, segments, 1, pieces, &slot));
  Status status;
  const int64_t bs = options_.block_size_bytes;
  for (const IoSegment& seg : segments) {
    for (int64_t at = 0; at < seg.length && status.ok(); at += bs) {
      Piece piece;
      piece.op = op;
      piece.file = seg.file;
      piece.offset = seg.offset + at;
      piece.length = std::min(bs, seg.length - at);
      piece.buffer = static_cast<char*>(seg.buffer) + at;
      status = RunPiece(piece);
    }
    if (!status.ok()) break;
  }
  requests_.FinishPart(slot, status);
  return ticket;
}

Status PosixEngine::Sync(FileId file) { return files_.Sync(file); }
StatusOr<int64_t> PosixEngine::FileSize(FileId file) { return files_.Size(file); }
Status PosixEngine::Truncate(FileId file, int64_t size_bytes) { return files_.Truncate(file, size_bytes); }
Status PosixEngine::Allocate(FileId file, int64_t size_bytes) { return files_.Allocate(file, size_bytes); }

}  // namespace zinf::aio
