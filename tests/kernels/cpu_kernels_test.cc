// CPU kernels: every backward against central finite differences of its
// forward, in double (the objective, the step, the tolerance and the
// prefilled gradients: tests/testing/finite_differences.h), plus exact
// properties and the float kernels against the double ones.
#include "kernels/cpu_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "core/half.h"
#include "testing/finite_differences.h"

namespace zinf::kernels::cpu {
namespace {

using test_support::Dot;
using test_support::ExpectGradient;
using test_support::Filled;
using test_support::kPrefill;
using test_support::Random;

// Shapes shared by the gradient checks: small, but with more than one batch,
// head and position so that indexing mistakes show.
constexpr int kB = 2, kT = 5, kC = 8, kNH = 2;
constexpr int64_t kN = kB * kT;

TEST(CpuKernelsTest, EncoderBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(1);
  const int V = 7;
  // Repeated tokens: their rows of dwte must collect every occurrence.
  std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 3, 3, 2, 1, 5};
  std::vector<double> wte = Random(V * kC, rng), wpe = Random(kT * kC, rng), w = Random(kN * kC, rng);
  std::vector<double> out(kN * kC);
  auto objective = [&] {
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
    return Dot(out, w);
  };
  std::vector<double> dwte = Filled(wte.size()), dwpe = Filled(wpe.size());
  EncoderBackward(dwte.data(), dwpe.data(), w.data(), tokens.data(), kB, kT, kC);
  ExpectGradient("dwte", wte, dwte, objective);
  ExpectGradient("dwpe", wpe, dwpe, objective);
}

// The padding token's row of dwte gets nothing (nn.Embedding's
// padding_idx); every other row, and dwpe, what they get without it.
TEST(CpuKernelsTest, EncoderBackwardSkipsThePaddingRow) {
  std::mt19937_64 rng(3);
  const int V = 7;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 3, 3, 2, 1, 5};
  const std::vector<double> dout = Random(kN * kC, rng);
  std::vector<double> dwte = Random(V * kC, rng), dwpe = Random(kT * kC, rng);
  std::vector<double> pad_dwte = dwte, pad_dwpe = dwpe;
  EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB, kT, kC);
  const std::vector<double> before = pad_dwte;
  EncoderBackward(pad_dwte.data(), pad_dwpe.data(), dout.data(), tokens.data(), kB, kT, kC, 3);
  EXPECT_EQ(pad_dwpe, dwpe);
  for (int v = 0; v < V; ++v) {
    for (int c = 0; c < kC; ++c) {
      const size_t i = static_cast<size_t>(v * kC + c);
      EXPECT_EQ(pad_dwte[i], v == 3 ? before[i] : dwte[i]) << v << " " << c;
    }
  }
  EXPECT_NE(dwte[3 * kC], before[3 * kC]);  // without the padding token, row 3 gathers its four positions
}

TEST(CpuKernelsTest, LayerNormBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  std::vector<double> inp = Random(kN * kC, rng, 2.0), weight = Random(kC, rng), bias = Random(kC, rng);
  std::vector<double> w = Random(kN * kC, rng), out(kN * kC), mean(kN), rstd(kN);
  auto objective = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), kN, kC);
    return Dot(out, w);
  };
  objective();
  std::vector<double> dinp = Filled(inp.size()), dweight = Filled(kC), dbias = Filled(kC);
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                    rstd.data(), kN, kC);
  ExpectGradient("dinp", inp, dinp, objective);
  ExpectGradient("dweight", weight, dweight, objective);
  ExpectGradient("dbias", bias, dbias, objective);
}

TEST(CpuKernelsTest, LayerNormForwardNormalises) {
  std::mt19937_64 rng(3);
  std::vector<double> inp = Random(kN * kC, rng, 3.0), ones(kC, 1.0), zeros(kC, 0.0);
  std::vector<double> out(kN * kC), mean(kN), rstd(kN);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), ones.data(), zeros.data(), kN, kC);
  for (int64_t n = 0; n < kN; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < kC; ++c) m += out[n * kC + c];
    m /= kC;
    for (int c = 0; c < kC; ++c) v += (out[n * kC + c] - m) * (out[n * kC + c] - m);
    v /= kC;
    EXPECT_NEAR(m, 0.0, 1e-12);
    EXPECT_NEAR(v, 1.0, 1e-3);  // eps = 1e-5 inside the sqrt
  }
}

void CheckMatmulGradients(int64_t N, int C, int OC, bool with_bias, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
  std::mt19937_64 rng(seed);
  std::vector<double> inp = Random(N * C, rng), weight = Random(int64_t{OC} * C, rng), bias = Random(OC, rng);
  std::vector<double> w = Random(N * OC, rng), out(N * OC);
  auto objective = [&] {
    MatmulForward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C, OC);
    return Dot(out, w);
  };
  std::vector<double> dinp = Filled(inp.size()), dweight = Filled(weight.size()), dbias = Filled(OC);
  MatmulBackward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(), inp.data(), weight.data(),
                 N, C, OC);
  ExpectGradient("dinp", inp, dinp, objective);
  ExpectGradient("dweight", weight, dweight, objective);
  if (with_bias) {
    ExpectGradient("dbias", bias, dbias, objective);
  } else {
    for (double v : dbias) EXPECT_EQ(v, kPrefill);
  }
}

TEST(CpuKernelsTest, MatmulBackwardMatchesFiniteDifferences) {
  CheckMatmulGradients(kN, kC, 3 * kC, true, 4);
  CheckMatmulGradients(kN, kC, 12, false, 5);
  CheckMatmulGradients(3, 5, 7, true, 6);  // every tile ragged
}

