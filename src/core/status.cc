#include "zinf/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace zinf {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kNoSpace: return "NoSpace";
    case StatusCode::kOutOfMemory: return "OutOfMemory";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message, int sys_errno) {
  if (code != StatusCode::kOk) {
    rep_ = std::make_shared<const Rep>(Rep{code, sys_errno, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code()));
  s += ": ";
  s += rep_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += rep_->message;
  return Status(rep_->code, std::move(msg), rep_->sys_errno);
}

Status ErrnoStatus(int err, std::string_view op, std::string_view file, int64_t offset, int64_t length) {
  StatusCode code;
  switch (err) {
    case 0: code = StatusCode::kInternal; break;  // caller forgot errno
    case ENOENT:
    case ENOTDIR: code = StatusCode::kNotFound; break;
    case EACCES:
    case EPERM:
    case EROFS: code = StatusCode::kPermissionDenied; break;
    case ENOSPC:
    case EDQUOT:
    case EFBIG: code = StatusCode::kNoSpace; break;
    case ENOMEM: code = StatusCode::kOutOfMemory; break;
    case EINVAL:
    case EBADF:
    case EISDIR:
    case ENAMETOOLONG: code = StatusCode::kInvalidArgument; break;
    case EOPNOTSUPP:
    case ENOSYS: code = StatusCode::kUnavailable; break;
    case EAGAIN:
    case EBUSY:
    case EMFILE:
    case ENFILE: code = StatusCode::kResourceExhausted; break;
    case ECANCELED: code = StatusCode::kAborted; break;
    default: code = StatusCode::kIoError; break;
  }
  std::string msg(op);
  if (!file.empty()) {
    msg += ' ';
    msg += file;
  }
  if (offset >= 0) msg += " offset " + std::to_string(offset);
  if (length >= 0) msg += " length " + std::to_string(length);
  msg += ": ";
  msg += err == 0 ? "unknown error (errno 0)" : std::strerror(err);
  return Status(code, std::move(msg), err);
}

namespace internal {
void CheckFailed(const char* cond, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "zinf: check failed at %s:%d: %s %s\n", file, line, cond, msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

}  // namespace zinf
