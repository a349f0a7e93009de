// CPU kernels of the Llama family (RMSNorm, RoPE, SwiGLU and GeGLU, the GQA head
// expansion); contracts in cpu_kernels.h. Same rules as cpu_kernels.cc:
// OpenMP over independent rows or channels, reductions in double in a fixed
// order, so results do not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cpu_kernels.h"
#include "kernels/cpu_vector.h"

namespace zinf::kernels::cpu {
namespace {

using internal::ExpFloat;
using internal::Gelu;
using internal::GeluGrad;
using internal::VectorizedChunks;
using internal::WorthThreads;

// The logistic 1 / (1 + e^-g): float through ExpFloat (vectorized, about
// 2 ulp an exp; past the clamp, 1 / (1 + e^87) where the library's gives
// 0), double through the library's exp (the gradient checks).
template <typename T>
ZINF_ALWAYS_INLINE T Logistic(T g) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + ExpFloat(-g));
  } else {
    return T(1) / (T(1) + std::exp(-g));
  }
}

}  // namespace

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int C, double eps) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * static_cast<double>(x[c]);
    const T s = static_cast<T>(1.0 / std::sqrt(ss / C + eps));
    rstd[n] = s;
    T* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = x[c] * s * weight[c];
  }
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                     int C) {
  // With g = dout * weight and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)).
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const T s = rstd[n];
    double gx_mean = 0.0;
    for (int c = 0; c < C; ++c) gx_mean += static_cast<double>(d[c] * weight[c]) * static_cast<double>(x[c] * s);
    gx_mean /= C;
    T* dx = dinp + n * C;
    for (int c = 0; c < C; ++c) dx[c] += s * (d[c] * weight[c] - x[c] * s * static_cast<T>(gx_mean));
  }
  constexpr int kChunk = 16;
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int c0 = 0; c0 < C; c0 += kChunk) {
    const int c1 = std::min(C, c0 + kChunk);
    double dw[kChunk] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* d = dout + n * C;
      for (int c = c0; c < c1; ++c) dw[c - c0] += static_cast<double>(d[c] * (x[c] * rstd[n]));
    }
    for (int c = c0; c < c1; ++c) dweight[c] += static_cast<T>(dw[c - c0]);
  }
}

// Rotates the halves (a, b) of each head's first `rot` columns at position
// t by `sign` x the angle whose cos and sin are the tables' row t: o = (a c -
// sign b s, b c + sign a s); the columns past rot pass. The forward rotates
// by +angle into `out`; the backward, the transpose, rotates the gradient by
// -angle and adds it to `out`.
template <typename T, bool kAccumulate>
void RopeRotate(T* out, const T* inp, const T* cos, const T* sin, T sign, int B, int T_, int n_head, int hd, int rot,
                bool interleaved) {
  const int half = rot / 2;
  // Pair i is the head's columns (i * step, i * step + gap).
  const int step = interleaved ? 2 : 1, gap = interleaved ? 1 : half;
  const int64_t N = static_cast<int64_t>(B) * T_;
  const int64_t width = static_cast<int64_t>(n_head) * hd;
#pragma omp parallel for schedule(static) if (WorthThreads(N * width))
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = n % T_;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    for (int h = 0; h < n_head; ++h) {
      const T* x = inp + n * width + static_cast<int64_t>(h) * hd;
      T* o = out + n * width + static_cast<int64_t>(h) * hd;
      for (int i = 0; i < half; ++i) {
        const int j = i * step;
        const T a = x[j], b = x[j + gap], ss = sign * s[i];
        const T lo = a * c[i] - b * ss, hi = b * c[i] + a * ss;
        if constexpr (kAccumulate) {
          o[j] += lo;
          o[j + gap] += hi;
        } else {
          o[j] = lo;
          o[j + gap] = hi;
        }
      }
      for (int i = rot; i < hd; ++i) {
        if constexpr (kAccumulate) {
          o[i] += x[i];
        } else {
          o[i] = x[i];
        }
      }
    }
  }
}

template <typename T>
void RopeForward(T* out, const T* inp, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                 bool interleaved) {
  RopeRotate<T, false>(out, inp, cos, sin, T(1), B, T_, n_head, hd, rot, interleaved);
}

template <typename T>
void RopeBackward(T* dinp, const T* dout, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                  bool interleaved) {
  RopeRotate<T, true>(dinp, dout, cos, sin, T(-1), B, T_, n_head, hd, rot, interleaved);
}

template <typename T>
void GluForward(T* out, const T* gate, const T* up, int64_t n, Glu glu) {
  if (glu.kind == Glu::kClampedSwiglu) {
    const T alpha = static_cast<T>(glu.alpha), limit = static_cast<T>(glu.limit);
    return VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const T g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
        out[i] = (u + T(1)) * (g * Logistic<T>(alpha * g));
      }
    });
  }
  if (glu.kind == Glu::kGeluTanh) {
    return VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) out[i] = Gelu<T>(gate[i]) * up[i];
    });
  }
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T g = gate[i];
      out[i] = g * Logistic<T>(g) * up[i];
    }
  });
}

