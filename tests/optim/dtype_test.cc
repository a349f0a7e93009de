// fp32 <-> bf16 / fp16 conversions: the scalar reference against an
// independent double-precision model of IEEE round-to-nearest-even, then every
// ISA's vector casts bit for bit against the scalar reference.
#include "optim/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "optim/array_ops.h"
#include "optim/cpu_adam.h"
#include "optim/thread_pool.h"
#include "optim_test_util.h"

namespace zinf::optim {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The value of a finite half, from the IEEE definition.
double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

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
    if (value(mid) <= a) lo = mid; else hi = mid;
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

// A sample of float bit patterns: a stride over all 2^32, every half and
// bf16 value, and the neighbours of each rounding midpoint.
std::vector<uint32_t> SampleFloatBits() {
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
        s.push_back(Bits(v) + static_cast<uint32_t>(d));
        s.push_back(Bits(mid) + static_cast<uint32_t>(d));
      }
    }
  }
  return s;
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBf16, DType::kF16}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_EQ(DTypeSizeBytes(DType::kF32), 4);
  EXPECT_EQ(DTypeSizeBytes(DType::kBf16), 2);
}

TEST(DTypeTest, HalfToFloatIsExactForAllHalves) {
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
}

TEST(DTypeTest, Bf16ToFloatIsAShift) {
  for (uint32_t h = 0; h < 0x10000; ++h) ASSERT_EQ(Bits(Bf16ToFloat(static_cast<uint16_t>(h))), h << 16);
}

TEST(DTypeTest, FloatToHalfRoundsToNearestEven) {
  for (uint32_t b : SampleFloatBits()) {
    const float f = FromBits(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), ReferenceHalf(f)) << std::hexfloat << f;
  }
}

TEST(DTypeTest, FloatToHalfEdges) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);                  // largest finite
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);                // just below the midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);                  // midpoint ties to even: Inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);                  // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);                  // tie to even: zero
  EXPECT_EQ(FloatToHalf(0x1.000002p-25f), 0x0001);           // just above the tie
  EXPECT_EQ(FloatToHalf(0x3p-25f), 0x0002);                  // 1.5 units: tie to even (2)
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);                  // smallest normal
  EXPECT_EQ(FloatToHalf(0x1.ff8p-15f), 0x03FF);              // largest subnormal
  EXPECT_EQ(FloatToHalf(0x1.ffcp-15f), 0x0400);              // tie above it: rounds up into the normals
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);           // tie, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 0x3p-11f), 0x3C02);           // tie, odd rounds up
}

TEST(DTypeTest, FloatToBf16RoundsToNearestEven) {
  for (uint32_t b : SampleFloatBits()) {
    const float f = FromBits(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), ReferenceBf16(f)) << std::hexfloat << f;
  }
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001)), 0x0000);               // tiny subnormal: zero
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);               // subnormal tie, odd: up
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xFF80);
}

TEST(DTypeTest, NanStaysQuietNanWithSign) {
  for (uint32_t b : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu, 0x7F802000u}) {
    const float f = FromBits(b);
    const uint16_t bf = FloatToBf16(f);
    EXPECT_EQ(bf & 0x7F80, 0x7F80);
    EXPECT_NE(bf & 0x007F, 0) << "still NaN: " << std::hex << b;
    EXPECT_EQ(bf & 0x0040, 0x0040) << "quiet";
    EXPECT_EQ(bf >> 15, b >> 31);
    const uint16_t h = FloatToHalf(f);
    EXPECT_EQ(h & 0x7C00, 0x7C00);
    EXPECT_EQ(h & 0x0200, 0x0200) << "quiet";
    EXPECT_EQ(h >> 15, b >> 31);
    EXPECT_TRUE(std::isnan(HalfToFloat(h)));
  }
}

class CastIsaTest : public ::testing::TestWithParam<Isa> {};

