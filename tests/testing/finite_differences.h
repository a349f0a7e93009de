// The kernels' gradient checks: every backward against central finite
// differences of its forward, in double.
//
// The objective is J = sum_i w_i * out_i with random w, so dout = w and the
// gradient a backward kernel computes must equal dJ/d(input). Central
// differences with step h = 1e-5 have truncation error ~h^2 * |f'''| and
// rounding error ~eps * |J| / h, both far below the tolerance used:
// |analytic - numeric| <= 1e-6 * (|numeric| + 1e-2) (relative 1e-6, with a
// small absolute floor for gradients that are near zero).
//
// Gradients are checked after prefilling them with kPrefill (Filled), which
// tests the accumulate (+=) contract of every backward kernel at the same
// time.
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::test_support {

inline constexpr double kStep = 1e-5;
inline constexpr double kRelTol = 1e-6;
inline constexpr double kAbsFloor = 1e-2;
inline constexpr double kPrefill = 0.25;  // gradients start here; kernels must add to it

// `n` values uniform in [-scale, scale).
inline std::vector<double> Random(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A gradient buffer of `n` elements prefilled with kPrefill.
inline std::vector<double> Filled(size_t n) { return std::vector<double>(n, kPrefill); }

// Compares `grad` (prefilled with kPrefill before the backward ran) with
// central differences of `objective` in every element of `x`; names the
// first five elements that disagree.
inline void ExpectGradient(const char* what, std::vector<double>& x, const std::vector<double>& grad,
                           const std::function<double()>& objective) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double plus = objective();
    x[i] = saved - kStep;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    const double analytic = grad[i] - kPrefill;
    if (std::fabs(analytic - numeric) > kRelTol * (std::fabs(numeric) + kAbsFloor) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic << " numeric " << numeric;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << x.size() << " elements disagree";
}

}  // namespace zinf::test_support
