// The Llama-family CPU kernels (RMSNorm, RoPE, SwiGLU, the GQA expansion):
// every backward against central finite differences of its forward in
// double (tests/testing/finite_differences.h: objective J = sum w_i out_i,
// step 1e-5, |analytic - numeric| <= 1e-6 (|numeric| + 1e-2); gradients
// prefilled so the accumulate contract is tested too), plus a few exact
// properties.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_kernels.h"
#include "testing/finite_differences.h"

namespace zinf::kernels::cpu {
namespace {

using test_support::Dot;
using test_support::ExpectGradient;
using test_support::Filled;
using test_support::Random;

constexpr int kB = 2, kT = 5, kNH = 4, kNKV = 2, kHd = 6;
constexpr int64_t kN = kB * kT;

TEST(CpuDecoderKernelsTest, RmsNormBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const int C = 12;
  std::vector<double> inp = Random(kN * C, rng, 2.0), weight = Random(C, rng), w = Random(kN * C, rng);
  std::vector<double> out(kN * C), rstd(kN);
  auto objective = [&] {
    RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), kN, C, 1e-5);
    return Dot(out, w);
  };
  objective();
  std::vector<double> dinp = Filled(inp.size()), dweight = Filled(C);
  RmsNormBackward(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), rstd.data(), kN, C);
  ExpectGradient("dinp", inp, dinp, objective);
  ExpectGradient("dweight", weight, dweight, objective);
}

TEST(CpuDecoderKernelsTest, RmsNormForwardHasUnitRootMeanSquare) {
  std::mt19937_64 rng(12);
  const int C = 64;
  std::vector<double> inp = Random(kN * C, rng, 3.0), ones(C, 1.0), out(kN * C), rstd(kN);
  RmsNormForward(out.data(), rstd.data(), inp.data(), ones.data(), kN, C, 0.0);
  for (int64_t n = 0; n < kN; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += out[n * C + c] * out[n * C + c];
    EXPECT_NEAR(ss / C, 1.0, 1e-12);
  }
}

// cos/sin tables of arbitrary angles [T, rot/2].
void Tables(std::mt19937_64& rng, int rot, std::vector<double>& cos, std::vector<double>& sin) {
  const std::vector<double> angle = Random(static_cast<size_t>(kT) * rot / 2, rng, 3.0);
  cos.resize(angle.size());
  sin.resize(angle.size());
  for (size_t i = 0; i < angle.size(); ++i) {
    cos[i] = std::cos(angle[i]);
    sin[i] = std::sin(angle[i]);
  }
}

// Every column of a head rotated (rot = hd), a partial rotary factor (rot 4
// of 6: the last two columns pass), and none (rot 0: a NoPE layer's
// backward passes the gradient through); in both pair layouts.
TEST(CpuDecoderKernelsTest, RopeBackwardMatchesFiniteDifferences) {
  for (bool interleaved : {false, true}) {
    for (int rot : {kHd, 4, 0}) {
      SCOPED_TRACE("rot " + std::to_string(rot) + (interleaved ? " interleaved" : ""));
      std::mt19937_64 rng(13);
      std::vector<double> cos, sin;
      Tables(rng, rot, cos, sin);
      const int64_t width = kNH * kHd;
      std::vector<double> inp = Random(kN * width, rng), w = Random(kN * width, rng), out(kN * width);
      auto objective = [&] {
        RopeForward(out.data(), inp.data(), cos.data(), sin.data(), kB, kT, kNH, kHd, rot, interleaved);
        return Dot(out, w);
      };
      std::vector<double> dinp = Filled(inp.size());
      RopeBackward(dinp.data(), w.data(), cos.data(), sin.data(), kB, kT, kNH, kHd, rot, interleaved);
      ExpectGradient("dinp", inp, dinp, objective);
    }
  }
}

// Pair i is (i, i + rot/2), or (2i, 2i + 1) interleaved.
TEST(CpuDecoderKernelsTest, RopeRotatesPairsInPlace) {
  for (bool interleaved : {false, true}) {
    for (int rot : {kHd, 4}) {
      SCOPED_TRACE("rot " + std::to_string(rot) + (interleaved ? " interleaved" : ""));
      std::mt19937_64 rng(14);
      std::vector<double> cos, sin;
      Tables(rng, rot, cos, sin);
      const int64_t width = kNH * kHd;
      std::vector<double> x = Random(kN * width, rng), out(kN * width), inplace = x;
      RopeForward(out.data(), x.data(), cos.data(), sin.data(), kB, kT, kNH, kHd, rot, interleaved);
      RopeForward(inplace.data(), inplace.data(), cos.data(), sin.data(), kB, kT, kNH, kHd, rot, interleaved);
      EXPECT_EQ(out, inplace);
      // Position t = 3 of batch 1, head 2, pair i = 1 by hand; the columns
      // past rot unchanged.
      const int t = 3, h = 2, i = 1, half = rot / 2;
      const int64_t base = (1 * kT + t) * width + h * kHd;
      const int64_t lo = base + (interleaved ? 2 * i : i), hi = lo + (interleaved ? 1 : half);
      const double c = cos[t * half + i], s = sin[t * half + i];
      EXPECT_DOUBLE_EQ(out[lo], x[lo] * c - x[hi] * s);
      EXPECT_DOUBLE_EQ(out[hi], x[hi] * c + x[lo] * s);
      for (int d = rot; d < kHd; ++d) EXPECT_EQ(out[base + d], x[base + d]) << d;
    }
  }
}