TEST_P(CastIsaTest, FromF32MatchesScalarBitForBit) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = ThreadPool::Create({.num_threads = 2});
  ASSERT_TRUE(pool.ok());
  std::vector<uint32_t> bits = SampleFloatBits();
  for (uint32_t b : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu, 0x7F802000u}) {
    bits.push_back(b);
  }
  bits.push_back(0x12345678);  // make the length odd: a tail
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * 4);
  for (DType d : {DType::kBf16, DType::kF16}) {
    std::vector<uint16_t> out(src.size() + 1, 0xABCD);
    ASSERT_TRUE(CastFromF32(**pool, GetParam(), src.data(), d, out.data(), static_cast<int64_t>(src.size())).ok());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t want = d == DType::kBf16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
      ASSERT_EQ(out[i], want) << DTypeName(d) << " bits " << std::hex << bits[i];
    }
    EXPECT_EQ(out.back(), 0xABCD) << "wrote past the end";
  }
}

TEST_P(CastIsaTest, ToF32MatchesScalarForAllPatterns) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = ThreadPool::Create({.num_threads = 2});
  ASSERT_TRUE(pool.ok());
  std::vector<uint16_t> src(0x10000 + 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i);
  for (DType d : {DType::kBf16, DType::kF16}) {
    // Start one element in, so the vector loads are unaligned.
    std::vector<float> out(src.size(), 0.0f);
    ASSERT_TRUE(CastToF32(**pool, GetParam(), src.data() + 1, d, out.data() + 1,
                          static_cast<int64_t>(src.size() - 1)).ok());
    for (size_t i = 1; i < src.size(); ++i) {
      const float want = d == DType::kBf16 ? Bf16ToFloat(src[i]) : HalfToFloat(src[i]);
      ASSERT_EQ(Bits(out[i]), Bits(want)) << DTypeName(d) << " " << std::hex << src[i];
    }
    EXPECT_EQ(Bits(out[0]), 0u);
  }
}

TEST_P(CastIsaTest, RejectsBadArguments) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = ThreadPool::Create({.num_threads = 1});
  ASSERT_TRUE(pool.ok());
  float f = 1.0f;
  uint16_t h = 0;
  EXPECT_FALSE(CastFromF32(**pool, GetParam(), &f, DType::kF32, &h, 1).ok());
  EXPECT_FALSE(CastFromF32(**pool, GetParam(), nullptr, DType::kBf16, &h, 1).ok());
  EXPECT_FALSE(CastToF32(**pool, GetParam(), &h, DType::kBf16, &f, -1).ok());
  EXPECT_TRUE(CastToF32(**pool, GetParam(), nullptr, DType::kBf16, nullptr, 0).ok());
}

TEST(AddScaledTest, MatchesTheScalarLoopOnAnyThreadCount) {
  const int64_t n = 3 * kChunkElems + 17;  // several chunks and a ragged end
  std::vector<float> src(static_cast<size_t>(n)), base(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    src[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * 1e-3f;
    base[static_cast<size_t>(i)] = std::cos(0.11f * static_cast<float>(i));
  }
  const float scale = 1.0f / 6.0f;
  std::vector<float> want = base;
  for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] += src[static_cast<size_t>(i)] * scale;
  for (int threads : {1, 3}) {
    auto pool = ThreadPool::Create({.num_threads = threads});
    ASSERT_TRUE(pool.ok());
    std::vector<float> acc = base;
    ASSERT_TRUE(AddScaled(**pool, src.data(), scale, acc.data(), n).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(acc[static_cast<size_t>(i)]), Bits(want[static_cast<size_t>(i)])) << i << " threads " << threads;
    }
    EXPECT_FALSE(AddScaled(**pool, nullptr, scale, acc.data(), 1).ok());
    EXPECT_FALSE(AddScaled(**pool, src.data(), scale, acc.data(), -1).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CastIsaTest, ::testing::ValuesIn(testing::AllIsas()),
                         [](const auto& p) { return std::string(IsaName(p.param)); });

}  // namespace
}  // namespace zinf::optim
