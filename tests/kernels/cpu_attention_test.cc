// The fused CPU attention (FusedAttentionForward/Backward): against finite
// differences in double, against the unfused kernels (the T x T
// probabilities) in double and float over shapes that cross its 64-row
// blocks, causal, within its sliding window, and the same bits whatever the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "kernels/cpu_kernels.h"
#include "testing/finite_differences.h"

namespace zinf::kernels::cpu {
namespace {

using test_support::Dot;
using test_support::ExpectGradient;
using test_support::Filled;
using test_support::Random;

struct Shape {
  int B, T, C, NH;
  int window = 0;
  float softcap = 0;   // 0: none
  bool sinks = false;  // a sink logit per head (GPT-OSS's)
  int64_t N() const { return int64_t{B} * T; }
  std::string Name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) + " NH" + std::to_string(NH) +
           " window " + std::to_string(window) + " softcap " + std::to_string(softcap) + (sinks ? " sinks" : "");
  }
};

// The heads' sink logits: around the scores' range, so that a sink takes
// from a few tenths of a row's mass (one key) to almost none; empty
// without sinks.
std::vector<double> SinkLogits(const Shape& s, std::mt19937_64& rng) {
  if (!s.sinks) return {};
  std::vector<double> v = Random(s.NH, rng, 1.5);
  for (double& x : v) x += 0.5;
  return v;
}
template <typename T>
const T* DataOrNull(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}
template <typename T>
T* DataOrNull(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

template <typename T>
std::vector<T> Cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

TEST(CpuAttentionTest, BackwardMatchesFiniteDifferences) {
  // Two query blocks (T 70 > 64) so that both passes cross a block edge.
  // A window of 9 keys: the passes' key and query ranges start and end
  // inside a block. Softcaps well inside the scores' range (Gemma 2's).
  // Sinks: with a window and a cap, across the blocks.
  for (const Shape s :
       {Shape{2, 5, 8, 2}, Shape{1, 70, 6, 2}, Shape{1, 70, 6, 2, 9}, Shape{2, 5, 8, 2, 0, 0.5f},
        Shape{1, 70, 6, 2, 9, 0.7f}, Shape{2, 5, 8, 2, 0, 0, true}, Shape{1, 70, 6, 2, 9, 0.7f, true}}) {
    SCOPED_TRACE(s.Name());
    std::mt19937_64 rng(11);
    std::vector<double> qkv = Random(s.N() * 3 * s.C, rng, 1.5), w = Random(s.N() * s.C, rng);
    std::vector<double> sinks = SinkLogits(s, rng);
    std::vector<double> out(s.N() * s.C), lse(int64_t{s.B} * s.NH * s.T), scratch(lse.size());
    auto objective = [&] {
      FusedAttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap,
                            DataOrNull(sinks));
      return Dot(out, w);
    };
    objective();
    std::vector<double> dqkv = Filled(qkv.size()), dsinks = Filled(sinks.size());
    FusedAttentionBackward(dqkv.data(), scratch.data(), w.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                           s.NH, s.window, s.softcap, DataOrNull(sinks), DataOrNull(dsinks));
    ExpectGradient("dqkv", qkv, dqkv, objective);
    if (s.sinks) ExpectGradient("dsinks", sinks, dsinks, objective);
  }
}

