#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

int64_t ParseCount(const std::string& text) {
  if (text.empty()) return -1;
  std::string num = text;
  double mult = 1;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': mult = 1e3; break;
    case 'M': mult = 1e6; break;
    case 'B':
    case 'G': mult = 1e9; break;
    case 'T': mult = 1e12; break;
    default: break;
  }
  if (mult != 1) num.pop_back();
  if (num.empty() || !(std::isdigit(static_cast<unsigned char>(num[0])) || num[0] == '.')) return -1;
  char* end = nullptr;
  const double d = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(d)) return -1;
  const double n = std::round(d * mult);
  return n < 1 || n > 9e18 ? -1 : static_cast<int64_t>(n);
}

}  // namespace zinf
