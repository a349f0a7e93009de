// CpuAdam on every ISA, against a double-precision reference over many steps,
// against the scalar path bit for bit, and at the edges (odd lengths,
// unaligned starts, guards past the end, bad arguments).
//
// Tolerances, relative to the fp64 reference after kSteps = 100 steps with lr
// up to 1e-2 (fp32 rounds each of ~12 operations per step to 2^-24; the
// errors grow at most linearly with the steps):
//   params:      |p - p64| <= 2e-6 * |p64| + 1e-5 * sum_t lr_t
//   exp_avg_sq:  |v - v64| <= 1e-5 * v64 + 1e-30
//   exp_avg:     |m - m64| <= 1e-5 * (|m64| + sqrt(v64)) + 1e-30
// (m is compared against the scale of sqrt(v): when gradients change sign m
// is a difference of nearly equal terms and only its absolute error is
// small.) The largest errors measured are about a quarter of these bounds.
#include "optim/cpu_adam.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/half.h"
#include "optim/thread_pool.h"
#include "optim_test_util.h"
#include "zinf/element_type.h"

namespace zinf::optim {
namespace {

constexpr int kSteps = 100;

enum class Decay { kNone, kL2, kAdamW };

OptimizerConfig MakeConfig(Decay decay) {
  OptimizerConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.bias_correction = true;
  switch (decay) {
    case Decay::kNone:
      c.type = OptimizerType::kAdamW;
      c.weight_decay = 0.0;
      break;
    case Decay::kL2:
      c.type = OptimizerType::kAdam;
      c.adam_w_mode = false;
      c.weight_decay = 0.1;
      break;
    case Decay::kAdamW:
      c.type = OptimizerType::kAdamW;
      c.weight_decay = 0.1;
      break;
  }
  return c;
}

// The optimizer state plus a gradient, with guard elements around each array.
struct State {
  static constexpr int kGuard = 17;  // also makes the arrays start unaligned
  explicit State(int64_t n) : n(n) {
    for (auto* a : {&p, &m, &v}) a->assign(static_cast<size_t>(n + 2 * kGuard), 7.0f);
    g.assign(static_cast<size_t>(n + 2 * kGuard), 7.0f);
    g16.assign(static_cast<size_t>(n + 2 * kGuard), 0x7777);
    out.assign(static_cast<size_t>(n + 2 * kGuard), 0x5555);
  }
  float* P() { return p.data() + kGuard; }
  float* M() { return m.data() + kGuard; }
  float* V() { return v.data() + kGuard; }
  int64_t n;
  std::vector<float> p, m, v, g;
  std::vector<uint16_t> g16, out;
};

// Gradients of several magnitudes, zeros and sign changes, as `dtype`; `g64`
// receives the exact values the kernel will read.
void MakeGrads(std::mt19937& rng, ElementType dtype, State& s, std::vector<double>& g64) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  g64.resize(static_cast<size_t>(s.n));
  for (int64_t i = 0; i < s.n; ++i) {
    const float scales[] = {1.0f, 1e-3f, 30.0f, 1e-6f, 0.0f};
    float x = normal(rng) * scales[i % 5];
    float exact = x;
    if (dtype == ElementType::kBf16) {
      s.g16[State::kGuard + i] = FloatToBf16(x);
      exact = Bf16ToFloat(s.g16[State::kGuard + i]);
    } else if (dtype == ElementType::kF16) {
      s.g16[State::kGuard + i] = FloatToHalf(x);
      exact = HalfToFloat(s.g16[State::kGuard + i]);
    } else {
      s.g[State::kGuard + i] = x;
    }
    g64[i] = exact;
  }
}

AdamSpan SpanOf(State& s, ElementType grad_dtype, int out) {
  AdamSpan span;
  span.params = s.P();
  span.exp_avg = s.M();
  span.exp_avg_sq = s.V();
  span.grad_dtype = grad_dtype;
  span.grads = grad_dtype == ElementType::kF32 ? static_cast<const void*>(s.g.data() + State::kGuard)
                                               : static_cast<const void*>(s.g16.data() + State::kGuard);
  if (out != 0) {
    span.params16 = s.out.data() + State::kGuard;
    span.params16_dtype = out == 1 ? ElementType::kBf16 : ElementType::kF16;
  }
  span.n = s.n;
  return span;
}

// The fp64 reference: DeepSpeed's update in double.
struct Reference {
  std::vector<double> p, m, v;
  void Step(const OptimizerConfig& c, bool decoupled, const std::vector<double>& g_in, int64_t t, double lr,
            double grad_scale) {
    const double bc1 = 1.0 - std::pow(c.beta1, t), bc2 = 1.0 - std::pow(c.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = g_in[i] * grad_scale;
      if (c.weight_decay > 0 && !decoupled) g += c.weight_decay * p[i];
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + c.eps;
      if (c.weight_decay > 0 && decoupled) p[i] -= lr * c.weight_decay * p[i];
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

double LrForStep(int t) { return 1e-2 * (0.2 + 0.8 * std::sin(0.1 * t) * std::sin(0.1 * t)); }

void ExpectGuardsIntact(const State& s) {
  for (int k = 0; k < State::kGuard; ++k) {
    for (const auto* a : {&s.p, &s.m, &s.v}) {
      ASSERT_EQ((*a)[k], 7.0f);
      ASSERT_EQ((*a)[a->size() - 1 - k], 7.0f) << "wrote past the end";
    }
    ASSERT_EQ(s.out[k], 0x5555);
    ASSERT_EQ(s.out[s.out.size() - 1 - k], 0x5555) << "wrote past the end of params16";
  }
}

std::unique_ptr<ThreadPool> MakePool(int threads) {
  auto pool = ThreadPool::Create({.num_threads = threads, .bind_threads = false});
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

using Param = std::tuple<Isa, ElementType, int /*out: 0 none, 1 bf16, 2 fp16*/, Decay>;

class CpuAdamTest : public ::testing::TestWithParam<Param> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  ElementType grad_dtype() const { return std::get<1>(GetParam()); }
  int out() const { return std::get<2>(GetParam()); }
  Decay decay() const { return std::get<3>(GetParam()); }
};

TEST_P(CpuAdamTest, TracksFp64ReferenceOverManySteps) {
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  auto pool = MakePool(2);
  const OptimizerConfig config = MakeConfig(decay());
  auto adam = CpuAdam::Create(config, pool.get(), isa());
  ASSERT_TRUE(adam.ok()) << adam.status().ToString();
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 100, 1027}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    State s(n);
    Reference ref;
    for (int64_t i = 0; i < n; ++i) {
      s.P()[i] = normal(rng);
      s.M()[i] = 0.0f;
      s.V()[i] = 0.0f;
      ref.p.push_back(s.P()[i]);
    }
    ref.m.assign(static_cast<size_t>(n), 0.0);
    ref.v.assign(static_cast<size_t>(n), 0.0);
    std::vector<double> g64;
    double lr_sum = 0.0;
    for (int t = 1; t <= kSteps; ++t) {
      MakeGrads(rng, grad_dtype(), s, g64);
      const double lr = LrForStep(t);
      const double grad_scale = (t % 3 == 0) ? 0.25 : 1.0;  // exact in float
      lr_sum += lr;
      ASSERT_TRUE((*adam).Update(SpanOf(s, grad_dtype(), out()), {.step = t, .lr = lr, .grad_scale = grad_scale}).ok());
      ref.Step(config, adam->decoupled_weight_decay(), g64, t, lr, grad_scale);
    }
    for (int64_t i = 0; i < n; ++i) {
      const double p = s.P()[i], m = s.M()[i], v = s.V()[i];
      ASSERT_NEAR(p, ref.p[i], 2e-6 * std::fabs(ref.p[i]) + 1e-5 * lr_sum) << "params[" << i << "]";
      ASSERT_NEAR(v, ref.v[i], 1e-5 * ref.v[i] + 1e-30) << "exp_avg_sq[" << i << "]";
      ASSERT_NEAR(m, ref.m[i], 1e-5 * (std::fabs(ref.m[i]) + std::sqrt(ref.v[i])) + 1e-30) << "exp_avg[" << i << "]";
      if (out() == 1) {
        ASSERT_EQ(s.out[State::kGuard + i], FloatToBf16(s.P()[i]));
      } else if (out() == 2) {
        ASSERT_EQ(s.out[State::kGuard + i], FloatToHalf(s.P()[i]));
      }
    }
    ExpectGuardsIntact(s);
  }
}

// The vector paths against the scalar one (the reference), bit for bit.
class CpuAdamVsScalarTest : public CpuAdamTest {};

TEST_P(CpuAdamVsScalarTest, MatchesScalarPathBitForBit) {
  ZINF_SKIP_UNLESS_SUPPORTED(isa());
  auto pool = MakePool(2);
  const OptimizerConfig config = MakeConfig(decay());
  auto adam = CpuAdam::Create(config, pool.get(), isa());
  auto scalar = CpuAdam::Create(config, pool.get(), Isa::kScalar);
  ASSERT_TRUE(adam.ok() && scalar.ok());
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Several chunks, so the threads split the work, plus an odd tail.
  const int64_t n = 2 * kChunkElems + 45;
  State a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a.P()[i] = b.P()[i] = normal(rng);
    a.M()[i] = b.M()[i] = 0.01f * normal(rng);
    a.V()[i] = b.V()[i] = 1e-4f * std::fabs(normal(rng));
  }
  std::vector<double> g64;
  for (int t = 1; t <= 5; ++t) {
    MakeGrads(rng, grad_dtype(), a, g64);
    b.g = a.g;
    b.g16 = a.g16;
    const AdamStepArgs step{.step = t, .lr = LrForStep(t), .grad_scale = 0.5};
    ASSERT_TRUE(adam->Update(SpanOf(a, grad_dtype(), out()), step).ok());
    ASSERT_TRUE(scalar->Update(SpanOf(b, grad_dtype(), out()), step).ok());
  }
  EXPECT_EQ(std::memcmp(a.p.data(), b.p.data(), a.p.size() * 4), 0) << "params differ";
  EXPECT_EQ(std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4), 0) << "exp_avg differs";
  EXPECT_EQ(std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4), 0) << "exp_avg_sq differs";
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 2), 0) << "params16 differ";
  ExpectGuardsIntact(a);
}

