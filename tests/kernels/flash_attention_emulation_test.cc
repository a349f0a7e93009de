// The fused attention's CUDA kernels (kernels/cuda_flash_attention_kernels.cuh)
// run on the host through a CUDA emulation (cuda_emulation.h: threads for
// CUDA threads, real barriers, WMMA's alignment and bounds rules checked),
// against float64 attention on the operands rounded to bf16 as the kernels
// round them: the kernels' indexing, masks, tiling, online softmax, the
// barriers between warps and the shared-memory layout are checked on every
// build, GPU or not (a missing __syncwarp or __syncthreads shows as wrong
// numbers here, and as a race under ThreadSanitizer). The tolerance is
// CudaFlashAttentionTest's: |got - want| <= 1.5e-2 * max |want| + 1e-3 per
// tensor (the kernels round P and dS to bf16 too), the log-sum-exps 1e-4 +
// 1e-5 relative. The tensor cores' own summation order and rounding are the
// GPU test's to check.
#include "cuda_emulation.h"  // before the kernels

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_flash_attention_kernels.cuh"

namespace zinf::kernels::cuda::flash {
namespace {

struct Shape {
  int B, T, NH;
  int window = 0;     // 0: none; else query t sees keys t - window + 1 .. t
  float softcap = 0;  // 0: none; else scores s become softcap * tanh(s / softcap)
};

// Largest |got - want| over the tensor against 1.5e-2 * max |want| + 1e-3.
::testing::AssertionResult NearMax(const char* what, const std::vector<double>& got, const std::vector<double>& want) {
  double mx = 0.0, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    mx = std::max(mx, std::fabs(want[i]));
    const double e = std::fabs(got[i] - want[i]);
    if (!(e <= err)) err = e;  // NaN sticks
  }
  const double tol = 1.5e-2 * mx + 1e-3;
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": largest error " << err << " over the tolerance " << tol
                                       << " (max |want| " << mx << ")";
}

double Bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int HS>
void Check(const Shape& sh, uint32_t seed) {
  const int B = sh.B, T = sh.T, NH = sh.NH, C = NH * HS;
  const int W = sh.window;
  const float cap = sh.softcap;
  SCOPED_TRACE("head size " + std::to_string(HS) + " B " + std::to_string(B) + " T " + std::to_string(T) + " NH " +
               std::to_string(NH) + " window " + std::to_string(W) + " softcap " + std::to_string(cap));
  const int64_t N = int64_t{B} * T, rows = int64_t{B} * NH * T;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u2(-2, 2), u1(-1, 1), garbage(7, 8);
  std::vector<float> qkv(N * 3 * C), dout(N * C), dqkv0(N * 3 * C);
  for (auto& x : qkv) x = u2(rng);
  for (auto& x : dout) x = u1(rng);
  for (auto& x : dqkv0) x = u1(rng);
  std::vector<float> out(N * C), lse(rows), d(rows);  // garbage: the kernels must write every element
  for (auto* v : {&out, &lse, &d}) {
    for (auto& x : *v) x = garbage(rng);
  }

  // The launches of cuda_flash_attention.cu's Forward and Backward.
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const Dim3 grid{static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH), 1};
  Launch(grid, kFlashThreads, Layout<HS>::kForwardBytes,
         [&] { FlashForwardKernel<HS>(out.data(), lse.data(), qkv.data(), T, C, NH, scale, W, cap); });
  std::vector<float> dqkv = dqkv0;
  const unsigned dot_blocks = static_cast<unsigned>(std::max<int64_t>(1, (rows + 7) / 8));
  Launch(Dim3{dot_blocks, 1, 1}, 256, 0,
         [&] { FlashRowDotKernel(d.data(), dout.data(), out.data(), T, C, NH, HS, rows); });
  Launch(grid, kFlashThreads, Layout<HS>::kBackwardBytes, [&] {
    FlashBackwardKvKernel<HS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), d.data(), T, C, NH, scale, W, cap);
  });
  Launch(grid, kFlashThreads, Layout<HS>::kBackwardBytes, [&] {
    FlashBackwardQKernel<HS>(dqkv.data(), dout.data(), qkv.data(), lse.data(), d.data(), T, C, NH, scale, W, cap);
  });

  // float64 attention on the rounded operands.
  auto at = [&](int64_t b, int64_t t, int part, int h) { return ((b * T + t) * 3 + part) * C + int64_t{h} * HS; };
  std::vector<double> want_out(N * C, 0.0), want_lse(rows), want_d(N * 3 * C, 0.0);
  // d capped score / d score at each key of the row at hand.
  const double sc = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const int64_t o = (int64_t{b} * T + t) * C + int64_t{h} * HS;
        const int lo = W > 0 ? std::max(0, t - W + 1) : 0;  // the keys query t sees: lo .. t
        std::vector<double> s(t + 1), p(t + 1), dp(t + 1), grad(t + 1, 1.0);
        double mx = -INFINITY;
        for (int j = lo; j <= t; ++j) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += Bf16(qkv[at(b, t, 0, h) + i]) * Bf16(qkv[at(b, j, 1, h) + i]);
          s[j] = dot * sc;
          if (cap > 0) {
            const double u = std::tanh(s[j] / cap);
            s[j] = cap * u;
            grad[j] = 1.0 - u * u;
          }
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int j = lo; j <= t; ++j) sum += std::exp(s[j] - mx);
        want_lse[(int64_t{b} * NH + h) * T + t] = mx + std::log(sum);
        double D = 0.0;
        for (int j = lo; j <= t; ++j) {
          p[j] = std::exp(s[j] - mx) / sum;
          double x = 0.0;
          for (int i = 0; i < HS; ++i) {
            want_out[o + i] += p[j] * Bf16(qkv[at(b, j, 2, h) + i]);
            x += Bf16(dout[o + i]) * Bf16(qkv[at(b, j, 2, h) + i]);
          }
          dp[j] = x;
          D += p[j] * x;
        }
        for (int j = lo; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - D) * grad[j];
          for (int i = 0; i < HS; ++i) {
            want_d[at(b, t, 0, h) + i] += sc * ds * Bf16(qkv[at(b, j, 1, h) + i]);
            want_d[at(b, j, 1, h) + i] += sc * ds * Bf16(qkv[at(b, t, 0, h) + i]);
            want_d[at(b, j, 2, h) + i] += p[j] * Bf16(dout[o + i]);
          }
        }
      }
    }
  }

  EXPECT_TRUE(NearMax("out", std::vector<double>(out.begin(), out.end()), want_out));
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_NEAR(lse[r], want_lse[r], 1e-4 + 1e-5 * std::fabs(want_lse[r])) << "row " << r;
  }
  const char* names[] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {  // what the kernels added, part by part
    std::vector<double> got, want;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (n * 3 + part) * C + c;
        got.push_back(static_cast<double>(dqkv[i]) - dqkv0[i]);
        want.push_back(want_d[i]);
      }
    }
    EXPECT_TRUE(NearMax(names[part], got, want));
  }
}

