// Internal: the optimizer kernels, written once over a vector type V and
// instantiated per ISA by kernels_{scalar,avx2,avx512}.cc.
//
// Why one template: every ISA runs the same operations in the same order with
// the same fused multiply-adds, and IEEE 754 rounds each of them (mul, fma,
// sqrt, div) exactly, so the scalar, AVX2 and AVX-512 updates are bit for bit
// identical. Tests hold them to that; only the gradient norm, a sum whose
// order follows the vector width, differs (in the last bits of a double).
//
// The update per element is DeepSpeed's cpu_adam, operation for operation:
//   g  = g * grad_scale
//   g  = fma(p, weight_decay, g)                     (Adam with L2 decay)
//   m  = fma(g, 1 - beta1, m * beta1)
//   v  = fma(g * g, 1 - beta2, v * beta2)
//   d  = fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)
//   p  = fma(p, -lr * weight_decay, p)               (AdamW, decoupled decay)
//   p  = fma(m / d, -lr / (1 - beta1^t), p)
//   out16 = round_to_nearest_even(p)
// One pass reads p, m, v, g and writes p, m, v (and out16) once.
//
// The V contract (all static, all inline):
//   kLanes; F (kLanes floats); D (double accumulator)
//   Set1, Load, Store, LoadBf16, LoadF16, StoreBf16, StoreF16, StoreHigh16,
//   Add, Mul, Div, Sqrt, Fma(a, b, c) = a * b + c (one rounding),
//   DZero, AccumulateSquares(D& lo, D& hi, F x), DAdd, DSum.
//
// ODR care: each file that includes this one gets its V from an anonymous
// namespace, so every instantiation below has internal linkage and a copy
// compiled with AVX-512 flags can never be merged into the scalar path. For
// the same reason the ISA files call no inline library function (std::),
// only intrinsics and builtins.
#pragma once

#include <cstdint>
#include <type_traits>

#include "optim/kernels.h"

namespace zinf::optim::internal {

inline constexpr int kOutNone = 0;
inline constexpr int kOutBf16 = 1;
inline constexpr int kOutF16 = 2;

template <class V, ElementType kGrad>
inline typename V::F LoadGrad(const void* g, int64_t i) {
  if constexpr (kGrad == ElementType::kF32) {
    return V::Load(static_cast<const float*>(g) + i);
  } else if constexpr (kGrad == ElementType::kBf16) {
    return V::LoadBf16(static_cast<const uint16_t*>(g) + i);
  } else {
    return V::LoadF16(static_cast<const uint16_t*>(g) + i);
  }
}

template <class V, int kOut>
inline void StoreOut(void* out, int64_t i, typename V::F x) {
  if constexpr (kOut == kOutBf16) {
    V::StoreBf16(static_cast<uint16_t*>(out) + i, x);
  } else if constexpr (kOut == kOutF16) {
    V::StoreF16(static_cast<uint16_t*>(out) + i, x);
  }
}

template <class V, ElementType kGrad>
struct GradTail {
  using Elem = std::conditional_t<kGrad == ElementType::kF32, float, uint16_t>;
};

// Copies n < kLanes elements of the tail into a zero-padded block, so the
// tail runs the very same vector code as the body (zeros are harmless: m = v
// = g = 0 gives d = eps and an update of 0).
// (Templated on V too, so each ISA file gets its own internal copy.)
template <class V, typename T>
inline void CopyIn(T* dst, const T* src, int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] = src[k];
}

template <class V, DecayMode kMode>
struct AdamConsts {
  using F = typename V::F;
  explicit AdamConsts(const AdamArgs& a)
      : beta1(V::Set1(a.beta1)),
        one_minus_beta1(V::Set1(a.one_minus_beta1)),
        beta2(V::Set1(a.beta2)),
        one_minus_beta2(V::Set1(a.one_minus_beta2)),
        eps(V::Set1(a.eps)),
        bc2_rsqrt(V::Set1(a.bias_correction2_rsqrt)),
        step_size(V::Set1(a.step_size)),
        weight_decay(V::Set1(a.weight_decay)),
        decay(V::Set1(a.decay)),
        grad_scale(V::Set1(a.grad_scale)) {}
  F beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bc2_rsqrt, step_size, weight_decay, decay, grad_scale;
};