std::string CaseName(const ::testing::TestParamInfo<Param>& p) {
  const char* outs[] = {"none", "bf16", "fp16"};
  const char* decays[] = {"nodecay", "l2", "adamw"};
  return std::string(IsaName(std::get<0>(p.param))) + "_grad_" + std::string(ElementTypeName(std::get<1>(p.param))) +
         "_out_" + outs[std::get<2>(p.param)] + "_" + decays[static_cast<int>(std::get<3>(p.param))];
}

INSTANTIATE_TEST_SUITE_P(All, CpuAdamTest,
                         ::testing::Combine(::testing::ValuesIn(testing::AllIsas()),
                                            ::testing::Values(ElementType::kF32, ElementType::kBf16, ElementType::kF16),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values(Decay::kNone, Decay::kL2, Decay::kAdamW)),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Vector, CpuAdamVsScalarTest,
                         ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512),
                                            ::testing::Values(ElementType::kF32, ElementType::kBf16, ElementType::kF16),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values(Decay::kNone, Decay::kL2, Decay::kAdamW)),
                         CaseName);

class CpuAdamIsaTest : public ::testing::TestWithParam<Isa> {};

TEST_P(CpuAdamIsaTest, ThreadCountDoesNotChangeResults) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto one = MakePool(1);
  auto three = MakePool(3);
  const OptimizerConfig config = MakeConfig(Decay::kAdamW);
  auto a1 = CpuAdam::Create(config, one.get(), GetParam());
  auto a3 = CpuAdam::Create(config, three.get(), GetParam());
  ASSERT_TRUE(a1.ok() && a3.ok());
  const int64_t n = 5 * kChunkElems + 3;
  State x(n), y(n);
  std::mt19937 rng(5);
  std::vector<double> g64;
  for (int64_t i = 0; i < n; ++i) x.P()[i] = y.P()[i] = static_cast<float>(i % 1000) * 1e-3f;
  std::fill(x.M(), x.M() + n, 0.0f);
  std::fill(y.M(), y.M() + n, 0.0f);
  std::fill(x.V(), x.V() + n, 0.0f);
  std::fill(y.V(), y.V() + n, 0.0f);
  MakeGrads(rng, ElementType::kF32, x, g64);
  y.g = x.g;
  ASSERT_TRUE(a1->Update(SpanOf(x, ElementType::kF32, 1), {.step = 1, .lr = 1e-3}).ok());
  ASSERT_TRUE(a3->Update(SpanOf(y, ElementType::kF32, 1), {.step = 1, .lr = 1e-3}).ok());
  EXPECT_EQ(x.p, y.p);
  EXPECT_EQ(x.out, y.out);
}