// The tiled matmul against a plain triple loop on shapes that cross every
// blocking boundary (row and column blocks of 64, reduction slabs of 256,
// register tiles of 4 x 16 / 4 x 8 / 8 x 32) with ragged remainders. Sums of ~300
// products of values in [-1, 1] in float: tolerance 1e-4 absolute.
template <typename T>
void CheckMatmulAgainstNaive(int64_t N, int C, int OC, double tol) {
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
  std::mt19937_64 rng(N * 1000003 + C * 1009 + OC);
  std::vector<double> inp = Random(N * C, rng), weight = Random(int64_t{OC} * C, rng), bias = Random(OC, rng);
  std::vector<double> dout = Random(N * OC, rng);
  std::vector<T> tin(inp.begin(), inp.end()), tw(weight.begin(), weight.end()), tb(bias.begin(), bias.end());
  std::vector<T> tdout(dout.begin(), dout.end()), tout(N * OC);
  MatmulForward(tout.data(), tin.data(), tw.data(), tb.data(), N, C, OC);
  std::vector<T> tdinp(N * C, T(1)), tdw(int64_t{OC} * C, T(1)), tdb(OC, T(1));
  MatmulBackward(tdinp.data(), tdw.data(), tdb.data(), tdout.data(), tin.data(), tw.data(), N, C, OC);
  int bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double r = bias[o];
      for (int c = 0; c < C; ++c) r += inp[n * C + c] * weight[int64_t{o} * C + c];
      if (std::fabs(r - tout[n * OC + o]) > tol && bad++ < 5) ADD_FAILURE() << "out " << n << "," << o;
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double r = 1;
      for (int o = 0; o < OC; ++o) r += dout[n * OC + o] * weight[int64_t{o} * C + c];
      if (std::fabs(r - tdinp[n * C + c]) > tol && bad++ < 5) ADD_FAILURE() << "dinp " << n << "," << c;
    }
  }
  for (int o = 0; o < OC; ++o) {
    double rb = 1;
    for (int64_t n = 0; n < N; ++n) rb += dout[n * OC + o];
    if (std::fabs(rb - tdb[o]) > tol && bad++ < 5) ADD_FAILURE() << "dbias " << o;
    for (int c = 0; c < C; ++c) {
      double r = 1;
      for (int64_t n = 0; n < N; ++n) r += dout[n * OC + o] * inp[n * C + c];
      if (std::fabs(r - tdw[int64_t{o} * C + c]) > tol && bad++ < 5) ADD_FAILURE() << "dweight " << o << "," << c;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(CpuKernelsTest, MatmulMatchesNaiveAcrossBlockBoundaries) {
  for (auto [N, C, OC] : {std::tuple<int64_t, int, int>{1, 1, 1},
                          {70, 33, 130},
                          {129, 300, 67},
                          {257, 64, 16},
                          {64, 257, 64},
                          {5, 520, 3}}) {
    CheckMatmulAgainstNaive<double>(N, C, OC, 1e-10);
    CheckMatmulAgainstNaive<float>(N, C, OC, 1e-4);
  }
}

TEST(CpuKernelsTest, AttentionBackwardMatchesFiniteDifferences) {
  for (const float softcap : {0.0f, 0.6f}) {  // none, and a cap inside the scores' range
    SCOPED_TRACE("softcap " + std::to_string(softcap));
    std::mt19937_64 rng(7);
    std::vector<double> qkv = Random(kN * 3 * kC, rng, 1.5), w = Random(kN * kC, rng);
    std::vector<double> out(kN * kC), att(kB * kNH * kT * kT), scratch(att.size());
    auto objective = [&] {
      AttentionForward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH, 0, softcap);
      return Dot(out, w);
    };
    objective();
    std::vector<double> dqkv = Filled(qkv.size());
    AttentionBackward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), kB, kT, kC, kNH, 0, softcap);
    ExpectGradient("dqkv", qkv, dqkv, objective);
  }
}

