// Internal to the CPU kernels (cpu_kernels.cc, cpu_decoder_kernels.cc):
// the compiler attributes they share, when a loop is worth threads, the
// run-time choice of instruction set and what runs under it (Vectorized),
// a float exp that vectorizes, the GELU built on it, and sums in fixed
// lanes.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__)
#define ZINF_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ZINF_ALWAYS_INLINE inline
#endif

// The micro-tiles' inner loop under the sanitizers: AddressSanitizer checks
// every load and store of the stack accumulators and UBSan every index
// product, so nothing vectorizes (the model tests under ASan + UBSan spent
// over 90% of their time there, 20x the plain build). The micro-tiles read
// only the packed slabs this file sizes and fills (their packing is
// checked) and write C within the tile's mr x nr; they run uninstrumented.
#if defined(__GNUC__)
#define ZINF_NO_ASAN __attribute__((no_sanitize("address", "undefined")))
#else
#define ZINF_NO_ASAN
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define ZINF_KERNELS_X86 1
#define ZINF_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define ZINF_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#endif

namespace zinf::kernels::cpu::internal {

// Below this many element operations a kernel runs on the calling thread: a
// fork/join costs microseconds on an idle machine and far more when the
// cores are shared (threads spin at the barrier waiting for a preempted
// peer), and small models call many small kernels.
constexpr int64_t kMinParallelWork = int64_t{1} << 17;
inline bool WorthThreads(int64_t work) { return work >= kMinParallelWork; }

// Whether the machine has AVX2 with FMA (AVX-512F and VL) and LimitIsa
// allows it (cpu_kernels.cc).
bool HaveAvx2();
bool HaveAvx512();

// exp(z) in float (the attention's softmax, the GELU's logistic, the
// loss): z clamped to [-87, 87], reduced by n ln 2 (n rounded to nearest by
// the 1.5 * 2^23 trick, ln 2 in two parts), e^r by its Taylor polynomial to
// degree 7 (|r| <= 0.35: under 1e-8 relative truncation), scaled by 2^n
// built in the exponent bits. Plain float operations with no branch and no
// library call, so the loops around it vectorize (under Vectorized: GCC
// leaves the baseline ISA's clamp and conversion scalar), and every element
// gets the same bits whichever lane or thread computes it. About 2 ulp
// against the exact value.
inline float ExpFloat(float z) {
  z = std::min(std::max(z, -87.0f), 87.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float n = (z * 1.44269504088896341f + kRound) - kRound;
  const float r = (z - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// GELU, tanh approximation (cpu_kernels.h): gelu(x) = x g(y) with
// y = s (x + k x^3), s = sqrt(2 / pi), k = 0.044715, and the gate
// g = 0.5 (1 + tanh(y)) = 1 / (1 + e^(-2y)); 1 - g = e^(-2y) g (no
// cancellation as g nears 1). In float without a tanh (the library's is
// scalar and took most of the MLP's non-matmul time); 0 and 1 where
// e^(-2y) is past the clamp, as tanhf gives, so the tail stays exact zeros
// rather than subnormals. double keeps std::tanh for the gradient checks.
inline constexpr double kGeluScale = 0.7978845608028654;
inline constexpr double kGeluCubic = 0.044715;
template <typename T>
struct GeluGate {
  T g, one_minus_g;
  ZINF_ALWAYS_INLINE explicit GeluGate(T y) {
    if constexpr (std::is_same_v<T, float>) {
      const float z = -2.0f * y;
      const float e = ExpFloat(z);
      const float gate = 1.0f / (1.0f + e);
      g = z >= 87.0f ? 0.0f : gate;
      one_minus_g = z >= 87.0f ? 1.0f : e * gate;
    } else {
      const T th = std::tanh(y);
      g = T(0.5) * (T(1) + th);
      one_minus_g = T(0.5) * (T(1) - th);
    }
  }
};
template <typename T>
ZINF_ALWAYS_INLINE T Gelu(T x) {
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(kGeluCubic);
  return x * GeluGate<T>(s * (x + k * x * x * x)).g;
}
// d/dx [x g(y)] = g + 2 x g (1 - g) s (1 + 3 k x^2), as g' = 2 g (1 - g).
template <typename T>
ZINF_ALWAYS_INLINE T GeluGrad(T x) {
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(kGeluCubic);
  const GeluGate<T> gate(s * (x + k * x * x * x));
  return gate.g + T(2) * x * gate.g * gate.one_minus_g * s * (T(1) + T(3) * k * x * x);
}

// tanh for the softcaps (Gemma 2's attention scores and logits): in float
// from ExpFloat as sign(x) (1 - e) / (1 + e), e = e^(-2|x|), within a few
// ulp of 1 absolute (exactly +-1 past the clamp), so that the loops around
// it vectorize; double keeps std::tanh for the gradient checks.
template <typename T>
ZINF_ALWAYS_INLINE T Tanh(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float e = ExpFloat(-2.0f * std::fabs(x));
    const float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
  } else {
    return std::tanh(x);
  }
}

// Runs `body` (a lambda marked ZINF_INLINE_LAMBDA, so that it and what it
// calls inline into the caller) compiled for AVX-512, AVX2 or the baseline
// ISA, the widest the machine has: the element-wise float loops around
// ExpFloat vectorize at the machine's width. Element by element the
// operations are the same with no contraction (CMakeLists.txt compiles the
// CPU kernels with -ffp-contract=off), so the bits do not depend on the ISA as
// long as no reduction's order does (sums run in fixed lanes: SumLanes).
#define ZINF_INLINE_LAMBDA __attribute__((always_inline))
#if defined(ZINF_KERNELS_X86)
template <typename F>
ZINF_TARGET_AVX2 void RunAvx2(const F& body) {
  body();
}
template <typename F>
ZINF_TARGET_AVX512 void RunAvx512(const F& body) {
  body();
}
#endif
template <typename F>
void Vectorized(const F& body) {
#if defined(ZINF_KERNELS_X86)
  if (HaveAvx512()) return RunAvx512(body);
  if (HaveAvx2()) return RunAvx2(body);
#endif
  body();
}

// x[0] + ... + x[n-1] in 16 fixed lanes of A (lane l sums the elements
// l, l + 16, ...; then the lanes in order): the same bits at any vector
// width.
template <typename A, typename T>
ZINF_ALWAYS_INLINE A SumLanes(const T* x, int64_t n) {
  constexpr int kLanes = 16;
  A lanes[kLanes] = {};
  int64_t i0 = 0;
  for (; i0 + kLanes <= n; i0 += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<A>(x[i0 + l]);
  }
  for (int l = 0; i0 + l < n; ++l) lanes[l] += static_cast<A>(x[i0 + l]);
  A sum = lanes[0];
  for (int l = 1; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// span(i0, i1) (a ZINF_INLINE_LAMBDA) over [0, n) in chunks on the threads,
// each chunk Vectorized.
template <typename F>
void VectorizedChunks(int64_t n, const F& span) {
  constexpr int64_t kChunk = int64_t{1} << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (WorthThreads(n))
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    Vectorized([&]() ZINF_INLINE_LAMBDA { span(i0, i1); });
  }
}

}  // namespace zinf::kernels::cpu::internal