// Fused against unfused on the same inputs: out, each row's log-sum-exp
// (from the unfused probabilities: lse = s_tt - log p_tt) and dqkv added to
// a prefill.
template <typename T>
void CheckAgainstUnfused(const Shape& s, double tol) {
  SCOPED_TRACE(s.Name());
  std::mt19937_64 rng(static_cast<uint64_t>(s.T * 31 + s.C));
  const std::vector<T> qkv = Cast<T>(Random(s.N() * 3 * s.C, rng, 2.0));
  const std::vector<T> dout = Cast<T>(Random(s.N() * s.C, rng));
  const std::vector<T> sinks = Cast<T>(SinkLogits(s, rng));
  const int64_t rows = int64_t{s.B} * s.NH * s.T;
  std::vector<T> out(s.N() * s.C), att(rows * s.T), scratch(att.size());
  AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap, DataOrNull(sinks));
  std::vector<T> dqkv(qkv.size(), T(0.25)), dsinks(sinks.size(), T(0.5));
  AttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH, s.window,
                    s.softcap, DataOrNull(dsinks));

  std::vector<T> fout(out.size()), lse(rows), fscratch(rows), fdqkv(qkv.size(), T(0.25)), fdsinks(sinks.size(), T(0.5));
  FusedAttentionForward(fout.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap,
                        DataOrNull(sinks));
  FusedAttentionBackward(fdqkv.data(), fscratch.data(), dout.data(), qkv.data(), fout.data(), lse.data(), s.B, s.T, s.C,
                         s.NH, s.window, s.softcap, DataOrNull(sinks), DataOrNull(fdsinks));
  auto expect_near = [&](const char* what, const std::vector<T>& want, const std::vector<T>& got) {
    double worst = 0;
    int64_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])) /
                         (std::fabs(static_cast<double>(want[i])) + 1.0);
      if (err > worst) worst = err, at = static_cast<int64_t>(i);
    }
    EXPECT_LE(worst, tol) << what << " at " << at << ": " << got[at] << " against " << want[at];
  };
  expect_near("out", out, fout);
  expect_near("dqkv", dqkv, fdqkv);
  expect_near("dsinks", dsinks, fdsinks);
  // lse: the row's diagonal probability is exp(s_tt * scale - lse), the
  // score through the cap if any.
  const int hs = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<T> want_lse(rows);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        const T* q = qkv.data() + (int64_t{b} * s.T + t) * 3 * s.C + h * hs;
        double st = 0;
        for (int i = 0; i < hs; ++i) st += static_cast<double>(q[i]) * static_cast<double>(q[s.C + i]);
        const int64_t row = (int64_t{b} * s.NH + h) * s.T + t;
        st *= scale;
        if (s.softcap > 0) st = s.softcap * std::tanh(st / s.softcap);
        want_lse[row] = static_cast<T>(st - std::log(static_cast<double>(att[row * s.T + t])));
      }
    }
  }
  expect_near("lse", want_lse, lse);
}

TEST(CpuAttentionTest, MatchesTheUnfusedKernels) {
  // One partial block, exactly one, one and a bit, several with a partial
  // last; head sizes 4, 16, 64 and an odd 24 (no vector-width multiple).
  for (const Shape s :
       {Shape{2, 7, 8, 2}, Shape{1, 64, 32, 2}, Shape{2, 65, 48, 2}, Shape{1, 200, 128, 2}, Shape{1, 130, 72, 3},
        // Sliding windows: within a block, one block, across blocks.
        Shape{2, 65, 48, 2, 5}, Shape{1, 200, 32, 2, 64}, Shape{1, 130, 72, 3, 100},
        // Softcapped scores, with and without a window.
        Shape{2, 65, 48, 2, 0, 1.5f}, Shape{1, 130, 72, 3, 100, 0.8f},
        // Sinks: alone, in a window, with a cap.
        Shape{2, 65, 48, 2, 0, 0, true}, Shape{1, 130, 72, 3, 100, 0, true}, Shape{1, 130, 72, 3, 100, 0.8f, true}}) {
    CheckAgainstUnfused<double>(s, 1e-12);
    CheckAgainstUnfused<float>(s, 2e-5);
  }
}

TEST(CpuAttentionTest, IsCausal) {
  // Changing the last position of batch 0 leaves every earlier position's
  // output and every dqkv entry of batch 1 bit for bit unchanged.
  const Shape s{2, 90, 16, 2};
  std::mt19937_64 rng(5);
  std::vector<double> qkv = Random(s.N() * 3 * s.C, rng, 1.5), dout = Random(s.N() * s.C, rng);
  auto run = [&](const std::vector<double>& in, std::vector<double>* out, std::vector<double>* dqkv) {
    std::vector<double> lse(int64_t{s.B} * s.NH * s.T), scratch(lse.size());
    out->assign(s.N() * s.C, 0.0);
    dqkv->assign(in.size(), 0.0);
    FusedAttentionForward(out->data(), lse.data(), in.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap);
    FusedAttentionBackward(dqkv->data(), scratch.data(), dout.data(), in.data(), out->data(), lse.data(), s.B, s.T, s.C,
                           s.NH, s.window, s.softcap);
  };
  std::vector<double> out, dqkv, out2, dqkv2;
  run(qkv, &out, &dqkv);
  std::vector<double> qkv2 = qkv;
  for (int i = 0; i < 3 * s.C; ++i) qkv2[(s.T - 1) * 3 * s.C + i] += 0.5;
  run(qkv2, &out2, &dqkv2);
  for (int64_t i = 0; i < (s.T - 1) * int64_t{s.C}; ++i) ASSERT_EQ(out[i], out2[i]) << i;
  double diff = 0;
  for (int c = 0; c < s.C; ++c) diff += std::fabs(out[(s.T - 1) * s.C + c] - out2[(s.T - 1) * s.C + c]);
  EXPECT_GT(diff, 0.0);
  for (int64_t i = int64_t{s.T} * s.C; i < s.N() * s.C; ++i) ASSERT_EQ(out[i], out2[i]) << i;
  for (int64_t i = int64_t{s.T} * 3 * s.C; i < static_cast<int64_t>(qkv.size()); ++i) ASSERT_EQ(dqkv[i], dqkv2[i]) << i;
  // dq of an earlier query reads only keys up to it: unchanged too.
  for (int t = 0; t < s.T - 1; ++t) {
    for (int c = 0; c < s.C; ++c) ASSERT_EQ(dqkv[t * 3 * s.C + c], dqkv2[t * 3 * s.C + c]) << "t " << t;
  }
}

