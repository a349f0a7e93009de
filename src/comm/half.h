// bf16 / fp16 <-> fp32 for the reductions MPI has no type for. Private to
// comm/ (comm sits beside optim, not above it); round to nearest even, NaN
// kept a NaN, as optim/dtype.h does.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace zinf::comm::internal {

inline float Bf16ToF32(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | ((127 - 15 - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {  // subnormal or zero in fp16
    float a;
    std::memcpy(&a, &abs, 4);
    // a * 2^24 rounded to nearest even, as an integer mantissa.
    const float scaled = a * 16777216.0f;
    const float rounded = __builtin_nearbyintf(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(((r - 0x38000000u) >> 13) & 0x7fffu));
}

}  // namespace zinf::comm::internal
