// ZINF_CHECK: for programmer errors only (a broken invariant, never bad input).
// Stays on in release builds; prints the condition and location, then aborts.
#pragma once

namespace zinf::internal {
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line, const char* msg);
}  // namespace zinf::internal

#define ZINF_CHECK(cond)                                            \
  do {                                                              \
    if (!(cond)) [[unlikely]]                                       \
      ::zinf::internal::CheckFailed(#cond, __FILE__, __LINE__, ""); \
  } while (0)

#define ZINF_CHECK_MSG(cond, msg)                                    \
  do {                                                               \
    if (!(cond)) [[unlikely]]                                        \
      ::zinf::internal::CheckFailed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