// UpdateMasked over elements [base, base + n): inside the no-decay ranges
// (one before the span, ones crossing chunk edges and the span's end) each
// element gets exactly a weight_decay 0 step, elsewhere exactly the plain
// step, with L2 and decoupled decay, over two steps.
TEST_P(CpuAdamIsaTest, MaskedUpdateSkipsDecayExactlyInsideTheRanges) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(3);
  for (Decay decay : {Decay::kL2, Decay::kAdamW}) {
    OptimizerConfig none = MakeConfig(decay);
    none.weight_decay = 0.0;
    auto adam = CpuAdam::Create(MakeConfig(decay), pool.get(), GetParam());
    auto plain = CpuAdam::Create(none, pool.get(), GetParam());
    ASSERT_TRUE(adam.ok() && plain.ok());
    const int64_t n = 3 * kChunkElems + 37, base = 1000;
    const std::vector<ElemRange> no_decay = {{10, 900},
                                             {base + 5, base + 100},
                                             {base + kChunkElems - 3, base + 2 * kChunkElems + 1},
                                             {base + n - 2, base + n + 50}};
    auto inside = [&](int64_t i) {
      return std::any_of(no_decay.begin(), no_decay.end(),
                         [&](const ElemRange& r) { return base + i >= r.begin && base + i < r.end; });
    };
    State x(n), y(n), z(n);  // masked, decayed everywhere, decayed nowhere
    std::mt19937 rng(11);
    std::vector<double> g64;
    for (int64_t i = 0; i < n; ++i) x.P()[i] = static_cast<float>(i % 997) * 1e-2f - 3.0f;
    for (State* s : {&x, &y, &z}) {
      std::copy(x.P(), x.P() + n, s->P());
      std::fill(s->M(), s->M() + n, 0.0f);
      std::fill(s->V(), s->V() + n, 0.0f);
    }
    for (int64_t t = 1; t <= 2; ++t) {
      MakeGrads(rng, ElementType::kF32, x, g64);
      y.g = z.g = x.g;
      const AdamStepArgs args{.step = t, .lr = 1e-2};
      ASSERT_TRUE(adam->UpdateMasked(SpanOf(x, ElementType::kF32, 1), args, base, no_decay).ok());
      ASSERT_TRUE(adam->Update(SpanOf(y, ElementType::kF32, 1), args).ok());
      ASSERT_TRUE(plain->Update(SpanOf(z, ElementType::kF32, 1), args).ok());
    }
    int64_t undecayed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const State& want = inside(i) ? z : y;
      undecayed += inside(i);
      const size_t k = static_cast<size_t>(State::kGuard + i);
      ASSERT_EQ(std::bit_cast<uint32_t>(x.p[k]), std::bit_cast<uint32_t>(want.p[k])) << "params[" << i << "]";
      ASSERT_EQ(std::bit_cast<uint32_t>(x.m[k]), std::bit_cast<uint32_t>(want.m[k])) << "exp_avg[" << i << "]";
      ASSERT_EQ(std::bit_cast<uint32_t>(x.v[k]), std::bit_cast<uint32_t>(want.v[k])) << "exp_avg_sq[" << i << "]";
      ASSERT_EQ(x.out[k], want.out[k]) << "params16[" << i << "]";
    }
    EXPECT_EQ(undecayed, 95 + kChunkElems + 4 + 2);
    EXPECT_NE(y.p, z.p);      // the decay is large enough to show
    EXPECT_EQ(x.p[0], 7.0f);  // guards untouched
    EXPECT_EQ(x.p[static_cast<size_t>(State::kGuard + n)], 7.0f);
  }
}

