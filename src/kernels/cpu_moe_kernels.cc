// CPU kernels of the mixture-of-experts MLP (routing, dispatch, gather and
// combine); contracts in cpu_kernels.h. Rows are independent, reductions
// run in double in a fixed order: results do not depend on the threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "kernels/cpu_vector.h"
#include "kernels/moe_routing_rules.h"

namespace zinf::kernels::cpu {
namespace {

using internal::WorthThreads;

using routing::Floored;
using routing::NormDivisor;
using routing::NormSum;

}  // namespace

template <typename T>
void MoeRouteForward(T* weights, int32_t* experts, T* probs, const T* logits, const T* bias, int64_t N,
                     const MoeRouting& r) {
  const int E = r.E, k = r.k;
  const bool sigmoid = r.scoring == MoeScoring::kSigmoid;
#pragma omp parallel if (WorthThreads(N * E))
  {
    std::vector<double> c(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* l = logits + n * E;
      T* p = probs + n * E;
      if (sigmoid) {
        for (int e = 0; e < E; ++e) p[e] = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
      } else {
        double max = l[0];
        for (int e = 1; e < E; ++e) max = std::max(max, static_cast<double>(l[e]));
        double sum = 0;
        for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - max);
        for (int e = 0; e < E; ++e) p[e] = static_cast<T>(std::exp(static_cast<double>(l[e]) - max) / sum);
      }
      for (int e = 0; e < E; ++e) {
        c[static_cast<size_t>(e)] = static_cast<double>(p[e]) + (bias != nullptr ? static_cast<double>(bias[e]) : 0.0);
      }
      const auto score = [&c](int e) { return c[static_cast<size_t>(e)]; };
      int32_t* ex = experts + n * k;
      T* w = weights + n * k;
      routing::ChooseExperts(ex, score, routing::ChooseGroups<double>(score, r), r);
      double total = 0;
      for (int j = 0; j < k; ++j) total += static_cast<double>(p[ex[j]]);
      for (int j = 0; j < k; ++j) {
        const double v = static_cast<double>(p[ex[j]]);
        w[j] = static_cast<T>((r.normalize ? v / NormDivisor(total, r) : v) * r.scale);
      }
    }
  }
}

template <typename T>
void MoeRouteBackward(T* dlogits, const T* dweights, const T* probs, const int32_t* experts, const T* dprobs, int64_t N,
                      const MoeRouting& r) {
  const int E = r.E, k = r.k;
  const bool sigmoid = r.scoring == MoeScoring::kSigmoid;
#pragma omp parallel for schedule(static) if (WorthThreads(N * E))
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * E;
    const T* dw = dweights + n * k;
    const int32_t* ex = experts + n * k;
    // d of each chosen score: scale dw, or through w_j = scale v_j / D,
    // D = sum_j v_j (+ eps): dv_m = scale (dw_m / D - sum_j dw_j v_j / D^2);
    // D = norm_min, a constant, where the floor holds: scale dw_m / D.
    double total = 0, dot = 0;
    for (int j = 0; j < k; ++j) {
      total += static_cast<double>(p[ex[j]]);
      dot += static_cast<double>(dw[j]) * static_cast<double>(p[ex[j]]);
    }
    const double D = NormDivisor(total, r);
    const double through_sum = Floored(NormSum(total, r), r) ? 0.0 : dot / (D * D);
    double dv[kMaxExpertsPerToken];
    double weighted = 0;
    for (int j = 0; j < k; ++j) {
      const double d = r.normalize ? static_cast<double>(dw[j]) / D - through_sum : static_cast<double>(dw[j]);
      dv[j] = d * r.scale;
      weighted += static_cast<double>(p[ex[j]]) * dv[j];
    }
    if (dprobs != nullptr) {
      for (int e = 0; e < E; ++e) weighted += static_cast<double>(p[e]) * static_cast<double>(dprobs[e]);
    }
    // dp: the chosen experts' dv plus dprobs (zero elsewhere without
    // them); the sigmoid's adjoint dl_e = p_e (1 - p_e) dp_e, the
    // softmax's dl_e = p_e (dp_e - sum_m p_m dp_m).
    T* dl = dlogits + n * E;
    for (int e = 0; e < E; ++e) {
      double dp = dprobs != nullptr ? static_cast<double>(dprobs[e]) : 0.0;
      for (int j = 0; j < k; ++j) {
        if (ex[j] == e) dp += dv[j];
      }
      const double pe = static_cast<double>(p[e]);
      dl[e] += static_cast<T>(sigmoid ? pe * (1.0 - pe) * dp : pe * (dp - weighted));
    }
  }
}

