// The Llama-family CPU kernels (RMSNorm, RoPE, SwiGLU, the GQA expansion):
// every backward against central finite differences of its forward in
// double (tests/testing/finite_differences.h: objective J = sum w_i out_i,
// step 1e-5, |analytic - numeric| <= 1e-6 (|numeric| + 1e-2); gradients
// prefilled so the accumulate contract is tested too), plus a few exact
// properties.
#include <cmath>
#include <functional>
#include <random>
#include <set>
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

// The clamped SwiGLU's limit of 1.5 clamps some of the gates (up to 4) and
// ups (up to 2) from both sides.
TEST(CpuDecoderKernelsTest, GluBackwardMatchesFiniteDifferences) {
  for (Glu glu : {Glu(Glu::kSilu), Glu(Glu::kGeluTanh), Glu::ClampedSwiglu(1.702f, 1.5f)}) {
    SCOPED_TRACE(static_cast<int>(glu.kind));
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

// GPT-OSS's clamped SwiGLU by hand, at and past its limits: a clamp passes
// the gradient at its limit (torch's clamp) and none past it.
TEST(CpuDecoderKernelsTest, ClampedSwigluByHand) {
  const Glu glu = Glu::ClampedSwiglu(1.702f, 7.0f);
  const std::vector<double> gate = {0.5, 7.0, 9.0, -3.0, 2.0, 1.0};
  const std::vector<double> up = {0.25, -0.5, 3.0, 7.0, -8.0, 7.5};
  const int64_t n = static_cast<int64_t>(gate.size());
  std::vector<double> out(n), dgate(n, 0.0), dup(n, 0.0), ones(n, 1.0);
  GluForward(out.data(), gate.data(), up.data(), n, glu);
  GluBackward(dgate.data(), dup.data(), gate.data(), up.data(), ones.data(), n, glu);
  const double alpha = static_cast<double>(1.702f);
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    const double g = std::min(gate[i], 7.0), u = std::clamp(up[i], -7.0, 7.0);
    const double sig = 1 / (1 + std::exp(-alpha * g));
    EXPECT_NEAR(out[i], (u + 1) * g * sig, 1e-15 * (1 + std::fabs(out[i])));
    const double dact = sig + alpha * g * sig * (1 - sig);
    EXPECT_NEAR(dgate[i], gate[i] <= 7.0 ? (u + 1) * dact : 0.0, 1e-14);
    EXPECT_NEAR(dup[i], std::fabs(up[i]) <= 7.0 ? g * sig : 0.0, 1e-14);
  }
  EXPECT_EQ(dgate[2], 0.0);  // the gate past its limit
  EXPECT_NE(dgate[1], 0.0);  // at it
  EXPECT_EQ(dup[4], 0.0);    // up below -limit
  EXPECT_EQ(dup[5], 0.0);    // and above
  EXPECT_NE(dup[3], 0.0);    // at the limit
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

// Latent attention's joins: a head's columns moved, one set repeated for
// every head; the adjoint adds the heads' copies back into the one set.
TEST(CpuDecoderKernelsTest, CopyHeadColumnsMovesRepeatsAndSumsHeads) {
  const int64_t N = 3;
  const int H = 4, width = 2, shared_ld = 5, heads_ld = 12;
  std::vector<double> shared(N * shared_ld), heads(N * heads_ld, -1.0);
  for (size_t i = 0; i < shared.size(); ++i) shared[i] = static_cast<double>(i);
  // Columns 1 and 2 of each row into columns 0 and 1 of each head of 3.
  CopyHeadColumns(heads.data(), heads_ld, 3, shared.data() + 1, shared_ld, 0, N, H, width, false);
  for (int64_t n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(heads[n * heads_ld + h * 3], shared[n * shared_ld + 1]);
      EXPECT_EQ(heads[n * heads_ld + h * 3 + 1], shared[n * shared_ld + 2]);
      EXPECT_EQ(heads[n * heads_ld + h * 3 + 2], -1.0);  // untouched
    }
  }
  // Each head's two columns summed back onto columns 3 and 4.
  std::vector<double> sum = shared;
  CopyHeadColumns(sum.data() + 3, shared_ld, 0, heads.data(), heads_ld, 3, N, H, width, true);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(sum[n * shared_ld + 3], shared[n * shared_ld + 3] + H * shared[n * shared_ld + 1]);
    EXPECT_EQ(sum[n * shared_ld + 4], shared[n * shared_ld + 4] + H * shared[n * shared_ld + 2]);
    EXPECT_EQ(sum[n * shared_ld], shared[n * shared_ld]);
  }
}

