// Units: byte sizes and their human forms. All sizes in zinf are bytes unless
// a name says elements (`_elems`) or another unit.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace zinf {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// "1.50 GiB", "512 B".
std::string FormatBytes(int64_t bytes);
// "1.2e9" style for element counts: "268.4M", "1.00G".
std::string FormatCount(int64_t n);
// A positive count written as a number with an optional decimal suffix:
// "50000", "1.5e8", "300M", "7B" or "7G", "1T" (K 1e3, M 1e6, B/G 1e9,
// T 1e12, any case). -1 for anything else, zero or past 9e18 included.
int64_t ParseCount(const std::string& text);

constexpr int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
constexpr int64_t AlignDown(int64_t x, int64_t a) { return x / a * a; }
constexpr bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// Nanoseconds from `t0` to now on the steady clock.
inline int64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zinf