bool MoeDispatch(const int32_t* experts, int64_t N, int k, int E, int32_t* row_token, int32_t* row_slot,
                 int32_t* token_rows, int64_t* offsets) {
  const int64_t M = N * k;
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t s = 0; s < M; ++s) {
    if (experts[s] < 0 || experts[s] >= E) return false;
    ++offsets[experts[s] + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + E);
  for (int64_t s = 0; s < M; ++s) {  // slots ascending: rows ordered by expert, then slot
    const int64_t r = next[static_cast<size_t>(experts[s])]++;
    row_token[r] = static_cast<int32_t>(s / k);
    row_slot[r] = static_cast<int32_t>(s);
    token_rows[s] = static_cast<int32_t>(r);
  }
  for (int64_t n = 0; n < N; ++n) std::sort(token_rows + n * k, token_rows + (n + 1) * k);
  return true;
}

template <typename T>
void GatherRows(T* out, const T* inp, const int32_t* rows, int64_t M, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(M * C))
  for (int64_t r = 0; r < M; ++r) std::copy_n(inp + static_cast<int64_t>(rows[r]) * C, C, out + r * C);
}

template <typename T>
void GatherRowsBackward(T* dinp, const T* drows, const int32_t* token_rows, int64_t N, int k, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * k * C))
  for (int64_t n = 0; n < N; ++n) {
    T* d = dinp + n * C;
    for (int j = 0; j < k; ++j) {
      const T* src = drows + static_cast<int64_t>(token_rows[n * k + j]) * C;
      for (int c = 0; c < C; ++c) d[c] += src[c];
    }
  }
}

template <typename T>
void MoeCombineForward(T* out, const T* y, const T* weights, const int32_t* token_rows, const int32_t* row_slot,
                       int64_t N, int k, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * k * C))
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    std::fill(o, o + C, T(0));
    for (int j = 0; j < k; ++j) {
      const int64_t r = token_rows[n * k + j];
      const T w = weights[row_slot[r]];
      const T* yr = y + r * C;
      for (int c = 0; c < C; ++c) o[c] += static_cast<T>(yr[c] * w);
    }
  }
}

template <typename T>
void MoeCombineBackward(T* dy, T* dweights, const T* dout, const T* y, const T* weights, const int32_t* row_token,
                        const int32_t* row_slot, int64_t M, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(M * C))
  for (int64_t r = 0; r < M; ++r) {
    const T* d = dout + static_cast<int64_t>(row_token[r]) * C;
    const T* yr = y + r * C;
    T* dyr = dy + r * C;
    const T w = weights[row_slot[r]];
    double dot = 0;
    for (int c = 0; c < C; ++c) {
      dyr[c] += d[c] * w;
      dot += static_cast<double>(d[c]) * static_cast<double>(yr[c]);
    }
    dweights[row_slot[r]] += static_cast<T>(dot);
  }
}

namespace {
double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

template <typename T>
void SigmoidGateForward(T* out, const T* y, const T* logit, int64_t N, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T s = static_cast<T>(Sigmoid(static_cast<double>(logit[n])));
    T* o = out + n * C;
    const T* yr = y + n * C;
    for (int c = 0; c < C; ++c) o[c] += static_cast<T>(s * yr[c]);
  }
}

template <typename T>
void SigmoidGateBackward(T* dy, T* dlogit, const T* dout, const T* y, const T* logit, int64_t N, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const double s = static_cast<double>(static_cast<T>(Sigmoid(static_cast<double>(logit[n]))));  // the forward's s
    const T* d = dout + n * C;
    const T* yr = y + n * C;
    T* dyr = dy + n * C;
    double dot = 0;
    for (int c = 0; c < C; ++c) {
      dyr[c] += static_cast<T>(s * static_cast<double>(d[c]));
      dot += static_cast<double>(d[c]) * static_cast<double>(yr[c]);
    }
    dlogit[n] += static_cast<T>(s * (1.0 - s) * dot);
  }
}

#define ZINF_MOE_KERNELS(T)                                                                                          \
  template void MoeRouteForward<T>(T*, int32_t*, T*, const T*, const T*, int64_t, const MoeRouting&);                \
  template void MoeRouteBackward<T>(T*, const T*, const T*, const int32_t*, const T*, int64_t, const MoeRouting&);   \
  template void GatherRows<T>(T*, const T*, const int32_t*, int64_t, int);                                           \
  template void GatherRowsBackward<T>(T*, const T*, const int32_t*, int64_t, int, int);                              \
  template void MoeCombineForward<T>(T*, const T*, const T*, const int32_t*, const int32_t*, int64_t, int, int);     \
  template void MoeCombineBackward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, const int32_t*, int64_t, \
                                      int);                                                                          \
  template void SigmoidGateForward<T>(T*, const T*, const T*, int64_t, int);                                         \
  template void SigmoidGateBackward<T>(T*, T*, const T*, const T*, const T*, int64_t, int);
ZINF_MOE_KERNELS(float)
ZINF_MOE_KERNELS(double)
#undef ZINF_MOE_KERNELS

}  // namespace zinf::kernels::cpu