template <typename T>
void GluBackward(T* dgate, T* dup, const T* gate, const T* up, const T* dout, int64_t n, Glu glu) {
  if (glu.kind == Glu::kClampedSwiglu) {
    const T alpha = static_cast<T>(glu.alpha), limit = static_cast<T>(glu.limit);
    return VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const T g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
        const T sig = Logistic<T>(alpha * g);
        const T dact = gate[i] <= limit ? sig * (T(1) + alpha * g * (T(1) - sig)) : T(0);
        const T dclamp = up[i] >= -limit && up[i] <= limit ? T(1) : T(0);
        dgate[i] += dout[i] * (u + T(1)) * dact;
        dup[i] += dout[i] * g * sig * dclamp;
      }
    });
  }
  if (glu.kind == Glu::kGeluTanh) {
    return VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const T g = gate[i];
        dgate[i] += dout[i] * up[i] * GeluGrad<T>(g);
        dup[i] += dout[i] * Gelu<T>(g);
      }
    });
  }
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T g = gate[i];
      const T sig = Logistic<T>(g);
      const T silu = g * sig;
      dgate[i] += dout[i] * up[i] * (sig * (T(1) + g * (T(1) - sig)));
      dup[i] += dout[i] * silu;
    }
  });
}

template <typename T>
void GqaExpandForward(T* qkv, const T* q, const T* k, const T* v, int64_t N, int NH, int NKV, int hd) {
  const int group = NH / NKV;
  const int64_t C = static_cast<int64_t>(NH) * hd, Ckv = static_cast<int64_t>(NKV) * hd;
#pragma omp parallel for schedule(static) if (WorthThreads(N * 3 * C))
  for (int64_t n = 0; n < N; ++n) {
    T* row = qkv + n * 3 * C;
    std::copy(q + n * C, q + (n + 1) * C, row);
    for (int h = 0; h < NH; ++h) {
      const int64_t src = n * Ckv + static_cast<int64_t>(h / group) * hd;
      std::copy(k + src, k + src + hd, row + C + static_cast<int64_t>(h) * hd);
      std::copy(v + src, v + src + hd, row + 2 * C + static_cast<int64_t>(h) * hd);
    }
  }
}

template <typename T>
void GqaExpandBackward(T* dq, T* dk, T* dv, const T* dqkv, int64_t N, int NH, int NKV, int hd) {
  const int group = NH / NKV;
  const int64_t C = static_cast<int64_t>(NH) * hd, Ckv = static_cast<int64_t>(NKV) * hd;
#pragma omp parallel for schedule(static) if (WorthThreads(N * 3 * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* row = dqkv + n * 3 * C;
    for (int64_t c = 0; c < C; ++c) dq[n * C + c] += row[c];
    for (int h = 0; h < NH; ++h) {
      const int64_t dst = n * Ckv + static_cast<int64_t>(h / group) * hd;
      const T* rk = row + C + static_cast<int64_t>(h) * hd;
      const T* rv = row + 2 * C + static_cast<int64_t>(h) * hd;
      for (int i = 0; i < hd; ++i) {
        dk[dst + i] += rk[i];
        dv[dst + i] += rv[i];
      }
    }
  }
}

template <typename T>
void CopyHeadColumns(T* dst, int64_t dst_ld, int dst_head, const T* src, int64_t src_ld, int src_head, int64_t N, int H,
                     int width, bool accumulate) {
  ZINF_CHECK_MSG(dst_head != 0 || H == 1 || accumulate, "CopyHeadColumns sums heads into one only accumulating");
#pragma omp parallel for schedule(static) if (WorthThreads(N * H * width))
  for (int64_t n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      T* d = dst + n * dst_ld + static_cast<int64_t>(h) * dst_head;
      const T* s = src + n * src_ld + static_cast<int64_t>(h) * src_head;
      if (accumulate) {
        for (int c = 0; c < width; ++c) d[c] += s[c];
      } else {
        std::copy(s, s + width, d);
      }
    }
  }
}

#define ZINF_DECODER_KERNELS(T)                                                                   \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int64_t, int, double);              \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int); \
  template void RopeForward<T>(T*, const T*, const T*, const T*, int, int, int, int, int, bool);  \
  template void RopeBackward<T>(T*, const T*, const T*, const T*, int, int, int, int, int, bool); \
  template void GluForward<T>(T*, const T*, const T*, int64_t, Glu);                              \
  template void GluBackward<T>(T*, T*, const T*, const T*, const T*, int64_t, Glu);               \
  template void GqaExpandForward<T>(T*, const T*, const T*, const T*, int64_t, int, int, int);    \
  template void GqaExpandBackward<T>(T*, T*, T*, const T*, int64_t, int, int, int);               \
  template void CopyHeadColumns<T>(T*, int64_t, int, const T*, int64_t, int, int64_t, int, int, bool);
ZINF_DECODER_KERNELS(float)
ZINF_DECODER_KERNELS(double)
#undef ZINF_DECODER_KERNELS

}  // namespace zinf::kernels::cpu