// The softcap: cap * tanh(x / cap) (float within a few ulp of the cap of
// std::tanh, odd, +-cap far out), and its backward against finite
// differences of the forward.
TEST(CpuKernelsTest, SoftcapForwardAndBackward) {
  std::mt19937_64 rng(21);
  std::vector<double> x = Random(1000, rng, 80.0);
  x[0] = 0.0, x[1] = 1e-6, x[2] = -1e-6, x[3] = 500.0, x[4] = -500.0;
  const double cap = 30.0;
  std::vector<float> xf(x.begin(), x.end());
  SoftcapForward(xf.data(), static_cast<float>(cap), static_cast<int64_t>(xf.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = cap * std::tanh(static_cast<double>(static_cast<float>(x[i])) / cap);
    ASSERT_NEAR(xf[i], want, 4e-7 * cap) << "x " << x[i];
  }
  EXPECT_EQ(xf[0], 0.0f);
  EXPECT_EQ(xf[3], 30.0f);
  EXPECT_EQ(xf[4], -30.0f);
  EXPECT_NEAR(xf[1], 1e-6f, 1e-5f);  // absolute: the float form's error is the cap's ulp, not x's
  const std::vector<double> w = Random(x.size(), rng);
  std::vector<double> y = x;
  auto objective = [&] {
    y = x;
    SoftcapForward(y.data(), cap, static_cast<int64_t>(y.size()));
    return Dot(y, w);
  };
  objective();
  std::vector<double> dx = w;  // in place (not accumulated): ExpectGradient reads a prefilled gradient
  SoftcapBackward(dx.data(), y.data(), cap, static_cast<int64_t>(dx.size()));
  for (double& d : dx) d += test_support::kPrefill;
  ExpectGradient("dx", x, dx, objective);
}

TEST(CpuKernelsTest, AttentionIsCausal) {
  std::mt19937_64 rng(8);
  std::vector<double> qkv = Random(kN * 3 * kC, rng, 1.5);
  std::vector<double> out(kN * kC), att(kB * kNH * kT * kT);
  AttentionForward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH, 0, 0.0f);
  for (int bh = 0; bh < kB * kNH; ++bh) {
    for (int t = 0; t < kT; ++t) {
      double sum = 0;
      for (int t2 = 0; t2 < kT; ++t2) {
        const double a = att[(static_cast<int64_t>(bh) * kT + t) * kT + t2];
        if (t2 > t) {
          EXPECT_EQ(a, 0.0) << "bh " << bh << " t " << t << " key " << t2;
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  // Changing q, k and v of the last position of batch 0 leaves every earlier
  // position's output unchanged (bit for bit) and changes the last one.
  std::vector<double> qkv2 = qkv, out2(out.size()), att2(att.size());
  for (int i = 0; i < 3 * kC; ++i) qkv2[(kT - 1) * 3 * kC + i] += 0.5;
  AttentionForward(out2.data(), att2.data(), qkv2.data(), kB, kT, kC, kNH, 0, 0.0f);
  for (int t = 0; t < kT - 1; ++t) {
    for (int c = 0; c < kC; ++c) EXPECT_EQ(out[t * kC + c], out2[t * kC + c]) << "t " << t;
  }
  double diff = 0;
  for (int c = 0; c < kC; ++c) diff += std::fabs(out[(kT - 1) * kC + c] - out2[(kT - 1) * kC + c]);
  EXPECT_GT(diff, 0.0);
  // Batch 1 is untouched.
  for (int64_t i = kT * kC; i < kN * kC; ++i) EXPECT_EQ(out[i], out2[i]);
}

TEST(CpuKernelsTest, GeluBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(9);
  std::vector<double> inp = Random(64, rng, 4.0), w = Random(64, rng), out(64);
  auto objective = [&] {
    GeluForward(out.data(), inp.data(), 64);
    return Dot(out, w);
  };
  std::vector<double> dinp = Filled(64);
  GeluBackward(dinp.data(), inp.data(), w.data(), 64);
  ExpectGradient("dinp", inp, dinp, objective);
  // Spot values of the tanh approximation.
  double x[3] = {0.0, 1.0, -3.0}, y[3];
  GeluForward(y, x, 3);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.8411919906, 1e-9);
  EXPECT_NEAR(y[2], -0.0036373920817, 1e-9);
}

// The float GELU computes its gate from its own exp (vectorized), not
// tanhf: within 2e-7 of the double kernel relative to max(1, |x|) in the
// forward and 1e-6 in the backward over [-12, 12], exact zeros far left,
// and the same bits for an element whatever its position (vector lanes or
// the scalar remainder) and the thread count (n is large enough to run
// threaded).
TEST(CpuKernelsTest, FloatGeluFollowsTheDoubleOneAndDependsOnlyOnItsInput) {
  const int64_t n = 200'003;
  std::vector<float> x(n), dout(n, 1.0f);
  std::vector<double> xd(n), dd(n, 1.0);
  for (int64_t i = 0; i < n; ++i) xd[i] = x[i] = -12.0f + 24.0f * static_cast<float>(i) / (n - 1);
  std::vector<float> y(n), dx(n, 0.0f);
  std::vector<double> yd(n), dxd(n, 0.0);
  GeluForward(y.data(), x.data(), n);
  GeluBackward(dx.data(), x.data(), dout.data(), n);
  GeluForward(yd.data(), xd.data(), n);
  GeluBackward(dxd.data(), xd.data(), dd.data(), n);
  double worst_y = 0, worst_dx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double scale = std::max(1.0, std::fabs(xd[i]));
    worst_y = std::max(worst_y, std::fabs(y[i] - yd[i]) / scale);
    worst_dx = std::max(worst_dx, std::fabs(dx[i] - dxd[i]) / scale);
  }
  EXPECT_LT(worst_y, 2e-7);
  EXPECT_LT(worst_dx, 1e-6);
  EXPECT_EQ(y[0], 0.0f);  // x = -12: the gate is past the exp's range
  EXPECT_EQ(dx[0], 0.0f);
  EXPECT_EQ(y[n - 1], x[n - 1]);
  // Shifted by one element (other lanes), one at a time, one thread.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int64_t i = 1; i < n; i += 9'973) {
    float one, d1 = 0.0f;
    GeluForward(&one, &x[i], 1);
    GeluBackward(&d1, &x[i], &dout[i], 1);
    EXPECT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(y[i])) << "x " << x[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(d1), std::bit_cast<uint32_t>(dx[i])) << "x " << x[i];
  }
  std::vector<float> y1(n - 3);
  GeluForward(y1.data(), x.data() + 3, n - 3);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(y1.data(), y.data() + 3, y1.size() * sizeof(float)), 0);
}

