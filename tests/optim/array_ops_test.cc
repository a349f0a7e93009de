// optim's array passes: every ISA's vector casts bit for bit against the
// scalar reference conversions (core/half.h, tested on their own in
// tests/core/half_test.cc), and AddScaled against the plain loop.
#include "optim/array_ops.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/float_samples.h"
#include "core/half.h"
#include "optim/cpu_adam.h"
#include "optim/thread_pool.h"
#include "optim_test_util.h"

namespace zinf::optim {
namespace {

using zinf::testing::kNanBits;
using zinf::testing::SampleFloatBits;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

class CastIsaTest : public ::testing::TestWithParam<Isa> {};

TEST_P(CastIsaTest, FromF32MatchesScalarBitForBit) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = ThreadPool::Create({.num_threads = 2});
  ASSERT_TRUE(pool.ok());
  std::vector<uint32_t> bits = SampleFloatBits();
  for (uint32_t b : kNanBits) bits.push_back(b);
  bits.push_back(0x12345678);  // make the length odd: a tail
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * 4);
  for (ElementType d : {ElementType::kBf16, ElementType::kF16}) {
    std::vector<uint16_t> out(src.size() + 1, 0xABCD);
    ASSERT_TRUE(CastFromF32(**pool, GetParam(), src.data(), d, out.data(), static_cast<int64_t>(src.size())).ok());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t want = d == ElementType::kBf16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
      ASSERT_EQ(out[i], want) << ElementTypeName(d) << " bits " << std::hex << bits[i];
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
  for (ElementType d : {ElementType::kBf16, ElementType::kF16}) {
    // Start one element in, so the vector loads are unaligned.
    std::vector<float> out(src.size(), 0.0f);
    ASSERT_TRUE(
        CastToF32(**pool, GetParam(), src.data() + 1, d, out.data() + 1, static_cast<int64_t>(src.size() - 1)).ok());
    for (size_t i = 1; i < src.size(); ++i) {
      const float want = d == ElementType::kBf16 ? Bf16ToFloat(src[i]) : HalfToFloat(src[i]);
      ASSERT_EQ(Bits(out[i]), Bits(want)) << ElementTypeName(d) << " " << std::hex << src[i];
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
  EXPECT_FALSE(CastFromF32(**pool, GetParam(), &f, ElementType::kF32, &h, 1).ok());
  EXPECT_FALSE(CastFromF32(**pool, GetParam(), &f, ElementType::kF64, &h, 1).ok());
  EXPECT_FALSE(CastToF32(**pool, GetParam(), &h, ElementType::kF32, &f, 1).ok());
  EXPECT_FALSE(CastToF32(**pool, GetParam(), &h, ElementType::kU8, &f, 1).ok());
  EXPECT_FALSE(CastFromF32(**pool, GetParam(), nullptr, ElementType::kBf16, &h, 1).ok());
  EXPECT_FALSE(CastToF32(**pool, GetParam(), &h, ElementType::kBf16, &f, -1).ok());
  EXPECT_TRUE(CastToF32(**pool, GetParam(), nullptr, ElementType::kBf16, nullptr, 0).ok());
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

TEST(SetScaledTest, IsAddScaledOnZerosBitForBit) {
  const int64_t n = 2 * kChunkElems + 5;
  std::vector<float> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * 1e-3f;
  // The values where "0 +" matters or rounding could: signed zeros, the
  // smallest subnormals (whose products flush to +-0), inf, a NaN.
  const float specials[] = {-0.0f,
                            0.0f,
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -3.0f};
  for (size_t i = 0; i < std::size(specials); ++i) src[i] = specials[i];
  for (float scale : {1.0f, 1.0f / 6.0f, 0.5f}) {
    auto pool = ThreadPool::Create({.num_threads = 2});
    ASSERT_TRUE(pool.ok());
    std::vector<float> want(static_cast<size_t>(n), 0.0f), got(static_cast<size_t>(n), 42.0f);
    ASSERT_TRUE(AddScaled(**pool, src.data(), scale, want.data(), n).ok());
    ASSERT_TRUE(SetScaled(**pool, src.data(), scale, got.data(), n).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(got[static_cast<size_t>(i)]), Bits(want[static_cast<size_t>(i)])) << i << " scale " << scale;
    }
    EXPECT_EQ(Bits(got[0]), Bits(0.0f));  // -0 x scale: +0, as the sum gives
    EXPECT_FALSE(SetScaled(**pool, src.data(), scale, got.data(), -1).ok());
  }
}

}  // namespace
}  // namespace zinf::optim
