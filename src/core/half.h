// Exact scalar conversions between fp32 and the two 16-bit float formats,
// bf16 and IEEE binary16 (fp16). 16-bit values travel as raw bits in uint16_t.
//
// These are the reference every other conversion in zinf matches bit for bit
// (optim's vector casts, the MPI reductions of 16-bit data, the kernels'
// casts; tests/core/half_test.cc checks them against an independent model):
//   * fp32 -> bf16 / fp16 round to nearest, ties to even; values past the
//     largest finite 16-bit value (after rounding) become Inf of the same
//     sign; fp16 keeps subnormals (no flush to zero), and so does bf16.
//   * NaN stays NaN: fp32 -> 16 bit keeps the sign and the top payload bits
//     and sets the quiet bit (what x86 F16C does); fp16 -> fp32 likewise sets
//     the quiet bit; bf16 -> fp32 is a plain 16-bit shift (exact, payload
//     kept).
//   * 16 bit -> fp32 is exact.
//
// Inline, so that element loops (casts, reductions) compile to straight code.
// Integer operations only, so the result does not depend on floating-point
// flags (-ffp-contract, -O3). One caution: a file compiled with ISA flags
// beyond the baseline (-mavx2, -mavx512f) must not call these, or the linker
// may keep that file's copy for every caller (optim/kernels_impl.h explains).
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstdint>

namespace zinf {

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a
  // carry out of the mantissa bumps the exponent, up to Inf, as it should.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x03FFu));  // NaN
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (ax >= 0x38800000u) {                                              // >= 2^-14: a normal half
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
    const uint32_t r = ax - (112u << 23) + 0x0FFFu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  const uint32_t e = ax >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
  // Subnormal half: value = m * 2^(e-150) = (m >> (126-e)) units of 2^-24.
  const uint32_t m = (ax & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: right
  return static_cast<uint16_t>(sign | r);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x03FFu;
  if (e == 0x1F) {
    if (m == 0) return std::bit_cast<float>(sign | 0x7F800000u);
    return std::bit_cast<float>(sign | 0x7FC00000u | (m << 13));  // quiet NaN, payload kept
  }
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise m * 2^-24 into a float exponent and mantissa.
    const int lead = std::bit_width(m) - 1;  // 0..9
    const uint32_t exp = static_cast<uint32_t>(127 - 24 + lead);
    const uint32_t mant = (m << (23 - lead)) & 0x007FFFFFu;
    return std::bit_cast<float>(sign | (exp << 23) | mant);
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace zinf
