// Gradient sum of squares (every ISA and dtype), its Inf/NaN signal, its
// independence from the thread count, accumulation over sub-groups, and
// DeepSpeed's clip factor.
//
// Tolerance: the double sum against a long double sum, relative 1e-12 (each
// square is exact in double; n <= 1e6 additions of positive terms).
#include "optim/grad_clip.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/half.h"
#include "optim/array_ops.h"
#include "optim/cpu_adam.h"
#include "optim/thread_pool.h"
#include "optim_test_util.h"

namespace zinf::optim {
namespace {

std::unique_ptr<ThreadPool> MakePool(int threads) {
  auto pool = ThreadPool::Create({.num_threads = threads, .bind_threads = false});
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

// n values of `dtype` (as raw storage) and their exact float values.
struct Grads {
  Grads(ElementType dtype, int64_t n, uint32_t seed) : dtype(dtype) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    values.resize(static_cast<size_t>(n));
    if (dtype == ElementType::kF32)
      f32.resize(static_cast<size_t>(n));
    else
      u16.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) Set(i, normal(rng) * ((i % 7 == 0) ? 100.0f : 0.01f));
  }
  void Set(int64_t i, float x) {
    if (dtype == ElementType::kF32) {
      f32[i] = x;
      values[i] = x;
    } else if (dtype == ElementType::kBf16) {
      u16[i] = FloatToBf16(x);
      values[i] = Bf16ToFloat(u16[i]);
    } else {
      u16[i] = FloatToHalf(x);
      values[i] = HalfToFloat(u16[i]);
    }
  }
  const void* data() const { return dtype == ElementType::kF32 ? static_cast<const void*>(f32.data()) : u16.data(); }
  long double SumSquares() const {
    long double s = 0;
    for (float v : values) s += static_cast<long double>(v) * v;
    return s;
  }
  ElementType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<float> values;
};

using Param = std::tuple<Isa, ElementType>;
class SumSquaresTest : public ::testing::TestWithParam<Param> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  ElementType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(SumSquaresTest, MatchesLongDoubleReference) {
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  auto pool = MakePool(2);
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{33}, int64_t{1001}, 3 * kChunkElems + 7}) {
    Grads g(dtype(), n, 42);
    auto sum = SumSquares(*pool, isa(), g.data(), dtype(), n);
    ASSERT_TRUE(sum.ok());
    const long double want = g.SumSquares();
    EXPECT_NEAR(*sum, static_cast<double>(want), 1e-12 * static_cast<double>(want)) << "n = " << n;
  }
}

TEST_P(SumSquaresTest, InfOrNanAnywhereIsReported) {
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  auto pool = MakePool(2);
  const int64_t n = 2 * kChunkElems + 21;
  for (int64_t pos : {int64_t{0}, int64_t{5}, kChunkElems - 1, kChunkElems + 16, n - 1}) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      Grads g(dtype(), n, 7);
      g.Set(pos, bad);
      auto sum = SumSquares(*pool, isa(), g.data(), dtype(), n);
      ASSERT_TRUE(sum.ok());
      GradNormAccumulator acc;
      acc.Add(*sum);
      EXPECT_TRUE(acc.has_inf_or_nan()) << "pos " << pos << " value " << bad;
    }
  }
}

TEST_P(SumSquaresTest, LargestFiniteValuesAreNotAnOverflow) {
  // A float square can overflow fp32; it must not look like an Inf gradient.
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  auto pool = MakePool(2);
  float big = std::numeric_limits<float>::max();
  if (dtype() == ElementType::kF16) big = 65504.0f;
  if (dtype() == ElementType::kBf16) big = Bf16ToFloat(0x7F7F);  // the largest finite bf16
  const int64_t n = 1000;
  Grads g(dtype(), n, 3);
  for (int64_t i = 0; i < n; ++i) g.Set(i, i % 2 ? big : -big);
  auto sum = SumSquares(*pool, isa(), g.data(), dtype(), n);
  ASSERT_TRUE(sum.ok());
  GradNormAccumulator acc;
  acc.Add(*sum);
  EXPECT_FALSE(acc.has_inf_or_nan());
  const double v = g.values[1];
  EXPECT_NEAR(acc.norm(), std::sqrt(static_cast<double>(n)) * v, 1e-12 * std::sqrt(n) * v);
}