TEST_P(CpuAdamIsaTest, GradScaleIsAppliedBeforeTheUpdate) {
  // Gradients times 1024 with grad_scale 1/1024 must give the very same bits
  // as the plain gradients: both scalings are exact.
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(2);
  auto adam = CpuAdam::Create(MakeConfig(Decay::kL2), pool.get(), GetParam());
  ASSERT_TRUE(adam.ok());
  const int64_t n = 333;
  State a(n), b(n);
  std::mt19937 rng(8);
  std::vector<double> g64;
  std::fill(a.P(), a.P() + n, 0.5f);
  std::fill(b.P(), b.P() + n, 0.5f);
  std::fill(a.M(), a.M() + n, 0.0f);
  std::fill(b.M(), b.M() + n, 0.0f);
  std::fill(a.V(), a.V() + n, 0.0f);
  std::fill(b.V(), b.V() + n, 0.0f);
  MakeGrads(rng, ElementType::kF32, a, g64);
  for (int64_t i = 0; i < n; ++i) b.g[State::kGuard + i] = a.g[State::kGuard + i] * 1024.0f;
  ASSERT_TRUE(adam->Update(SpanOf(a, ElementType::kF32, 0), {.step = 3, .lr = 1e-3}).ok());
  ASSERT_TRUE(adam->Update(SpanOf(b, ElementType::kF32, 0), {.step = 3, .lr = 1e-3, .grad_scale = 1.0 / 1024}).ok());
  EXPECT_EQ(a.p, b.p);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
}