// The routing's adjoint (the experts fixed: finite differences small
// enough not to change them), with and without renormalized weights.
TEST(CpuDecoderKernelsTest, MoeRouteBackwardMatchesFiniteDifferences) {
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "normalized" : "softmax weights");
    std::mt19937_64 rng(21);
    const int E = 6, K = 3;
    std::vector<double> logits = Random(kN * E, rng, 3.0), w = Random(kN * K, rng);
    std::vector<double> weights(kN * K), probs(kN * E);
    std::vector<int32_t> experts(kN * K);
    const MoeRouting r{.E = E, .k = K, .normalize = normalize};
    auto objective = [&] {
      MoeRouteForward(weights.data(), experts.data(), probs.data(), logits.data(), static_cast<const double*>(nullptr),
                      kN, r);
      return Dot(weights, w);
    };
    objective();
    std::vector<double> dlogits = Filled(logits.size());
    MoeRouteBackward(dlogits.data(), w.data(), probs.data(), experts.data(), static_cast<const double*>(nullptr), kN,
                     r);
    ExpectGradient("dlogits", logits, dlogits, objective);
    // With a gradient on every probability too (the load-balancing loss's).
    const std::vector<double> wp = Random(E, rng);
    auto with_probs = [&] {
      double j = objective();
      for (int64_t n = 0; n < kN; ++n) {
        for (int e = 0; e < E; ++e) j += wp[e] * probs[n * E + e];
      }
      return j;
    };
    with_probs();  // probs as the logits are (the check above left its last perturbation's)
    std::vector<double> dlogits2 = Filled(logits.size());
    MoeRouteBackward(dlogits2.data(), w.data(), probs.data(), experts.data(), wp.data(), kN, r);
    ExpectGradient("dlogits with dprobs", logits, dlogits2, with_probs);
  }
}

// Each token's K largest probabilities, descending, ties to the lower
// expert; weights renormalized or not; probabilities may be written over
// the logits.
TEST(CpuDecoderKernelsTest, MoeRouteTakesTheLargestProbabilities) {
  const std::vector<float> logits = {0.0f, 2.0f,  1.0f, 2.0f,  // a tie between experts 1 and 3
                                     3.0f, -1.0f, 0.5f, 0.0f};
  std::vector<float> probs = logits, w(4);
  std::vector<int32_t> ex(4);
  const float* no_bias = nullptr;
  MoeRouteForward(w.data(), ex.data(), probs.data(), probs.data(), no_bias, 2, MoeRouting{.E = 4, .k = 2});
  EXPECT_EQ(ex, (std::vector<int32_t>{1, 3, 0, 2}));
  const double z0 = 1 + 2 * std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(probs[1], std::exp(2.0) / z0, 1e-7);
  EXPECT_NEAR(w[0], std::exp(2.0) / z0, 1e-7);
  EXPECT_EQ(w[0], w[1]);
  std::vector<float> probs2 = logits;
  MoeRouteForward(w.data(), ex.data(), probs2.data(), logits.data(), no_bias, 2,
                  MoeRouting{.E = 4, .k = 2, .normalize = true});
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[2] + w[3], 1.0f);
  EXPECT_NEAR(w[2] / w[3], std::exp(3.0 - 0.5), 1e-5);
}

