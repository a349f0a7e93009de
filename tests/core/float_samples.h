// Float bit patterns that exercise 16-bit rounding, shared by the tests of the
// scalar conversions (core/half.h) and of optim's vector casts.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zinf::testing {

// The value of a finite half, from the IEEE definition.
inline double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// A sample of float bit patterns: a stride over all 2^32, every half and
// bf16 value, and the neighbours of each rounding midpoint.
inline std::vector<uint32_t> SampleFloatBits() {
  std::vector<uint32_t> s;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 1021) s.push_back(static_cast<uint32_t>(b));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    // bf16 value h and the midpoint to the next one, +-1 float ulp.
    const uint32_t bb = h << 16;
    for (uint32_t d : {0u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) s.push_back(bb + d);
    // half value h and its midpoints.
    if ((h & 0x7C00) != 0x7C00) {
      const float v = static_cast<float>(HalfValue(static_cast<uint16_t>(h)));
      const uint16_t next = static_cast<uint16_t>(h + 1);
      const double nv = (next & 0x7FFF) == 0x7C00 ? (h & 0x8000 ? -65536.0 : 65536.0) : HalfValue(next);
      const float mid = static_cast<float>((static_cast<double>(v) + nv) / 2);  // exact: 12 bits
      for (int d = -1; d <= 1; ++d) {
        s.push_back(std::bit_cast<uint32_t>(v) + static_cast<uint32_t>(d));
        s.push_back(std::bit_cast<uint32_t>(mid) + static_cast<uint32_t>(d));
      }
    }
  }
  return s;
}

// NaN patterns: quiet and signalling, both signs, payloads high and low.
inline constexpr uint32_t kNanBits[] = {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu, 0x7F802000u};

}  // namespace zinf::testing