TEST_P(CpuAdamIsaTest, WithoutBiasCorrectionMatchesPlainFormula) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(1);
  OptimizerConfig c = MakeConfig(Decay::kNone);
  c.bias_correction = false;
  auto adam = CpuAdam::Create(c, pool.get(), GetParam());
  ASSERT_TRUE(adam.ok());
  float p = 1.0f, m = 0.0f, v = 0.0f, g = 2.0f;
  AdamSpan span{.params = &p, .exp_avg = &m, .exp_avg_sq = &v, .grads = &g, .n = 1};
  ASSERT_TRUE(adam->Update(span, {.step = 1, .lr = 0.1}).ok());
  // m = 0.2, v = 0.004, p = 1 - 0.1 * 0.2 / (sqrt(0.004) + 1e-8)
  EXPECT_NEAR(m, 0.2, 1e-7);
  EXPECT_NEAR(v, 0.004, 1e-9);
  EXPECT_NEAR(p, 1.0 - 0.1 * 0.2 / (std::sqrt(0.004) + 1e-8), 1e-6);
}

TEST_P(CpuAdamIsaTest, FirstStepMovesEachParamByLr) {
  // With bias correction, step 1 gives m_hat / sqrt(v_hat) = sign(g) (eps
  // aside): every param moves by lr against its gradient.
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(1);
  auto adam = CpuAdam::Create(MakeConfig(Decay::kNone), pool.get(), GetParam());
  ASSERT_TRUE(adam.ok());
  const int64_t n = 37;
  State s(n);
  for (int64_t i = 0; i < n; ++i) {
    s.P()[i] = 1.0f;
    s.M()[i] = s.V()[i] = 0.0f;
    s.g[State::kGuard + i] = (i % 2 ? 1.0f : -1.0f) * static_cast<float>(i + 1);
  }
  ASSERT_TRUE(adam->Update(SpanOf(s, ElementType::kF32, 2), {.step = 1, .lr = 1e-2}).ok());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(s.P()[i], i % 2 ? 0.99 : 1.01, 1e-6) << i;
    EXPECT_EQ(s.out[State::kGuard + i], FloatToHalf(s.P()[i]));
  }
  ExpectGuardsIntact(s);
}