// The routing's adjoint for `r` against finite differences of the
// weights' dot with a random w, from random logits and a random selection
// bias of `bias_scale`; the experts the unperturbed logits chose.
std::vector<int32_t> ExpectRouteGradient(const MoeRouting& r, uint64_t seed, double bias_scale) {
  std::mt19937_64 rng(seed);
  std::vector<double> logits = Random(kN * r.E, rng, 3.0), w = Random(kN * r.k, rng);
  const std::vector<double> bias = Random(r.E, rng, bias_scale);
  std::vector<double> weights(kN * r.k), probs(kN * r.E);
  std::vector<int32_t> experts(kN * r.k);
  auto objective = [&] {
    MoeRouteForward(weights.data(), experts.data(), probs.data(), logits.data(), bias.data(), kN, r);
    return Dot(weights, w);
  };
  objective();
  const std::vector<int32_t> chosen = experts;
  std::vector<double> dlogits = Filled(logits.size());
  MoeRouteBackward(dlogits.data(), w.data(), probs.data(), experts.data(), static_cast<const double*>(nullptr), kN, r);
  ExpectGradient("dlogits", logits, dlogits, objective);
  return chosen;
}

// The sigmoid router's adjoint (DeepSeek-V3's, GLM-4.5's): weights from
// the scores alone (the bias only chooses), normalized or not, scaled;
// with groups, a token's experts come from its chosen groups only.
TEST(CpuDecoderKernelsTest, SigmoidRouteBackwardMatchesFiniteDifferences) {
  for (const bool normalize : {true, false}) {
    for (const int groups : {1, 3}) {
      SCOPED_TRACE(std::string(normalize ? "normalized" : "scores") + ", groups " + std::to_string(groups));
      const int K = 3;
      const MoeRouting r{.E = 9,
                         .k = K,
                         .normalize = normalize,
                         .scoring = MoeScoring::kSigmoid,
                         .groups = groups,
                         .topk_groups = groups > 1 ? 2 : 1,
                         .scale = 1.5};
      const std::vector<int32_t> experts = ExpectRouteGradient(r, 25, 0.3);
      if (groups > 1) {  // the experts of at most two groups of three
        for (int64_t n = 0; n < kN; ++n) {
          std::set<int> seen;
          for (int j = 0; j < K; ++j) seen.insert(experts[n * K + j] / 3);
          EXPECT_LE(seen.size(), 2u);
        }
      }
    }
  }
}

// The sigmoid router on values worked by hand: the bias moves the choice
// (not the weights), a group's score is its two best choices' sum, the
// groups not taken are out, the weights are normalized and scaled.
TEST(CpuDecoderKernelsTest, SigmoidRouteChoosesByBiasWithinGroups) {
  // Two groups of three experts; sigmoid(0) = 0.5, sigmoid(+-2) = 0.881 / 0.119.
  const std::vector<double> logits = {2.0, -2.0, -2.0, 0.0, 0.0, 0.0};
  const std::vector<double> bias = {0.0, 0.0, 0.0, 0.3, 0.3, -0.9};
  std::vector<double> probs(6), w(2);
  std::vector<int32_t> ex(2);
  const double hi = 1 / (1 + std::exp(-2.0)), lo = 1 - hi;
  // One group: choices 0.881, 0.119, 0.119, 0.8, 0.8, -0.4: experts 0, 3.
  MoeRouting r{.E = 6, .k = 2, .normalize = true, .scoring = MoeScoring::kSigmoid, .scale = 2.0};
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{0, 3}));
  EXPECT_NEAR(probs[1], lo, 1e-15);
  EXPECT_NEAR(w[0], 2.0 * hi / (hi + 0.5 + 1e-20), 1e-15);  // the scores weigh, not the choices
  EXPECT_NEAR(w[1], 2.0 * 0.5 / (hi + 0.5 + 1e-20), 1e-15);
  // Two groups, one taken: group 0 scores 0.881 + 0.119 = 1.0, group 1
  // 0.8 + 0.8 = 1.6: experts 3 and 4 (a tie: the lower first).
  r.groups = 2;
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{3, 4}));
  EXPECT_DOUBLE_EQ(w[0], 1.0);
  EXPECT_DOUBLE_EQ(w[1], 1.0);
  // Unnormalized: each weight is scale * its score.
  r.normalize = false;
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
  EXPECT_DOUBLE_EQ(w[0], 1.0);
}

