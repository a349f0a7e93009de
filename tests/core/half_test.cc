// fp32 <-> bf16 / fp16 scalar conversions (core/half.h) against an
// independent double-precision model of IEEE round-to-nearest-even, and their
// edge values: Inf, NaN, subnormals, ties.
#include "core/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "core/float_samples.h"

namespace zinf {
namespace {

using testing::HalfValue;
using testing::kNanBits;
using testing::SampleFloatBits;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Nearest half to a finite float, ties to even, overflow to Inf; by search
// over the ordered positive halves (0x7C00, Inf, standing in for 2^16 as IEEE
// rounding with an unbounded exponent prescribes).
uint16_t ReferenceHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  auto value = [](uint16_t h) { return h == 0x7C00 ? 65536.0 : HalfValue(h); };
  uint16_t lo = 0, hi = 0x7C00;  // value(lo) <= a < value(hi), or a >= 65536
  if (a >= 65536.0) return sign | 0x7C00;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (value(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  const double dlo = a - value(lo), dhi = value(hi) - a;
  uint16_t r = lo;
  if (dhi < dlo || (dhi == dlo && (lo & 1))) r = hi;
  return sign | r;
}

// Nearest bf16 to a finite float, ties to even, overflow to Inf (2^128).
uint16_t ReferenceBf16(float f) {
  const uint32_t b = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  const uint32_t lo = (b & 0x7FFFFFFFu) >> 16;
  const uint32_t hi = lo + 1;
  auto value = [](uint32_t h) { return h == 0x7F80 ? std::ldexp(1.0, 128) : double(FromBits(h << 16)); };
  const double a = std::fabs(static_cast<double>(f));
  const double dlo = a - value(lo), dhi = value(hi) - a;
  uint32_t r = lo;
  if (dhi < dlo || (dhi == dlo && (lo & 1))) r = hi;
  return static_cast<uint16_t>(sign | r);
}

TEST(HalfTest, HalfToFloatIsExactForAllHalves) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(Bits(f) >> 31, h >> 15);
      EXPECT_EQ(Bits(f) & 0x7FE000u, ((h & 0x3FFu) << 13) | 0x400000u) << "quiet, payload kept: " << std::hex << h;
    } else if ((h & 0x7FFF) == 0x7C00) {
      EXPECT_EQ(f, (h & 0x8000) ? -INFINITY : INFINITY);
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(h))) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    }
  }
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
}

TEST(HalfTest, Bf16ToFloatIsAShift) {
  for (uint32_t h = 0; h < 0x10000; ++h) ASSERT_EQ(Bits(Bf16ToFloat(static_cast<uint16_t>(h))), h << 16);
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  for (uint32_t b : SampleFloatBits()) {
    const float f = FromBits(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), ReferenceHalf(f)) << std::hexfloat << f;
  }
}

TEST(HalfTest, FloatToHalfEdges) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);    // largest finite
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);    // midpoint ties to even: Inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xFC00);
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);         // tie to even: zero
  EXPECT_EQ(FloatToHalf(0x1.000002p-25f), 0x0001);  // just above the tie
  EXPECT_EQ(FloatToHalf(0x3p-25f), 0x0002);         // 1.5 units: tie to even (2)
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);         // smallest normal
  EXPECT_EQ(FloatToHalf(0x1.ff8p-15f), 0x03FF);     // largest subnormal
  EXPECT_EQ(FloatToHalf(0x1.ffcp-15f), 0x0400);     // tie above it: rounds up into the normals
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);  // tie, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 0x3p-11f), 0x3C02);  // tie, odd rounds up
}

TEST(HalfTest, FloatToBf16RoundsToNearestEven) {
  for (uint32_t b : SampleFloatBits()) {
    const float f = FromBits(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), ReferenceBf16(f)) << std::hexfloat << f;
  }
}

TEST(HalfTest, FloatToBf16Edges) {
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001)), 0x0000);  // tiny subnormal: zero
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);  // subnormal tie, odd: up
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000)), 0x0000);  // subnormal tie, even: stays
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3F80);        // tie, even stays
  EXPECT_EQ(FloatToBf16(1.0f + 0x3p-8f), 0x3F82);        // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7F80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xFF80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
}

TEST(HalfTest, NanStaysQuietNanWithSign) {
  for (uint32_t b : kNanBits) {
    const float f = FromBits(b);
    const uint16_t bf = FloatToBf16(f);
    EXPECT_EQ(bf & 0x7F80, 0x7F80);
    EXPECT_NE(bf & 0x007F, 0) << "still NaN: " << std::hex << b;
    EXPECT_EQ(bf & 0x0040, 0x0040) << "quiet";
    EXPECT_EQ(bf >> 15, b >> 31);
    EXPECT_TRUE(std::isnan(Bf16ToFloat(bf)));
    const uint16_t h = FloatToHalf(f);
    EXPECT_EQ(h & 0x7C00, 0x7C00);
    EXPECT_EQ(h & 0x0200, 0x0200) << "quiet";
    EXPECT_EQ(h >> 15, b >> 31);
    EXPECT_TRUE(std::isnan(HalfToFloat(h)));
  }
}

TEST(HalfTest, RoundTripOfEvery16BitValue) {
  // 16 bit -> fp32 is exact, so fp32 -> 16 bit must give the same bits back
  // for every non-NaN pattern (NaNs come back quiet: checked above).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<uint16_t>(h);
    if ((h & 0x7FFF) <= 0x7C00) {
      ASSERT_EQ(FloatToHalf(HalfToFloat(x)), x) << std::hex << h;
    }
    if ((h & 0x7FFF) <= 0x7F80) {
      ASSERT_EQ(FloatToBf16(Bf16ToFloat(x)), x) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace zinf
