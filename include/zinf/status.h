// Status and StatusOr<T>: errors as values.
//
// Every fallible operation in zinf returns a Status (or a StatusOr<T>), never
// throws across a layer boundary, and never prints. A Status carries a code,
// the errno that caused it (0 when none) and a message that names what failed:
// the JSON path of a config key, or the file, offset and length of an I/O.
// errno is turned into a Status in exactly one place: ErrnoStatus() below.
//
// Thread-safety: a Status is a value; distinct objects may be used from
// distinct threads freely.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace zinf {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // bad input: config, argument, size
  kNotFound,            // a file, path or key that is not there
  kPermissionDenied,    // EACCES, EPERM, EROFS
  kNoSpace,             // ENOSPC, EDQUOT
  kOutOfMemory,         // an allocation past a budget or ENOMEM
  kIoError,             // EIO and other device failures, short transfers
  kCorruption,          // bad checksum, bad header, truncated file
  kUnavailable,         // a feature the kernel or hardware lacks
  kFailedPrecondition,  // called in the wrong state
  kResourceExhausted,   // a bounded pool or queue is full
  kAborted,             // cancelled because an earlier error is sticky
  kUnimplemented,       // refused on purpose (e.g. an unsupported option)
  kInternal,            // a bug
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, int sys_errno = 0);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) { return {StatusCode::kPermissionDenied, std::move(msg)}; }
  static Status NoSpace(std::string msg) { return {StatusCode::kNoSpace, std::move(msg)}; }
  static Status OutOfMemory(std::string msg) { return {StatusCode::kOutOfMemory, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The errno behind this status, or 0.
  int sys_errno() const { return rep_ ? rep_->sys_errno : 0; }
  const std::string& message() const;
  // "IoError: read /nvme0/x.swp offset 4096 length 1048576: Input/output error"
  std::string ToString() const;

  // The same status with "context: " put before its message. OK stays OK.
  Status WithContext(std::string_view context) const;

  // Marks an error as intentionally dropped (e.g. cleanup after another error).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    int sys_errno;
    std::string message;
  };
  // Null when OK, so an OK status costs one pointer and no allocation.
  std::shared_ptr<const Rep> rep_;
};

// Turns errno `err` from operation `op` into a Status; the one place that maps
// errno to codes. `file`, `offset` and `length` go into the message when given
// (offset/length < 0 means "not applicable").
Status ErrnoStatus(int err, std::string_view op, std::string_view file = {}, int64_t offset = -1, int64_t length = -1);

// StatusOr<T>: a T or the error that prevented it.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<0>(v_).ok()) v_ = Status::Internal("StatusOr built from an OK status without a value");
  }
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  template <typename U,
            typename = std::enable_if_t<std::is_convertible_v<U&&, T> && !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, StatusOr>>>
  StatusOr(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return v_.index() == 1; }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<0>(v_);
  }
  Status status() && { return ok() ? Status() : std::get<0>(std::move(v_)); }

  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace zinf

#define ZINF_STATUS_CONCAT_INNER(a, b) a##b
#define ZINF_STATUS_CONCAT(a, b) ZINF_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define ZINF_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::zinf::Status zinf_status_ = (expr);        \
    if (!zinf_status_.ok()) return zinf_status_; \
  } while (0)

// `lhs = value of expr` (a StatusOr), or returns its error.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
  ZINF_ASSIGN_OR_RETURN_IMPL(ZINF_STATUS_CONCAT(zinf_statusor_, __LINE__), lhs, expr)
#define ZINF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()