// DeepSeek-V2's group-limited softmax: a group scores by its best expert
// alone (group_best 1), where V3's sums its two best. Probabilities 0.40,
// 0.05 | 0.30, 0.25: the best alone takes group 0, the two best group 1.
TEST(CpuDecoderKernelsTest, GroupsScoreByTheirBestOrTwoBest) {
  const std::vector<double> logits = {std::log(0.40), std::log(0.05), std::log(0.30), std::log(0.25)};
  std::vector<double> probs(4), w(2);
  std::vector<int32_t> ex(2);
  MoeRouting r{.E = 4, .k = 2, .groups = 2, .topk_groups = 1, .group_best = 1, .scale = 1.5};
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), static_cast<const double*>(nullptr), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(w[0], 1.5 * 0.40, 1e-15);  // the probabilities, not renormalized, times the scale
  EXPECT_NEAR(w[1], 1.5 * 0.05, 1e-15);
  r.group_best = 2;
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), static_cast<const double*>(nullptr), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{2, 3}));
}

// ERNIE 4.5's router: a softmax whose experts are chosen by probability +
// selection bias, normalized by the sum but at least norm_min. The
// adjoint both where the floor is far below the sum (through the sum) and
// where it holds for every token (norm_min 2 > any k probabilities' sum:
// a constant divisor).
TEST(CpuDecoderKernelsTest, SoftmaxRouteWithBiasAndFloorMatchesFiniteDifferences) {
  for (const double norm_min : {1e-12, 2.0}) {
    SCOPED_TRACE("norm_min " + std::to_string(norm_min));
    ExpectRouteGradient(MoeRouting{.E = 7, .k = 3, .normalize = true, .norm_min = norm_min}, 27, 0.2);
  }
}

// The same on values worked by hand: the bias takes an expert of small
// probability, whose weight stays its probability's share; a floor above
// the sum divides by the floor instead.
TEST(CpuDecoderKernelsTest, SoftmaxRouteChoosesByBiasAndFloorsTheSum) {
  const std::vector<double> logits = {1.0, 0.0, -3.0};
  const std::vector<double> bias = {0.0, 0.0, 0.9};
  const double z = std::exp(1.0) + 1 + std::exp(-3.0);
  const double p0 = std::exp(1.0) / z, p2 = std::exp(-3.0) / z;  // 0.72 and 0.0036: choices 0.72, 0.26, 0.90
  std::vector<double> probs(3), w(2);
  std::vector<int32_t> ex(2);
  MoeRouting r{.E = 3, .k = 2, .normalize = true, .norm_min = 1e-12};
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(w[0], p2 / (p0 + p2), 1e-15);
  EXPECT_NEAR(w[1], p0 / (p0 + p2), 1e-15);
  r.norm_min = 1.5;
  MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
  EXPECT_NEAR(w[0], p2 / 1.5, 1e-15);
  EXPECT_NEAR(w[1], p0 / 1.5, 1e-15);
  // A floor equal to the sum: torch.clamp's gradient still goes through
  // the sum there (its mask is sum >= min), as with no floor.
  const std::vector<double> dw = {0.7, -0.4};
  auto dlogits = [&](double norm_min) {
    r.norm_min = norm_min;
    MoeRouteForward(w.data(), ex.data(), probs.data(), logits.data(), bias.data(), 1, r);
    std::vector<double> d(3, 0.0);
    MoeRouteBackward(d.data(), dw.data(), probs.data(), ex.data(), static_cast<const double*>(nullptr), 1, r);
    return d;
  };
  const std::vector<double> free = dlogits(0.0);
  EXPECT_EQ(dlogits(probs[ex[0]] + probs[ex[1]]), free);
  EXPECT_NE(dlogits(1.5), free);
}

// The dispatch: rows grouped by expert, within one by slot; each token's
// rows ascending; offsets bound each expert's; an expert out of range
// refused.
TEST(CpuDecoderKernelsTest, MoeDispatchGroupsRowsByExpert) {
  const std::vector<int32_t> experts = {2, 0,   // token 0
                                        0, 1,   // token 1
                                        2, 1};  // token 2
  std::vector<int32_t> row_token(6), row_slot(6), token_rows(6);
  std::vector<int64_t> offsets(4);
  ASSERT_TRUE(
      MoeDispatch(experts.data(), 3, 2, 3, row_token.data(), row_slot.data(), token_rows.data(), offsets.data()));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(row_slot, (std::vector<int32_t>{1, 2, 3, 5, 0, 4}));
  EXPECT_EQ(row_token, (std::vector<int32_t>{0, 1, 1, 2, 0, 2}));
  EXPECT_EQ(token_rows, (std::vector<int32_t>{0, 4, 1, 2, 3, 5}));
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_FALSE(MoeDispatch(bad.data(), 1, 2, 3, row_token.data(), row_slot.data(), token_rows.data(), offsets.data()));
}