// With a window, a change to position p reaches the outputs of queries p
// .. p + window - 1 and no other; and a window of the sequence's length or
// more gives the bits of none.
TEST(CpuAttentionTest, SeesOnlyItsWindow) {
  const Shape s{1, 150, 16, 2, 20};
  std::mt19937_64 rng(6);
  const std::vector<double> qkv = Random(s.N() * 3 * s.C, rng, 1.5), dout = Random(s.N() * s.C, rng);
  auto run = [&](const std::vector<double>& in, int window, std::vector<double>* out, std::vector<double>* dqkv) {
    std::vector<double> lse(int64_t{s.B} * s.NH * s.T), scratch(lse.size());
    out->assign(s.N() * s.C, 0.0);
    dqkv->assign(in.size(), 0.0);
    FusedAttentionForward(out->data(), lse.data(), in.data(), s.B, s.T, s.C, s.NH, window, s.softcap);
    FusedAttentionBackward(dqkv->data(), scratch.data(), dout.data(), in.data(), out->data(), lse.data(), s.B, s.T, s.C,
                           s.NH, window, s.softcap);
  };
  std::vector<double> out, dqkv, out2, dqkv2;
  run(qkv, s.window, &out, &dqkv);
  const int p = 70;
  std::vector<double> qkv2 = qkv;
  for (int i = s.C; i < 3 * s.C; ++i) qkv2[p * 3 * s.C + i] += 0.5;  // key and value at p
  run(qkv2, s.window, &out2, &dqkv2);
  for (int t = 0; t < s.T; ++t) {
    double diff = 0;
    for (int c = 0; c < s.C; ++c) diff += std::fabs(out[t * s.C + c] - out2[t * s.C + c]);
    if (t >= p && t < p + s.window) {
      EXPECT_GT(diff, 0.0) << "query " << t;
    } else {
      EXPECT_EQ(diff, 0.0) << "query " << t;
    }
  }
  for (const int wide : {s.T, s.T + 1000}) {
    std::vector<double> out_none, dqkv_none, out_wide, dqkv_wide;
    run(qkv, 0, &out_none, &dqkv_none);
    run(qkv, wide, &out_wide, &dqkv_wide);
    EXPECT_EQ(out_none, out_wide) << "window " << wide;
    EXPECT_EQ(dqkv_none, dqkv_wide) << "window " << wide;
  }
}

// A window of one key: each query sees only itself, so out = v exactly, and
// the gradient reaches v alone (dv = dout; dq and dk are p (dp - D) k and
// q, zero but for the two dot products' summation orders).
TEST(CpuAttentionTest, AWindowOfOneSeesOnlyItself) {
  const Shape s{2, 70, 12, 3, 1};
  std::mt19937_64 rng(8);
  const std::vector<float> qkv = Cast<float>(Random(s.N() * 3 * s.C, rng, 2.0));
  const std::vector<float> dout = Cast<float>(Random(s.N() * s.C, rng));
  std::vector<float> out(s.N() * s.C), lse(int64_t{s.B} * s.NH * s.T), scratch(lse.size()), dqkv(qkv.size(), 0.0f);
  FusedAttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap);
  FusedAttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                         s.NH, s.window, s.softcap);
  for (int64_t n = 0; n < s.N(); ++n) {
    for (int c = 0; c < s.C; ++c) {
      ASSERT_EQ(out[n * s.C + c], qkv[(n * 3 + 2) * s.C + c]) << "row " << n;
      ASSERT_EQ(dqkv[(n * 3 + 2) * s.C + c], dout[n * s.C + c]) << "row " << n;
      ASSERT_NEAR(dqkv[n * 3 * s.C + c], 0.0f, 1e-6) << "dq row " << n;
      ASSERT_NEAR(dqkv[(n * 3 + 1) * s.C + c], 0.0f, 1e-6) << "dk row " << n;
    }
  }
}