TEST_P(SumSquaresTest, SameBitsForAnyThreadCount) {
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  const int64_t n = 7 * kChunkElems + 5;
  Grads g(dtype(), n, 11);
  double first = -1;
  for (int threads : {1, 2, 3, 5}) {
    auto pool = MakePool(threads);
    auto sum = SumSquares(*pool, isa(), g.data(), dtype(), n);
    ASSERT_TRUE(sum.ok());
    if (first < 0) first = *sum;
    EXPECT_EQ(std::bit_cast<uint64_t>(*sum), std::bit_cast<uint64_t>(first)) << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(All, SumSquaresTest,
                         ::testing::Combine(::testing::ValuesIn(testing::AllIsas()),
                                            ::testing::Values(ElementType::kF32, ElementType::kBf16,
                                                              ElementType::kF16)),
                         [](const auto& p) {
                           return std::string(IsaName(std::get<0>(p.param))) + "_" +
                                  std::string(ElementTypeName(std::get<1>(p.param)));
                         });

TEST(GradClipTest, AccumulatesOverSubGroups) {
  auto pool = MakePool(2);
  const int64_t n = 100'003;
  Grads g(ElementType::kF32, n, 5);
  GradNormAccumulator whole, parts;
  whole.Add(*SumSquares(*pool, Isa::kScalar, g.data(), ElementType::kF32, n));
  int64_t begin = 0;
  for (int64_t size : {int64_t{1}, int64_t{4096}, int64_t{50'000}, n}) {
    const int64_t len = std::min(size, n - begin);
    parts.Add(*SumSquares(*pool, BestIsa(), g.f32.data() + begin, ElementType::kF32, len));
    begin += len;
  }
  ASSERT_EQ(begin, n);
  EXPECT_NEAR(parts.norm(), whole.norm(), 1e-12 * whole.norm());
  EXPECT_FALSE(parts.has_inf_or_nan());
  parts.Reset();
  EXPECT_EQ(parts.sum_squares(), 0.0);
}

TEST(GradClipTest, ScaleFactorFollowsDeepSpeed) {
  // No clipping: just unscale.
  EXPECT_DOUBLE_EQ(GradScaleFactor(1e6, 1024.0, 0.0), 1.0 / 1024);
  // Norm (unscaled) 0.5 below max_norm 1: no clipping.
  EXPECT_DOUBLE_EQ(GradScaleFactor(0.5 * 1024, 1024.0, 1.0), 1.0 / 1024);
  // Norm 4 above max_norm 1: clip = (4 + 1e-6) / 1, factor 1 / (clip * scale).
  EXPECT_DOUBLE_EQ(GradScaleFactor(4.0 * 8, 8.0, 1.0), 1.0 / ((4.0 + 1e-6) * 8.0));
  // The unscaled clipped norm lands at max_norm (to 1e-6).
  const double norm = 123.0, scale = 65536.0, max_norm = 2.0;
  EXPECT_NEAR(norm * scale * GradScaleFactor(norm * scale, scale, max_norm), max_norm, 1e-6);
  // Just at the threshold: clip = 1 + 1e-6 / max_norm > 1, DeepSpeed clips too.
  EXPECT_LT(GradScaleFactor(1.0, 1.0, 1.0), 1.0);
  EXPECT_EQ(GradScaleFactor(INFINITY, 1.0, 1.0), 0.0);
  EXPECT_EQ(GradScaleFactor(NAN, 1.0, 0.0), 0.0);
}

TEST(GradClipTest, ClippedUpdateEqualsUpdateOfClippedGradients) {
  // Fusing the clip into the update must equal clipping the gradient first.
  auto pool = MakePool(2);
  OptimizerConfig c;
  auto adam = CpuAdam::Create(c, pool.get(), BestIsa());
  ASSERT_TRUE(adam.ok());
  const int64_t n = 1000;
  Grads g(ElementType::kF32, n, 9);
  const double norm = std::sqrt(*SumSquares(*pool, BestIsa(), g.data(), ElementType::kF32, n));
  const double factor = GradScaleFactor(norm, 1.0, 0.5);
  ASSERT_LT(factor, 1.0);
  std::vector<float> p1(n, 1.0f), m1(n, 0.0f), v1(n, 0.0f), p2 = p1, m2 = m1, v2 = v1;
  std::vector<float> clipped(n);
  for (int64_t i = 0; i < n; ++i) clipped[i] = g.f32[i] * static_cast<float>(factor);
  ASSERT_TRUE(
      adam->Update({.params = p1.data(), .exp_avg = m1.data(), .exp_avg_sq = v1.data(), .grads = g.f32.data(), .n = n},
                   {.step = 1, .lr = 1e-3, .grad_scale = factor})
          .ok());
  ASSERT_TRUE(
      adam->Update(
              {.params = p2.data(), .exp_avg = m2.data(), .exp_avg_sq = v2.data(), .grads = clipped.data(), .n = n},
              {.step = 1, .lr = 1e-3})
          .ok());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(v1, v2);
}

TEST(GradClipTest, RejectsBadArguments) {
  auto pool = MakePool(1);
  EXPECT_FALSE(SumSquares(*pool, Isa::kScalar, nullptr, ElementType::kF32, 4).ok());
  float x = 1;
  EXPECT_FALSE(SumSquares(*pool, Isa::kScalar, &x, ElementType::kF32, -1).ok());
  EXPECT_EQ(*SumSquares(*pool, Isa::kScalar, nullptr, ElementType::kF32, 0), 0.0);
  EXPECT_EQ(SumSquares(*pool, Isa::kScalar, &x, ElementType::kF64, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::optim
