// PosixEngine: the reference IoEngine. Submit() performs the whole request
// with pread/pwrite on the calling thread, piece by piece, through the same
// completion handler as io_uring; the ticket is complete when Submit returns.
// Slow but simple: io_uring results are tested against it, and it is the
// fallback where the kernel refuses io_uring.
//
// queue_depth, thread_count, single_submit, overlap_events and registration
// do not apply; a CompletionHook's delay_rounds is ignored (there is no
// later completion to overtake).
//
// Thread-safety: as IoEngine. Concurrent Submits run concurrently.
#pragma once

#include <memory>

#include "aio/completion.h"
#include "aio/file.h"
#include "aio/io_engine.h"
#include "aio/request_table.h"

namespace zinf::aio {

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(const IoEngineOptions& options);

  std::string_view name() const override { return "posix"; }
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

 private:
  Status RunPiece(Piece& piece);

  IoEngineOptions options_;
  FileTable files_;
  RequestTable requests_;
};

}  // namespace zinf::aio