template <class V, DecayMode kMode>
inline void AdamVec(const AdamConsts<V, kMode>& c, typename V::F& p, typename V::F& m, typename V::F& v,
                    typename V::F g) {
  using F = typename V::F;
  g = V::Mul(g, c.grad_scale);
  if constexpr (kMode == DecayMode::kL2) g = V::Fma(p, c.weight_decay, g);
  m = V::Fma(g, c.one_minus_beta1, V::Mul(m, c.beta1));
  const F g2 = V::Mul(g, g);
  v = V::Fma(g2, c.one_minus_beta2, V::Mul(v, c.beta2));
  const F d = V::Fma(V::Sqrt(v), c.bc2_rsqrt, c.eps);
  const F u = V::Div(m, d);
  if constexpr (kMode == DecayMode::kDecoupled) p = V::Fma(p, c.decay, p);
  p = V::Fma(u, c.step_size, p);
}

template <class V, DecayMode kMode, ElementType kGrad, int kOut>
void AdamRange(const AdamArgs& args, float* p, float* m, float* v, const void* g, void* out, int64_t n) {
  using F = typename V::F;
  constexpr int kL = V::kLanes;
  const AdamConsts<V, kMode> c(args);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    F pv = V::Load(p + i);
    F mv = V::Load(m + i);
    F vv = V::Load(v + i);
    AdamVec<V, kMode>(c, pv, mv, vv, LoadGrad<V, kGrad>(g, i));
    V::Store(p + i, pv);
    V::Store(m + i, mv);
    V::Store(v + i, vv);
    StoreOut<V, kOut>(out, i, pv);
  }
  if constexpr (kL > 1) {
    if (i < n) {
      using G = typename GradTail<V, kGrad>::Elem;
      const int64_t r = n - i;
      alignas(64) float tp[kL] = {};
      alignas(64) float tm[kL] = {};
      alignas(64) float tv[kL] = {};
      alignas(64) G tg[kL] = {};
      alignas(64) uint16_t to[kL] = {};
      CopyIn<V>(tp, p + i, r);
      CopyIn<V>(tm, m + i, r);
      CopyIn<V>(tv, v + i, r);
      CopyIn<V>(tg, static_cast<const G*>(g) + i, r);
      F pv = V::Load(tp);
      F mv = V::Load(tm);
      F vv = V::Load(tv);
      AdamVec<V, kMode>(c, pv, mv, vv, LoadGrad<V, kGrad>(tg, 0));
      V::Store(tp, pv);
      V::Store(tm, mv);
      V::Store(tv, vv);
      StoreOut<V, kOut>(to, 0, pv);
      CopyIn<V>(p + i, tp, r);
      CopyIn<V>(m + i, tm, r);
      CopyIn<V>(v + i, tv, r);
      if constexpr (kOut != kOutNone) CopyIn<V>(static_cast<uint16_t*>(out) + i, to, r);
    }
  }
}

template <class V, ElementType kGrad, int kOut>
void BoundRange(float scale, float* p, float* m, float* v, const void* g, void* out, int64_t n) {
  using F = typename V::F;
  constexpr int kL = V::kLanes;
  const F s = V::Set1(scale);
  // Loads and stores in the order AdamRange issues them.
  auto body = [&](float* pp, float* mp, float* vp, const void* gp, uint16_t* op, int64_t k) {
    F pv = V::Load(pp + k);
    F mv = V::Load(mp + k);
    F vv = V::Load(vp + k);
    const F gv = LoadGrad<V, kGrad>(gp, k);
    pv = V::Fma(gv, s, pv);
    mv = V::Fma(gv, s, mv);
    vv = V::Fma(gv, s, vv);
    V::Store(pp + k, pv);
    V::Store(mp + k, mv);
    V::Store(vp + k, vv);
    if constexpr (kOut != kOutNone) V::StoreHigh16(op + k, pv);
  };
  uint16_t* o = static_cast<uint16_t*>(out);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) body(p, m, v, g, o, i);
  if constexpr (kL > 1) {
    if (i < n) {
      using G = typename GradTail<V, kGrad>::Elem;
      const int64_t r = n - i;
      alignas(64) float tp[kL] = {};
      alignas(64) float tm[kL] = {};
      alignas(64) float tv[kL] = {};
      alignas(64) G tg[kL] = {};
      alignas(64) uint16_t to[kL] = {};
      CopyIn<V>(tp, p + i, r);
      CopyIn<V>(tm, m + i, r);
      CopyIn<V>(tv, v + i, r);
      CopyIn<V>(tg, static_cast<const G*>(g) + i, r);
      body(tp, tm, tv, tg, to, 0);
      CopyIn<V>(p + i, tp, r);
      CopyIn<V>(m + i, tm, r);
      CopyIn<V>(v + i, tv, r);
      if constexpr (kOut != kOutNone) CopyIn<V>(o + i, to, r);
    }
  }
}