// The gather's and the combine's adjoints; the combine sums a token's
// weighted rows in expert order.
TEST(CpuDecoderKernelsTest, MoeGatherAndCombineBackwardMatchFiniteDifferences) {
  std::mt19937_64 rng(23);
  const int E = 4, K = 2, C = 5;
  const int64_t M = kN * K;
  std::vector<int32_t> experts(kN * K);
  for (int64_t n = 0; n < kN; ++n) {
    experts[n * K] = static_cast<int32_t>(n % E);
    experts[n * K + 1] = static_cast<int32_t>((n + 1 + n / E) % E);
    if (experts[n * K + 1] == experts[n * K]) experts[n * K + 1] = (experts[n * K] + 1) % E;
  }
  std::vector<int32_t> rows(3 * M);
  std::vector<int64_t> offsets(E + 1);
  ASSERT_TRUE(MoeDispatch(experts.data(), kN, K, E, rows.data(), rows.data() + M, rows.data() + 2 * M, offsets.data()));
  const int32_t *row_token = rows.data(), *row_slot = rows.data() + M, *token_rows = rows.data() + 2 * M;
  std::vector<double> x = Random(kN * C, rng, 2.0), y = Random(M * C, rng, 2.0), weights = Random(kN * K, rng);
  std::vector<double> wx = Random(M * C, rng), wo = Random(kN * C, rng), xe(M * C), out(kN * C);
  auto gather = [&] {
    GatherRows(xe.data(), x.data(), row_token, M, C);
    return Dot(xe, wx);
  };
  std::vector<double> dx = Filled(x.size());
  GatherRowsBackward(dx.data(), wx.data(), token_rows, kN, K, C);
  ExpectGradient("dx", x, dx, gather);
  auto combine = [&] {
    MoeCombineForward(out.data(), y.data(), weights.data(), token_rows, row_slot, kN, K, C);
    return Dot(out, wo);
  };
  combine();
  for (int c = 0; c < C; ++c) {  // token 0: its two experts' rows, weighted
    const int32_t r0 = token_rows[0], r1 = token_rows[1];
    EXPECT_DOUBLE_EQ(out[c], y[r0 * C + c] * weights[row_slot[r0]] + y[r1 * C + c] * weights[row_slot[r1]]);
  }
  std::vector<double> dy = Filled(y.size()), dweights = Filled(weights.size());
  MoeCombineBackward(dy.data(), dweights.data(), wo.data(), y.data(), weights.data(), row_token, row_slot, M, C);
  ExpectGradient("dy", y, dy, combine);
  ExpectGradient("dweights", weights, dweights, combine);
}

// The shared expert's gate: out += sigmoid(logit) * y, and its adjoint.
TEST(CpuDecoderKernelsTest, SigmoidGateBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(29);
  const int C = 7;
  std::vector<double> y = Random(kN * C, rng, 2.0), logit = Random(kN, rng, 3.0), base = Random(kN * C, rng);
  const std::vector<double> wo = Random(kN * C, rng);
  std::vector<double> out(kN * C);
  auto gate = [&] {
    out = base;
    SigmoidGateForward(out.data(), y.data(), logit.data(), kN, C);
    return Dot(out, wo);
  };
  gate();
  for (int c = 0; c < C; ++c) EXPECT_DOUBLE_EQ(out[c], base[c] + y[c] / (1 + std::exp(-logit[0])));
  std::vector<double> dy = Filled(y.size()), dlogit = Filled(logit.size());
  SigmoidGateBackward(dy.data(), dlogit.data(), wo.data(), y.data(), logit.data(), kN, C);
  ExpectGradient("dy", y, dy, gate);
  ExpectGradient("dlogit", logit, dlogit, gate);
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