TEST(CpuDecoderKernelsTest, GluBackwardMatchesFiniteDifferences) {
  for (Glu glu : {Glu::kSilu, Glu::kGeluTanh}) {
    SCOPED_TRACE(glu == Glu::kSilu ? "silu" : "gelu_tanh");
    std::mt19937_64 rng(15);
    const int64_t n = 40;
    std::vector<double> gate = Random(n, rng, 4.0), up = Random(n, rng, 2.0), w = Random(n, rng), out(n);
    auto objective = [&] {
      GluForward(out.data(), gate.data(), up.data(), n, glu);
      return Dot(out, w);
    };
    std::vector<double> dgate = Filled(n), dup = Filled(n);
    GluBackward(dgate.data(), dup.data(), gate.data(), up.data(), w.data(), n, glu);
    ExpectGradient("dgate", gate, dgate, objective);
    ExpectGradient("dup", up, dup, objective);
  }
}

// GeGLU is GELU (as GPT-2's MLP computes it) times up, element by element.
TEST(CpuDecoderKernelsTest, GegluIsGeluTimesUp) {
  std::mt19937_64 rng(16);
  const int64_t n = 1000;
  const std::vector<double> g = Random(n, rng, 6.0), up = Random(n, rng, 2.0);
  const std::vector<float> gf(g.begin(), g.end()), upf(up.begin(), up.end());
  std::vector<float> out(n), gelu(n);
  GluForward(out.data(), gf.data(), upf.data(), n, Glu::kGeluTanh);
  GeluForward(gelu.data(), gf.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], gelu[i] * upf[i]) << i;
    const double x = g[i], exact = 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], exact * up[i], 1e-6 * (1 + std::fabs(exact * up[i]))) << i;
  }
}

TEST(CpuDecoderKernelsTest, ScaleMultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.5f, 0.0f, 3.0f};
  Scale(x.data(), 4.0f, 4);
  EXPECT_EQ(x, (std::vector<float>{4.0f, -10.0f, 0.0f, 12.0f}));
}

TEST(CpuDecoderKernelsTest, GqaAttentionBackwardMatchesFiniteDifferences) {
  // The expansion followed by causal multi-head attention: grouped-query
  // attention end to end.
  std::mt19937_64 rng(16);
  const int C = kNH * kHd, Ckv = kNKV * kHd;
  std::vector<double> q = Random(kN * C, rng), k = Random(kN * Ckv, rng), v = Random(kN * Ckv, rng);
  std::vector<double> w = Random(kN * C, rng), qkv(kN * 3 * C), out(kN * C), att(kB * kNH * kT * kT);
  auto objective = [&] {
    GqaExpandForward(qkv.data(), q.data(), k.data(), v.data(), kN, kNH, kNKV, kHd);
    AttentionForward(out.data(), att.data(), qkv.data(), kB, kT, C, kNH, 0, 0.0f);
    return Dot(out, w);
  };
  objective();
  std::vector<double> dqkv(kN * 3 * C, 0.0), scratch(kB * kNH * kT * kT);
  AttentionBackward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), kB, kT, C, kNH, 0, 0.0f);
  std::vector<double> dq = Filled(q.size()), dk = Filled(k.size()), dv = Filled(v.size());
  GqaExpandBackward(dq.data(), dk.data(), dv.data(), dqkv.data(), kN, kNH, kNKV, kHd);
  ExpectGradient("dq", q, dq, objective);
  ExpectGradient("dk", k, dk, objective);
  ExpectGradient("dv", v, dv, objective);
}

TEST(CpuDecoderKernelsTest, GqaExpandSharesKeyValueHeadsByGroup) {
  std::mt19937_64 rng(17);
  const int C = kNH * kHd, Ckv = kNKV * kHd, group = kNH / kNKV;
  std::vector<double> q = Random(kN * C, rng), k = Random(kN * Ckv, rng), v = Random(kN * Ckv, rng);
  std::vector<double> qkv(kN * 3 * C);
  GqaExpandForward(qkv.data(), q.data(), k.data(), v.data(), kN, kNH, kNKV, kHd);
  for (int64_t n = 0; n < kN; ++n) {
    for (int h = 0; h < kNH; ++h) {
      for (int i = 0; i < kHd; ++i) {
        EXPECT_EQ(qkv[n * 3 * C + h * kHd + i], q[n * C + h * kHd + i]);
        EXPECT_EQ(qkv[n * 3 * C + C + h * kHd + i], k[n * Ckv + (h / group) * kHd + i]);
        EXPECT_EQ(qkv[n * 3 * C + 2 * C + h * kHd + i], v[n * Ckv + (h / group) * kHd + i]);
      }
    }
  }
}

TEST(CpuDecoderKernelsTest, FloatAgreesWithDouble) {
  std::mt19937_64 rng(18);
  const int C = 24;
  const std::vector<double> x = Random(kN * C, rng, 2.0), wt = Random(C, rng);
  std::vector<double> out(kN * C), rstd(kN);
  RmsNormForward(out.data(), rstd.data(), x.data(), wt.data(), kN, C, 1e-6);
  std::vector<float> xf(x.begin(), x.end()), wf(wt.begin(), wt.end()), outf(kN * C), rstdf(kN);
  RmsNormForward(outf.data(), rstdf.data(), xf.data(), wf.data(), kN, C, 1e-6);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(outf[i], out[i], 1e-5 * (1 + std::fabs(out[i])));
  std::vector<double> s(kN * C);
  GluForward(s.data(), x.data(), out.data(), kN * C, Glu::kSilu);
  std::vector<float> sf(kN * C);
  GluForward(sf.data(), xf.data(), outf.data(), kN * C, Glu::kSilu);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(sf[i], s[i], 1e-5 * (1 + std::fabs(s[i])));
}

}  // namespace
}  // namespace zinf::kernels::cpu