TEST(FlashAttentionEmulationTest, HeadSize64AcrossAPartialTile) { Check<64>({2, 100, 2}, 100); }
TEST(FlashAttentionEmulationTest, HeadSize16) { Check<16>({2, 17, 4}, 110); }
TEST(FlashAttentionEmulationTest, HeadSize32OneFullTile) { Check<32>({1, 64, 3}, 111); }
TEST(FlashAttentionEmulationTest, HeadSize128ThreeTiles) { Check<128>({1, 130, 1}, 112); }
TEST(FlashAttentionEmulationTest, OnePosition) { Check<64>({3, 1, 1}, 120); }
// Sliding windows: narrower than a tile (most key tiles skipped, rows with
// no key in a walked tile), one tile, wider than a tile but shorter than
// the sequence, and past it (no window in effect).
TEST(FlashAttentionEmulationTest, SlidingWindows) {
  Check<16>({1, 150, 2, 5}, 130);
  Check<32>({1, 140, 1, 64}, 131);
  Check<16>({2, 200, 1, 70}, 132);
  Check<16>({1, 40, 2, 100}, 133);
}
// Gemma 2's softcap, well inside the scores' range (q, k in [-2, 2]), with
// and without a window.
TEST(FlashAttentionEmulationTest, Softcap) {
  Check<32>({2, 70, 2, 0, 1.5f}, 140);
  Check<16>({1, 150, 1, 20, 0.7f}, 141);
}

}  // namespace
}  // namespace zinf::kernels::cuda::flash