void SameBitsWhateverTheThreadCount(const Shape& s) {
  std::mt19937_64 rng(9);
  const std::vector<float> qkv = Cast<float>(Random(s.N() * 3 * s.C, rng, 2.0));
  const std::vector<float> dout = Cast<float>(Random(s.N() * s.C, rng));
  auto run = [&](int threads, std::vector<float>* out, std::vector<float>* lse, std::vector<float>* dqkv) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    out->assign(s.N() * s.C, 0.0f);
    lse->assign(int64_t{s.B} * s.NH * s.T, 0.0f);
    dqkv->assign(qkv.size(), 0.0f);
    std::vector<float> scratch(lse->size());
    FusedAttentionForward(out->data(), lse->data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap);
    FusedAttentionBackward(dqkv->data(), scratch.data(), dout.data(), qkv.data(), out->data(), lse->data(), s.B, s.T,
                           s.C, s.NH, s.window, s.softcap);
    omp_set_num_threads(before);
  };
  std::vector<float> out1, lse1, dqkv1, out3, lse3, dqkv3;
  run(1, &out1, &lse1, &dqkv1);
  run(3, &out3, &lse3, &dqkv3);
  EXPECT_EQ(out1, out3);
  EXPECT_EQ(lse1, lse3);
  EXPECT_EQ(dqkv1, dqkv3);
}

TEST(CpuAttentionTest, SameBitsWhateverTheThreadCount) {
  // Large enough to run on threads (B*T*T*C past the parallel threshold),
  // without a window and with one, and with a softcap.
  for (const Shape s : {Shape{2, 192, 64, 4}, Shape{2, 192, 64, 4, 40}, Shape{2, 192, 64, 4, 40, 1.0f}}) {
    SCOPED_TRACE(s.Name());
    SameBitsWhateverTheThreadCount(s);
  }
}

// The whole attention gives the same bits with AVX2 as with AVX-512 (the
// matmuls' FMA chains, the rows' element-wise work and fixed-lane sums);
// the baseline ISA's matmuls round otherwise, so it is only close.
void SameBitsOnAvx2AsOnAvx512(const Shape& s) {
  std::mt19937_64 rng(13);
  const std::vector<float> qkv = Cast<float>(Random(s.N() * 3 * s.C, rng, 2.0));
  const std::vector<float> dout = Cast<float>(Random(s.N() * s.C, rng));
  struct Result {
    std::vector<float> out, lse, dqkv;
  };
  auto run = [&](Isa isa) {
    const Isa before = LimitIsa(isa);
    Result r{std::vector<float>(s.N() * s.C), std::vector<float>(int64_t{s.B} * s.NH * s.T),
             std::vector<float>(qkv.size(), 0.5f)};
    std::vector<float> scratch(r.lse.size());
    FusedAttentionForward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.window, s.softcap);
    FusedAttentionBackward(r.dqkv.data(), scratch.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B, s.T,
                           s.C, s.NH, s.window, s.softcap);
    LimitIsa(before);
    return r;
  };
  const Result wide = run(Isa::kAvx512), avx2 = run(Isa::kAvx2), base = run(Isa::kBaseline);
  EXPECT_EQ(wide.out, avx2.out);
  EXPECT_EQ(wide.lse, avx2.lse);
  EXPECT_EQ(wide.dqkv, avx2.dqkv);
  for (size_t i = 0; i < wide.dqkv.size(); ++i) {
    ASSERT_NEAR(base.dqkv[i], wide.dqkv[i], 1e-4 * (std::fabs(wide.dqkv[i]) + 1)) << i;
  }
}

TEST(CpuAttentionTest, SameBitsOnAvx2AsOnAvx512) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vl")) {
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  for (const Shape s : {Shape{2, 150, 96, 3}, Shape{2, 150, 96, 3, 0, 1.0f}}) {
    SCOPED_TRACE(s.Name());
    SameBitsOnAvx2AsOnAvx512(s);
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