TEST_P(CpuAdamIsaTest, NonFiniteGradientPropagates) {
  // The engine skips such steps; if one is applied anyway the damage must be
  // visible (NaN), never silently clipped.
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(1);
  auto adam = CpuAdam::Create(MakeConfig(Decay::kAdamW), pool.get(), GetParam());
  ASSERT_TRUE(adam.ok());
  const int64_t n = 20;
  State s(n);
  std::fill(s.P(), s.P() + n, 1.0f);
  std::fill(s.M(), s.M() + n, 0.0f);
  std::fill(s.V(), s.V() + n, 0.0f);
  std::fill(s.g.begin(), s.g.end(), 0.5f);
  s.g[State::kGuard + 3] = NAN;
  s.g[State::kGuard + 18] = INFINITY;
  ASSERT_TRUE(adam->Update(SpanOf(s, ElementType::kF32, 1), {.step = 1, .lr = 1e-3}).ok());
  EXPECT_TRUE(std::isnan(s.P()[3]));
  EXPECT_TRUE(std::isnan(s.P()[18]));  // inf / inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(s.out[State::kGuard + 3])));
  EXPECT_FALSE(std::isnan(s.P()[4]));
}

TEST_P(CpuAdamIsaTest, BandwidthPassWithZeroScaleKeepsData) {
  ZINF_SKIP_UNLESS_SUPPORTED(GetParam());
  auto pool = MakePool(2);
  auto adam = CpuAdam::Create(MakeConfig(Decay::kNone), pool.get(), GetParam());
  ASSERT_TRUE(adam.ok());
  const int64_t n = kChunkElems + 9;
  State s(n);
  for (int64_t i = 0; i < n; ++i) {
    s.P()[i] = static_cast<float>(i);
    s.M()[i] = 1.0f;
    s.V()[i] = 2.0f;
    s.g[State::kGuard + i] = 3.0f;
  }
  const std::vector<float> p0 = s.p;
  ASSERT_TRUE(adam->BandwidthPass(SpanOf(s, ElementType::kF32, 1), 0.0f).ok());
  EXPECT_EQ(s.p, p0);
  EXPECT_EQ(s.out[State::kGuard + 5], static_cast<uint16_t>(std::bit_cast<uint32_t>(5.0f) >> 16));
  ASSERT_TRUE(adam->BandwidthPass(SpanOf(s, ElementType::kF32, 0), 1.0f).ok());
  EXPECT_EQ(s.M()[n - 1], 4.0f);
  ExpectGuardsIntact(s);
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuAdamIsaTest, ::testing::ValuesIn(testing::AllIsas()),
                         [](const auto& p) { return std::string(IsaName(p.param)); });

TEST(CpuAdamConfigTest, RejectsBadConfig) {
  auto pool = MakePool(1);
  OptimizerConfig c;
  c.beta1 = 1.0;
  EXPECT_EQ(CpuAdam::Create(c, pool.get(), Isa::kScalar).status().code(), StatusCode::kInvalidArgument);
  c = {};
  c.beta2 = -0.1;
  EXPECT_FALSE(CpuAdam::Create(c, pool.get(), Isa::kScalar).ok());
  c = {};
  c.eps = -1e-8;
  EXPECT_FALSE(CpuAdam::Create(c, pool.get(), Isa::kScalar).ok());
  c = {};
  c.weight_decay = NAN;
  EXPECT_FALSE(CpuAdam::Create(c, pool.get(), Isa::kScalar).ok());
  EXPECT_FALSE(CpuAdam::Create(OptimizerConfig{}, nullptr, Isa::kScalar).ok());
}