// RoundTo16 is the GPU's 16-bit operand rounding (cuda_kernels.h,
// CastTo16) widened back: to nearest, ties to even, as core/half.h; values
// already 16-bit stay as they are.
TEST(CpuKernelsTest, RoundTo16RoundsToNearestEvenAndKeeps16BitValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-300.0f, 300.0f);
  std::vector<float> x(5000);
  for (float& v : x) v = dist(rng);
  x.insert(x.end(), {1.00390625f, 1.01171875f, 65520.0f, 70000.0f, 1e-7f, -0.0f});
  for (ElementType type : {ElementType::kBf16, ElementType::kF16}) {
    std::vector<float> r = x;
    RoundTo16(r.data(), static_cast<int64_t>(r.size()), type);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = type == ElementType::kBf16 ? Bf16ToFloat(FloatToBf16(x[i])) : HalfToFloat(FloatToHalf(x[i]));
      ASSERT_EQ(std::bit_cast<uint32_t>(r[i]), std::bit_cast<uint32_t>(want)) << "element " << i << " = " << x[i];
    }
    std::vector<float> again = r;
    RoundTo16(again.data(), static_cast<int64_t>(again.size()), type);
    EXPECT_EQ(std::memcmp(again.data(), r.data(), r.size() * sizeof(float)), 0) << "rounding twice changes nothing";
  }
  // Ties: 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7 (to
  // even: 1); 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (to even:
  // 1 + 2^-6). fp16 overflows at 65520.
  std::vector<float> ties = {1.00390625f, 1.01171875f};
  RoundTo16(ties.data(), 2, ElementType::kBf16);
  EXPECT_EQ(ties[0], 1.0f);
  EXPECT_EQ(ties[1], 1.015625f);
  float big = 65520.0f;
  RoundTo16(&big, 1, ElementType::kF16);
  EXPECT_TRUE(std::isinf(big));
}

TEST(CpuKernelsTest, ResidualAndAccumulate) {
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, out(3);
  ResidualForward(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33}));
  ResidualForward(a.data(), a.data(), b.data(), 3);  // out may alias an input
  EXPECT_EQ(a, (std::vector<double>{11, 22, 33}));
  Accumulate(a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<double>{21, 42, 63}));
}

TEST(CpuKernelsTest, CrossEntropyMatchesFiniteDifferencesAndLeavesPadding) {
  std::mt19937_64 rng(10);
  const int V = 11, Vp = 16;
  const double dloss = 0.37;
  std::vector<double> logits = Random(kN * Vp, rng, 3.0), losses(kN);
  std::vector<int32_t> targets(kN);
  for (int64_t n = 0; n < kN; ++n) targets[n] = static_cast<int32_t>((n * 7 + 3) % V);
  auto objective = [&] {
    CrossEntropyForwardBackward<double>(losses.data(), nullptr, logits.data(), targets.data(), kN, V, Vp, 0.0);
    double s = 0;
    for (double l : losses) s += l;
    return s * dloss;
  };
  // Sentinels in the padding columns must survive.
  const double kSentinel = -12345.0;
  std::vector<double> dlogits = Filled(logits.size());
  for (int64_t n = 0; n < kN; ++n)
    for (int v = V; v < Vp; ++v) dlogits[n * Vp + v] = kSentinel;
  std::vector<double> losses_with_grad(kN);
  CrossEntropyForwardBackward<double>(losses_with_grad.data(), dlogits.data(), logits.data(), targets.data(), kN, V, Vp,
                                      dloss);
  objective();
  EXPECT_EQ(losses, losses_with_grad);
  for (int64_t n = 0; n < kN; ++n) {
    for (int v = V; v < Vp; ++v) {
      EXPECT_EQ(dlogits[n * Vp + v], kSentinel);
      dlogits[n * Vp + v] = kPrefill;  // the loss does not depend on padding: numeric gradient 0
    }
  }
  ExpectGradient("dlogits", logits, dlogits, objective);
  // The loss against a direct log-softmax.
  for (int64_t n = 0; n < kN; ++n) {
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * Vp + v]);
    EXPECT_NEAR(losses[n], std::log(z) - logits[n * Vp + targets[n]], 1e-12);
  }
}

// The float kernels against the double reference on the same inputs.
TEST(CpuKernelsTest, FloatForwardAgreesWithDouble) {
  std::mt19937_64 rng(11);
  const int V = 13, Vp = 64;
  std::vector<int32_t> tokens(kN);
  for (int64_t n = 0; n < kN; ++n) tokens[n] = static_cast<int32_t>((n * 5) % V);
  std::vector<double> wte = Random(Vp * kC, rng), wpe = Random(kT * kC, rng);
  std::vector<double> lw = Random(kC, rng), lb = Random(kC, rng), mw = Random(3 * kC * kC, rng);
  std::vector<double> mb = Random(3 * kC, rng), logits = Random(kN * Vp, rng, 4.0);
  // Chain encoder -> layernorm -> matmul -> attention -> gelu in both types.
  auto run = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> twte(wte.begin(), wte.end()), twpe(wpe.begin(), wpe.end()), tlw(lw.begin(), lw.end()),
        tlb(lb.begin(), lb.end()), tmw(mw.begin(), mw.end()), tmb(mb.begin(), mb.end()),
        tlogits(logits.begin(), logits.end());
    std::vector<T> x(kN * kC), ln(kN * kC), mean(kN), rstd(kN), qkv(kN * 3 * kC), att(kB * kNH * kT * kT), y(kN * kC),
        g(kN * kC), losses(kN);
    EncoderForward(x.data(), tokens.data(), twte.data(), twpe.data(), kB, kT, kC);
    LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), tlw.data(), tlb.data(), kN, kC);
    MatmulForward(qkv.data(), ln.data(), tmw.data(), tmb.data(), kN, kC, 3 * kC);
    AttentionForward(y.data(), att.data(), qkv.data(), kB, kT, kC, kNH, 0, 0.0f);
    GeluForward(g.data(), y.data(), kN * kC);
    CrossEntropyForwardBackward<T>(losses.data(), nullptr, tlogits.data(), tokens.data(), kN, V, Vp, T(0));
    std::vector<double> result(g.begin(), g.end());
    result.insert(result.end(), losses.begin(), losses.end());
    return result;
  };
  std::vector<double> d = run(0.0), f = run(0.0f);
  ASSERT_EQ(d.size(), f.size());
  for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(f[i], d[i], 2e-5 * (1 + std::fabs(d[i]))) << i;
}

