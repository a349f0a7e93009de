// AVX2 + FMA + F16C kernels (8 lanes). Compiled with -mavx2 -mfma -mf16c;
// called only when CpuSupports(Isa::kAvx2). Intrinsics only (see the ODR note
// in kernels_impl.h).
#include <immintrin.h>

#include "optim/kernels_impl.h"

namespace zinf::optim::internal {
namespace {

struct Avx2 {
  static constexpr int kLanes = 8;
  using F = __m256;
  using D = __m256d;
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F LoadF16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void StoreBf16(uint16_t* p, F x) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    // Values are < 2^16, so the unsigned saturating pack is exact.
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void StoreF16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StoreHigh16(uint16_t* p, F x) {
    const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static D DZero() { return _mm256_setzero_pd(); }
  static void AccumulateSquares(D& lo, D& hi, F x) {
    const D l = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const D h = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_fmadd_pd(l, l, lo);
    hi = _mm256_fmadd_pd(h, h, hi);
  }
  static D DAdd(D a, D b) { return _mm256_add_pd(a, b); }
  static double DSum(D a) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
  }
};

constexpr KernelTable kTable = MakeKernelTable<Avx2>();

}  // namespace

const KernelTable& Avx2Kernels() { return kTable; }

}  // namespace zinf::optim::internal
