#include "core/units.h"

#include <cstdio>

namespace zinf {

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string FormatCount(int64_t n) {
  static const char* kUnits[] = {"", "K", "M", "G", "T"};
  double v = static_cast<double>(n);
  int u = 0;
  while ((v >= 1000.0 || v <= -1000.0) && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f%s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace zinf