template <class V, ElementType kGrad>
double SumSquaresRange(const void* x, int64_t n) {
  constexpr int kL = V::kLanes;
  typename V::D a0 = V::DZero(), a1 = V::DZero(), a2 = V::DZero(), a3 = V::DZero();
  int64_t i = 0;
  for (; i + 2 * kL <= n; i += 2 * kL) {
    V::AccumulateSquares(a0, a1, LoadGrad<V, kGrad>(x, i));
    V::AccumulateSquares(a2, a3, LoadGrad<V, kGrad>(x, i + kL));
  }
  for (; i + kL <= n; i += kL) V::AccumulateSquares(a0, a1, LoadGrad<V, kGrad>(x, i));
  if constexpr (kL > 1) {
    if (i < n) {
      using G = typename GradTail<V, kGrad>::Elem;
      alignas(64) G t[kL] = {};
      CopyIn<V>(t, static_cast<const G*>(x) + i, n - i);
      V::AccumulateSquares(a2, a3, LoadGrad<V, kGrad>(t, 0));
    }
  }
  return V::DSum(V::DAdd(V::DAdd(a0, a2), V::DAdd(a1, a3)));
}

template <class V, int kOut>
void FromF32Range(const float* src, void* dst, int64_t n) {
  constexpr int kL = V::kLanes;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) StoreOut<V, kOut>(dst, i, V::Load(src + i));
  if constexpr (kL > 1) {
    if (i < n) {
      alignas(64) float t[kL] = {};
      alignas(64) uint16_t o[kL] = {};
      CopyIn<V>(t, src + i, n - i);
      StoreOut<V, kOut>(o, 0, V::Load(t));
      CopyIn<V>(static_cast<uint16_t*>(dst) + i, o, n - i);
    }
  }
}

template <class V, ElementType kGrad>
void ToF32Range(const void* src, float* dst, int64_t n) {
  constexpr int kL = V::kLanes;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) V::Store(dst + i, LoadGrad<V, kGrad>(src, i));
  if constexpr (kL > 1) {
    if (i < n) {
      alignas(64) uint16_t t[kL] = {};
      alignas(64) float o[kL] = {};
      CopyIn<V>(t, static_cast<const uint16_t*>(src) + i, n - i);
      V::Store(o, LoadGrad<V, kGrad>(t, 0));
      CopyIn<V>(dst + i, o, n - i);
    }
  }
}

template <class V, DecayMode kMode, ElementType kGrad>
constexpr void FillAdam(KernelTable& t) {
  t.adam[int(kMode)][TypeIndex(kGrad)][kOutNone] = &AdamRange<V, kMode, kGrad, kOutNone>;
  t.adam[int(kMode)][TypeIndex(kGrad)][kOutBf16] = &AdamRange<V, kMode, kGrad, kOutBf16>;
  t.adam[int(kMode)][TypeIndex(kGrad)][kOutF16] = &AdamRange<V, kMode, kGrad, kOutF16>;
}

template <class V, ElementType kGrad>
constexpr void FillPerGrad(KernelTable& t) {
  FillAdam<V, DecayMode::kNone, kGrad>(t);
  FillAdam<V, DecayMode::kL2, kGrad>(t);
  FillAdam<V, DecayMode::kDecoupled, kGrad>(t);
  t.bound[TypeIndex(kGrad)][kOutNone] = &BoundRange<V, kGrad, kOutNone>;
  t.bound[TypeIndex(kGrad)][kOutBf16] = &BoundRange<V, kGrad, kOutBf16>;
  t.bound[TypeIndex(kGrad)][kOutF16] = &BoundRange<V, kGrad, kOutF16>;
  t.sum_squares[TypeIndex(kGrad)] = &SumSquaresRange<V, kGrad>;
}

template <class V>
constexpr KernelTable MakeKernelTable() {
  KernelTable t{};
  FillPerGrad<V, ElementType::kF32>(t);
  FillPerGrad<V, ElementType::kBf16>(t);
  FillPerGrad<V, ElementType::kF16>(t);
  t.from_f32[kOutBf16] = &FromF32Range<V, kOutBf16>;
  t.from_f32[kOutF16] = &FromF32Range<V, kOutF16>;
  t.to_f32[TypeIndex(ElementType::kBf16)] = &ToF32Range<V, ElementType::kBf16>;
  t.to_f32[TypeIndex(ElementType::kF16)] = &ToF32Range<V, ElementType::kF16>;
  return t;
}

}  // namespace zinf::optim::internal