TEST(CpuKernelsTest, CastInBf16) {
  // bf16 is the top half of a float.
  const uint16_t bits[] = {0x3f80, 0xc000, 0x0000, 0x8000, 0x7f80, 0xff80, 0x3eaa, 0x0001};
  const float expect[] = {1.0f,     -2.0f,     0.0f,        -0.0f,
                          INFINITY, -INFINITY, 0.33203125f, std::bit_cast<float>(uint32_t{0x00010000})};
  std::vector<float> out(8);
  CastIn(out.data(), bits, ElementType::kBf16, 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(expect[i])) << i;
  }
  const uint16_t nan_bits = 0x7fc0;
  float nan_out = 0;
  CastIn(&nan_out, &nan_bits, ElementType::kBf16, 1);
  EXPECT_TRUE(std::isnan(nan_out));
}

// CastOut undoes CastIn for every non-NaN 16-bit pattern, on enough
// elements for the threads and into a destination off its type's
// alignment; halfway values round to even; NaNs stay NaNs.
TEST(CpuKernelsTest, CastOutRoundTripsEveryValueAndRoundsToEven) {
  for (ElementType type : {ElementType::kBf16, ElementType::kF16}) {
    SCOPED_TRACE(ElementTypeName(type));
    const int64_t n = (int64_t{1} << 17) + 3;
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 65536);
    std::vector<float> values(static_cast<size_t>(n));
    CastIn(values.data(), bits.data(), type, n);
    std::vector<std::byte> out(static_cast<size_t>(2 * n + 1));
    CastOut(out.data() + 1, type, values.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t back;
      std::memcpy(&back, out.data() + 1 + 2 * i, 2);
      if (std::isnan(values[static_cast<size_t>(i)])) {
        float again;
        CastIn(&again, &back, type, 1);
        ASSERT_TRUE(std::isnan(again)) << i;
      } else {
        ASSERT_EQ(back, bits[static_cast<size_t>(i)]) << i;
      }
    }
  }
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is halfway between 1 (even) and
  // 1 + 2^-7; 1 + 3 * 2^-8 between 1 + 2^-7 and 1 + 2^-6 (even).
  const float halfway[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f)};
  uint16_t got[3];
  CastOut(got, ElementType::kBf16, halfway, 3);
  EXPECT_EQ(got[0], 0x3f80);
  EXPECT_EQ(got[1], 0x3f82);
  EXPECT_EQ(got[2], 0xbf80);
  // F32 is a copy.
  float copy[3];
  CastOut(copy, ElementType::kF32, halfway, 3);
  EXPECT_EQ(std::memcmp(copy, halfway, sizeof(copy)), 0);
}

TEST(CpuKernelsTest, CastInF16EveryValue) {
  // Every one of the 65536 half patterns against the definition of
  // binary16, evaluated independently in double.
  std::vector<uint16_t> bits(65536);
  for (int i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  std::vector<double> outd(65536);
  CastIn(out.data(), bits.data(), ElementType::kF16, 65536);
  CastIn(outd.data(), bits.data(), ElementType::kF16, 65536);
  for (int i = 0; i < 65536; ++i) {
    const int sign = i >> 15, exp = (i >> 10) & 31, mant = i & 1023;
    double v;
    if (exp == 31) {
      if (mant != 0) {
        EXPECT_TRUE(std::isnan(out[i])) << i;
        EXPECT_TRUE(std::isnan(outd[i])) << i;
        continue;
      }
      v = std::numeric_limits<double>::infinity();
    } else if (exp == 0) {
      v = std::ldexp(static_cast<double>(mant), -24);
    } else {
      v = std::ldexp(1.0 + mant / 1024.0, exp - 15);
    }
    if (sign) v = -v;
    ASSERT_EQ(static_cast<double>(out[i]), v) << "bits " << i;
    ASSERT_EQ(outd[i], v) << "bits " << i;
    ASSERT_EQ(std::signbit(out[i]), sign == 1) << "bits " << i;
  }
  EXPECT_EQ(out[0x3c00], 1.0f);
  EXPECT_EQ(out[0x7bff], 65504.0f);
  EXPECT_EQ(out[0x0001], std::ldexp(1.0f, -24));
}

TEST(CpuKernelsTest, CastInF32AndF64) {
  const float f[3] = {1.5f, -0.1f, 3e38f};
  std::vector<double> d(3);
  CastIn(d.data(), f, ElementType::kF32, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(d[i], static_cast<double>(f[i]));
  const double src[3] = {0.1, -2.5, 1e-3};
  std::vector<float> g(3);
  CastIn(g.data(), src, ElementType::kF64, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g[i], static_cast<float>(src[i]));
  // Large enough to take the parallel path.
  std::vector<float> big(300000), back(300000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  CastIn(back.data(), big.data(), ElementType::kF32, static_cast<int64_t>(big.size()));
  EXPECT_EQ(big, back);
}

// A source at any byte (a safetensors payload's offsets promise no
// alignment) reads as the same values aligned, for every type, on the
// threads' path too. x86 loads misaligned words anyway: the test bites
// under UBSan (make test-asan), whose alignment check a typed load fails.
TEST(CpuKernelsTest, CastInReadsUnalignedSources) {
  const int64_t n = 300001;
  std::mt19937_64 rng(7);
  for (ElementType type : {ElementType::kF32, ElementType::kF64, ElementType::kBf16, ElementType::kF16}) {
    SCOPED_TRACE(ElementTypeName(type));
    const size_t bytes = static_cast<size_t>(n * ElementSizeBytes(type));
    std::vector<uint64_t> aligned((bytes + 7) / 8);
    for (uint64_t& w : aligned) w = rng() & 0x3fff3fff3fff3fffULL;  // no NaN or Inf patterns
    std::vector<std::byte> shifted(bytes + 3);
    std::memcpy(shifted.data() + 3, aligned.data(), bytes);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    CastIn(want.data(), aligned.data(), type, n);
    CastIn(got.data(), shifted.data() + 3, type, n);
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  }
}

// TransposeCast against the definition, element by element: shapes off
// the tile size, a range of the transpose's rows, 16-bit types on either
// side (values exact in each), sources and destinations at odd bytes, and
// enough elements for the threads.
TEST(CpuKernelsTest, TransposeCastIsTheTransposeInAnyTypes) {
  struct Case {
    int64_t rows, cols, col0, col1;
    ElementType from, to;
  };
  const Case cases[] = {{1, 1, 0, 1, ElementType::kF32, ElementType::kF32},
                        {3, 130, 5, 129, ElementType::kBf16, ElementType::kF32},
                        {130, 3, 1, 3, ElementType::kF32, ElementType::kF16},
                        {700, 513, 0, 513, ElementType::kF16, ElementType::kBf16},
                        {64, 64, 63, 64, ElementType::kF32, ElementType::kBf16}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.rows) + "x" + std::to_string(k.cols) + " cols " + std::to_string(k.col0) + ".." +
                 std::to_string(k.col1));
    const int64_t n = k.rows * k.cols, m = (k.col1 - k.col0) * k.rows;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 251 - 125) * 0.25f;
    const int64_t from = ElementSizeBytes(k.from), to = ElementSizeBytes(k.to);
    std::vector<std::byte> src(static_cast<size_t>(n * from + 1)), dst(static_cast<size_t>(m * to + 1));
    CastOut(src.data() + 1, k.from, values.data(), n);
    TransposeCast(dst.data() + 1, k.to, src.data() + 1, k.from, k.rows, k.cols, k.col0, k.col1);
    std::vector<float> got(static_cast<size_t>(m));
    CastIn(got.data(), dst.data() + 1, k.to, m);
    for (int64_t c = k.col0; c < k.col1; ++c) {
      for (int64_t r = 0; r < k.rows; ++r) {
        ASSERT_EQ(got[static_cast<size_t>((c - k.col0) * k.rows + r)], values[static_cast<size_t>(r * k.cols + c)])
            << "row " << r << " col " << c;
      }
    }
  }
}

