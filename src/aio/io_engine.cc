#include "aio/io_engine.h"

#include <mutex>

#include "aio/posix_engine.h"
#include "aio/uring_engine.h"
#include "core/log.h"
#include "core/units.h"

namespace zinf::aio {

std::string_view IoOpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

std::string_view EngineKindName(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto: return "auto";
    case EngineKind::kUring: return "io_uring";
    case EngineKind::kPosix: return "posix";
  }
  return "?";
}

IoEngineOptions FromAioConfig(const AioConfig& aio) {
  IoEngineOptions o;
  o.block_size_bytes = aio.block_size;
  o.queue_depth = static_cast<int>(aio.queue_depth);
  o.thread_count = static_cast<int>(aio.thread_count);
  o.single_submit = aio.single_submit;
  o.overlap_events = aio.overlap_events;
  return o;
}

Status ValidateOptions(const IoEngineOptions& o) {
  if (o.block_size_bytes < 512 || o.block_size_bytes > kGiB || !IsPowerOfTwo(o.block_size_bytes)) {
    return Status::InvalidArgument("aio.block_size: expected a power of two from 512 B to 1 GiB, got " +
                                   std::to_string(o.block_size_bytes));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return Status::InvalidArgument("aio.queue_depth: expected 1..4096, got " + std::to_string(o.queue_depth));
  }
  if (o.thread_count < 1 || o.thread_count > 256) {
    return Status::InvalidArgument("aio.thread_count: expected 1..256, got " + std::to_string(o.thread_count));
  }
  if (o.mix_run_pieces < 0 || o.mix_run_pieces > 1 << 20) {
    return Status::InvalidArgument("mix_run_pieces: expected 0..1048576, got " + std::to_string(o.mix_run_pieces));
  }
  if (o.max_requests < 1 || o.max_requests > (1 << 20)) {
    return Status::InvalidArgument("max_requests: expected 1..1048576, got " + std::to_string(o.max_requests));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineOptions& options) {
  ZINF_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.kind == EngineKind::kPosix) return std::unique_ptr<IoEngine>(new PosixEngine(options));
  auto uring = UringEngine::Create(options);
  if (uring.ok()) return std::unique_ptr<IoEngine>(std::move(uring).value());
  // The kernel refusing io_uring shows as ENOSYS (not built in), EPERM
  // (io_uring_disabled, seccomp) or ENOMEM (locked-memory limit).
  const StatusCode code = uring.status().code();
  const bool refused =
      code == StatusCode::kUnavailable || code == StatusCode::kPermissionDenied || code == StatusCode::kOutOfMemory;
  if (options.kind == EngineKind::kUring || !refused) return std::move(uring).status();
  static std::once_flag warned;
  std::call_once(warned, [&] {
    Log("aio").warn("io_uring is not available ({}); falling back to pread/pwrite, which is slower",
                    uring.status().ToString());
  });
  IoEngineOptions fallback = options;
  fallback.kind = EngineKind::kPosix;
  return std::unique_ptr<IoEngine>(new PosixEngine(fallback));
}

Status IoEngine::Read(FileId file, int64_t offset, void* buffer, int64_t length) {
  ZINF_ASSIGN_OR_RETURN(IoTicket t, Submit(IoOp::kRead, IoSegment{file, offset, length, buffer}));
  return Wait(t);
}

Status IoEngine::Write(FileId file, int64_t offset, const void* buffer, int64_t length) {
  ZINF_ASSIGN_OR_RETURN(IoTicket t, Submit(IoOp::kWrite, IoSegment{file, offset, length, const_cast<void*>(buffer)}));
  return Wait(t);
}

}  // namespace zinf::aio
