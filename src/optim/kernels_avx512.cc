// AVX-512F kernels (16 lanes). Compiled with -mavx512f (plus AVX2/FMA/F16C);
// called only when CpuSupports(Isa::kAvx512). Intrinsics only (see the ODR
// note in kernels_impl.h). bf16 rounding is done with integer ops rather than
// AVX512_BF16's vcvtneps2bf16, which flushes subnormals to zero.
// GCC 12's avx512fintrin.h builds _mm512_undefined_*() from a self-initialised
// variable, which -Wmaybe-uninitialized reports at every inlined use (GCC bug
// 105593); the pragma silences it for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "optim/kernels_impl.h"

namespace zinf::optim::internal {
namespace {

struct Avx512 {
  static constexpr int kLanes = 16;
  using F = __m512;
  using D = __m512d;
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreBf16(uint16_t* p, F x) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  static void StoreF16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StoreHigh16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
  }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static D DZero() { return _mm512_setzero_pd(); }
  static void AccumulateSquares(D& lo, D& hi, F x) {
    const D l = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const D h = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lo = _mm512_fmadd_pd(l, l, lo);
    hi = _mm512_fmadd_pd(h, h, hi);
  }
  static D DAdd(D a, D b) { return _mm512_add_pd(a, b); }
  static double DSum(D a) { return _mm512_reduce_add_pd(a); }
};

constexpr KernelTable kTable = MakeKernelTable<Avx512>();

}  // namespace

const KernelTable& Avx512Kernels() { return kTable; }

}  // namespace zinf::optim::internal