std::vector<float> RandomFloats(std::mt19937_64& rng, int64_t n) {
  const std::vector<double> d = Random(n, rng);
  return std::vector<float>(d.begin(), d.end());
}

// `start` plus the slabs of 256 reduction steps of sum_k a(k) * b(k), each
// slab one FMA chain from zero in reduction order: the float matmul's sum.
template <typename A, typename B>
float SlabChains(float start, int64_t K, A a, B b) {
  for (int64_t k0 = 0; k0 < K; k0 += 256) {
    float chain = 0.0f;
    for (int64_t k = k0; k < std::min<int64_t>(K, k0 + 256); ++k) chain = std::fma(a(k), b(k), chain);
    start += chain;
  }
  return start;
}

// Counts `got` != `want` bit for bit in *bad, reporting the first five
// (`what` row, col).
void CheckBits(float got, float want, const char* what, int64_t row, int64_t col, int64_t* bad) {
  if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got) && (*bad)++ < 5) {
    ADD_FAILURE() << what << " " << row << "," << col << ": " << got << " != " << want;
  }
}

bool HaveFma() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The float matmul's summation order, which every ISA path keeps (so the
// AVX2 and AVX-512 tiles give the same bits): each output starts from its
// bias, and each slab of 256 reduction steps is one FMA chain from zero, in
// reduction order, added to the output. Checked bit for bit on a shape with
// three slabs (the last one short) and ragged tiles. Needs hardware FMA:
// the portable path rounds each product.
TEST(CpuKernelsTest, FloatMatmulSumsOneFmaChainPerSlab) {
  if (!HaveFma()) GTEST_SKIP() << "the FMA paths need x86-64 with AVX2+FMA";
  std::mt19937_64 rng(21);
  const int64_t N = 70;
  const int C = 600, OC = 130;
  const std::vector<float> inp = RandomFloats(rng, N * C), w = RandomFloats(rng, int64_t{OC} * C),
                           bias = RandomFloats(rng, OC);
  std::vector<float> out(N * OC);
  MatmulForward<float>(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  int64_t bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      const float want = SlabChains(
          bias[o], C, [&](int64_t k) { return inp[n * C + k]; }, [&](int64_t k) { return w[int64_t{o} * C + k]; });
      CheckBits(out[n * OC + o], want, "out", n, o, &bad);
    }
  }
  EXPECT_EQ(bad, 0);
}