TEST(CpuAdamConfigTest, DecayModeFollowsDeepSpeed) {
  auto pool = MakePool(1);
  OptimizerConfig c;
  c.type = OptimizerType::kAdamW;
  c.adam_w_mode = false;  // AdamW always decouples
  EXPECT_TRUE(CpuAdam::Create(c, pool.get(), Isa::kScalar)->decoupled_weight_decay());
  c.type = OptimizerType::kAdam;
  c.adam_w_mode = true;  // DeepSpeed's default for Adam
  EXPECT_TRUE(CpuAdam::Create(c, pool.get(), Isa::kScalar)->decoupled_weight_decay());
  c.adam_w_mode = false;
  EXPECT_FALSE(CpuAdam::Create(c, pool.get(), Isa::kScalar)->decoupled_weight_decay());
}

TEST(CpuAdamConfigTest, RejectsBadUpdateArguments) {
  auto pool = MakePool(1);
  auto adam = CpuAdam::Create(OptimizerConfig{}, pool.get(), Isa::kScalar);
  ASSERT_TRUE(adam.ok());
  float p = 1, m = 0, v = 0, g = 1;
  uint16_t out = 0;
  const AdamSpan good{.params = &p, .exp_avg = &m, .exp_avg_sq = &v, .grads = &g, .n = 1};
  EXPECT_TRUE(adam->Update(good, {.step = 1, .lr = 1e-3}).ok());
  const float p_after = p;
  EXPECT_FALSE(adam->Update(good, {.step = 0, .lr = 1e-3}).ok());
  EXPECT_FALSE(adam->Update(good, {.step = 2, .lr = NAN}).ok());
  EXPECT_FALSE(adam->Update(good, {.step = 2, .lr = -1.0}).ok());
  EXPECT_FALSE(adam->Update(good, {.step = 2, .lr = 1e-3, .grad_scale = INFINITY}).ok());
  AdamSpan bad = good;
  bad.exp_avg = nullptr;
  EXPECT_FALSE(adam->Update(bad, {.step = 2, .lr = 1e-3}).ok());
  bad = good;
  bad.n = -1;
  EXPECT_FALSE(adam->Update(bad, {.step = 2, .lr = 1e-3}).ok());
  bad = good;
  bad.params16 = &out;
  bad.params16_dtype = ElementType::kF32;
  EXPECT_FALSE(adam->Update(bad, {.step = 2, .lr = 1e-3}).ok());
  bad.params16_dtype = ElementType::kF64;
  EXPECT_FALSE(adam->Update(bad, {.step = 2, .lr = 1e-3}).ok());
  bad = good;
  bad.grad_dtype = ElementType::kF64;
  EXPECT_FALSE(adam->Update(bad, {.step = 2, .lr = 1e-3}).ok());
  EXPECT_FALSE(adam->BandwidthPass(bad, 1.0f).ok());
  EXPECT_EQ(p, p_after) << "a rejected call must not write";
  AdamSpan empty;
  EXPECT_TRUE(adam->Update(empty, {.step = 1, .lr = 1e-3}).ok());
}

TEST(CpuAdamConfigTest, UnsupportedIsaIsUnavailable) {
  auto pool = MakePool(1);
  for (Isa isa : testing::AllIsas()) {
    auto adam = CpuAdam::Create(OptimizerConfig{}, pool.get(), isa);
    if (CpuSupports(isa)) {
      EXPECT_TRUE(adam.ok());
    } else {
      EXPECT_EQ(adam.status().code(), StatusCode::kUnavailable);
    }
  }
}

}  // namespace
}  // namespace zinf::optim