// The same order for the weight gradient, dweight += dout^T inp, whose
// reduction runs over the tokens: several row blocks of dout^T (packed
// once per slab and shared by the threads) and column panels of inp, two
// slabs of tokens, ragged tiles.
TEST(CpuKernelsTest, FloatWeightGradientSumsOneFmaChainPerSlab) {
  if (!HaveFma()) GTEST_SKIP() << "the FMA paths need x86-64 with AVX2+FMA";
  std::mt19937_64 rng(22);
  const int64_t N = 300;
  const int C = 70, OC = 130;
  const std::vector<float> inp = RandomFloats(rng, N * C), w = RandomFloats(rng, int64_t{OC} * C),
                           dout = RandomFloats(rng, N * OC), start = RandomFloats(rng, int64_t{OC} * C);
  std::vector<float> dinp(N * C), dweight = start;
  MatmulBackward<float>(dinp.data(), dweight.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  int64_t bad = 0;
  for (int o = 0; o < OC; ++o) {
    for (int c = 0; c < C; ++c) {
      const int64_t i = int64_t{o} * C + c;
      const float want = SlabChains(
          start[i], N, [&](int64_t n) { return dout[n * OC + o]; }, [&](int64_t n) { return inp[n * C + c]; });
      CheckBits(dweight[i], want, "dweight", o, c, &bad);
    }
  }
  EXPECT_EQ(bad, 0);
}

// A 16-bit weight read as it is (MatmulForward16 / MatmulBackward16) gives
// the bits of casting it to float first and calling the float matmuls: for
// bf16 and f16, both pack paths (the forward's transposed weight and the
// backward's plain one), ragged tiles and two slabs, threaded.
TEST(CpuKernelsTest, Matmul16ReadsTheWeightAsItsFloatCast) {
  std::mt19937_64 rng(34);
  const int64_t N = 67;
  const int C = 300, OC = 270;
  const std::vector<float> inp = RandomFloats(rng, N * C), bias = RandomFloats(rng, OC),
                           dout = RandomFloats(rng, N * OC), w32 = RandomFloats(rng, int64_t{OC} * C);
  for (ElementType type : {ElementType::kBf16, ElementType::kF16}) {
    SCOPED_TRACE(type == ElementType::kBf16 ? "bf16" : "f16");
    std::vector<uint16_t> w16(w32.size());
    for (size_t i = 0; i < w32.size(); ++i) {
      w16[i] = type == ElementType::kBf16 ? FloatToBf16(w32[i]) : FloatToHalf(w32[i]);
    }
    std::vector<float> w(w32.size());
    CastIn<float>(w.data(), w16.data(), type, static_cast<int64_t>(w.size()));
    std::vector<float> out(N * OC), out16(N * OC);
    MatmulForward<float>(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    MatmulForward16(out16.data(), inp.data(), w16.data(), type, bias.data(), N, C, OC);
    EXPECT_EQ(std::memcmp(out.data(), out16.data(), out.size() * sizeof(float)), 0) << "forward";
    // Gradients start from a prefill: the backward accumulates.
    std::vector<float> dinp(N * C, 0.25f), dw(w.size(), -0.5f), db(OC, 1.0f);
    std::vector<float> dinp16 = dinp, dw16 = dw, db16 = db;
    MatmulBackward<float>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    MatmulBackward16(dinp16.data(), dw16.data(), db16.data(), dout.data(), inp.data(), w16.data(), type, N, C, OC);
    EXPECT_EQ(std::memcmp(dinp.data(), dinp16.data(), dinp.size() * sizeof(float)), 0) << "dinp";
    EXPECT_EQ(std::memcmp(dw.data(), dw16.data(), dw.size() * sizeof(float)), 0) << "dweight";
    EXPECT_EQ(std::memcmp(db.data(), db16.data(), db.size() * sizeof(float)), 0) << "dbias";
    // The weight's values matter (not a copy of the float path's result).
    w16[0] ^= 0x4000;
    MatmulForward16(out16.data(), inp.data(), w16.data(), type, bias.data(), N, C, OC);
    EXPECT_NE(out[0], out16[0]);
  }
}

// GradMode::kSet writes the weight's and the bias's gradients whole, over
// NaN, with the bits of adding into zeros, dinp still accumulating; one
// slab of the reduction and several (N > 256 positions: the later slabs
// add to what the first stored), with one column block and with several
// (the A slab packed once and shared), and none (N = 0: the gradients are
// zero). Float, double and 16-bit weights, on this machine's SIMD path.
TEST(CpuKernelsTest, MatmulBackwardSetsTheWeightGradients) {
  std::mt19937_64 rng(35);
  for (auto [N, C, OC] : {std::tuple<int64_t, int, int>{67, 300, 70}, {600, 45, 130}, {300, 100, 70}, {0, 20, 9}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C) + " OC " + std::to_string(OC));
    const std::vector<float> inp = RandomFloats(rng, N * C), dout = RandomFloats(rng, N * OC),
                             w = RandomFloats(rng, int64_t{OC} * C);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBf16(w[i]);
    auto same = [](const auto& a, const auto& b) {
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0;
      return differ;
    };
    auto run = [&](auto zero, bool sixteen) {
      using T = decltype(zero);
      const std::vector<T> tin(inp.begin(), inp.end()), tdout(dout.begin(), dout.end()), tw(w.begin(), w.end());
      std::vector<T> dinp_add(N * C, T(0.5)), dw_add(tw.size(), T(0)), db_add(OC, T(0));
      std::vector<T> dinp_set = dinp_add, dw_set(tw.size(), std::numeric_limits<T>::quiet_NaN()),
                     db_set(OC, std::numeric_limits<T>::quiet_NaN());
      if constexpr (std::is_same_v<T, float>) {
        if (sixteen) {
          MatmulBackward16(dinp_add.data(), dw_add.data(), db_add.data(), tdout.data(), tin.data(), w16.data(),
                           ElementType::kBf16, N, C, OC);
          MatmulBackward16(dinp_set.data(), dw_set.data(), db_set.data(), tdout.data(), tin.data(), w16.data(),
                           ElementType::kBf16, N, C, OC, GradMode::kSet);
        }
      }
      if (!sixteen) {
        MatmulBackward<T>(dinp_add.data(), dw_add.data(), db_add.data(), tdout.data(), tin.data(), tw.data(), N, C, OC);
        MatmulBackward<T>(dinp_set.data(), dw_set.data(), db_set.data(), tdout.data(), tin.data(), tw.data(), N, C, OC,
                          GradMode::kSet);
      }
      EXPECT_EQ(same(dinp_add, dinp_set), 0u) << "dinp";
      EXPECT_EQ(same(dw_add, dw_set), 0u) << "dweight";
      EXPECT_EQ(same(db_add, db_set), 0u) << "dbias";
    };
    run(0.0f, false);
    run(0.0, false);
    run(0.0f, true);
  }
}

// Big enough to run threaded; the same bits with one thread and with many.
TEST(CpuKernelsTest, ResultsDoNotDependOnThreadCount) {
  std::mt19937_64 rng(12);
  const int64_t N = 300;
  const int C = 200, OC = 330;
  const std::vector<float> inp = RandomFloats(rng, N * C), w = RandomFloats(rng, int64_t{OC} * C);
  const std::vector<float> dout = RandomFloats(rng, N * OC);
  auto run = [&] {
    std::vector<float> out(N * OC), dinp(N * C), dw(int64_t{OC} * C), db(OC), lout(N * C), mean(N), rstd(N);
    std::vector<float> ldinp(N * C), ldw(C), ldb(C);
    MatmulForward<float>(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
    MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    LayerNormForward(lout.data(), mean.data(), rstd.data(), inp.data(), w.data(), w.data() + C, N, C);
    LayerNormBackward(ldinp.data(), ldw.data(), ldb.data(), dout.data(), inp.data(), w.data(), mean.data(), rstd.data(),
                      N, C);
    return std::vector<std::vector<float>>{out, dinp, dw, db, lout, ldinp, ldw, ldb};
  };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  omp_set_num_threads(std::max(threads, 3));
  const auto many = run();
  omp_set_num_threads(threads);
  EXPECT_TRUE(one == many);
}

// The element-wise kernels vectorized per ISA (GELU, the loss, SwiGLU, GeGLU) give the
// same bits with AVX-512, AVX2 and the baseline ISA: the same operations
// element by element, no contraction, sums in fixed lanes.
TEST(CpuKernelsTest, ElementwiseKernelsGiveTheSameBitsOnEveryIsa) {
  std::mt19937_64 rng(41);
  const int64_t n = 40000;  // chunks and a partial vector at the end
  std::vector<float> x(n), dout(n);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(Random(1, rng, 12.0)[0]);
    dout[i] = static_cast<float>(Random(1, rng)[0]);
  }
  const int N = 7, V = 1003, Vp = 1008;  // V: 62 lanes of 16 and 11 more
  std::vector<float> logits(N * Vp);
  for (float& l : logits) l = static_cast<float>(Random(1, rng, 8.0)[0]);
  const std::vector<int32_t> targets = {0, 5, 1002, 17, 500, 999, 3};
  struct Result {
    std::vector<float> gelu, dgelu, losses, dlogits, swiglu, dgate, dup, geglu, dgate_gelu, dup_gelu;
  };
  auto run = [&](Isa isa) {
    const Isa before = LimitIsa(isa);
    Result r{std::vector<float>(n),        std::vector<float>(n, 0.25f),
             std::vector<float>(N),        std::vector<float>(N * Vp, 0.125f),
             std::vector<float>(n),        std::vector<float>(n, 0.5f),
             std::vector<float>(n, -0.5f), std::vector<float>(n),
             std::vector<float>(n, 0.5f),  std::vector<float>(n, -0.5f)};
    GeluForward(r.gelu.data(), x.data(), n);
    GeluBackward(r.dgelu.data(), x.data(), dout.data(), n);
    CrossEntropyForwardBackward(r.losses.data(), r.dlogits.data(), logits.data(), targets.data(), N, V, Vp, 0.5f);
    GluForward(r.swiglu.data(), x.data(), dout.data(), n, Glu::kSilu);  // gate x, up dout
    GluBackward(r.dgate.data(), r.dup.data(), x.data(), dout.data(), r.swiglu.data(), n, Glu::kSilu);
    GluForward(r.geglu.data(), x.data(), dout.data(), n, Glu::kGeluTanh);
    GluBackward(r.dgate_gelu.data(), r.dup_gelu.data(), x.data(), dout.data(), r.swiglu.data(), n, Glu::kGeluTanh);
    LimitIsa(before);
    return r;
  };
  const Result base = run(Isa::kBaseline);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    SCOPED_TRACE(isa == Isa::kAvx2 ? "avx2" : "avx512");
    const Result r = run(isa);
    EXPECT_EQ(r.gelu, base.gelu);
    EXPECT_EQ(r.dgelu, base.dgelu);
    EXPECT_EQ(r.losses, base.losses);
    EXPECT_EQ(r.dlogits, base.dlogits);
    EXPECT_EQ(r.swiglu, base.swiglu);
    EXPECT_EQ(r.dgate, base.dgate);
    EXPECT_EQ(r.dup, base.dup);
    EXPECT_EQ(r.geglu, base.geglu);
    EXPECT_EQ(r.dgate_gelu, base.dgate_gelu);
    EXPECT_EQ(r.dup_gelu, base.dup_gelu);
  }
  // And the loss against double: the float exps are within a few ulp.
  std::vector<double> want(N), dwant(N * Vp, 0.125);
  const std::vector<double> logits64(logits.begin(), logits.end());
  CrossEntropyForwardBackward(want.data(), dwant.data(), logits64.data(), targets.data(), N, V, Vp, 0.5);
  for (int i = 0; i < N; ++i) EXPECT_NEAR(base.losses[i], want[i], 1e-5 * want[i]) << i;
  for (int i = 0; i < N * Vp; ++i) ASSERT_NEAR(base.dlogits[i], dwant[i], 1e-6) << i;
}

}  // namespace
}  // namespace zinf::kernels::cpu
