// Scalar kernels: the reference path, compiled for baseline x86-64 (and any
// other CPU). fma and sqrt are the correctly rounded library/hardware ones, so
// results match the vector paths bit for bit (see kernels_impl.h).
#include "core/half.h"
#include "optim/kernels_impl.h"

namespace zinf::optim::internal {
namespace {

struct Scalar {
  static constexpr int kLanes = 1;
  using F = float;
  using D = double;
  static F Set1(float x) { return x; }
  static F Load(const float* p) { return *p; }
  static void Store(float* p, F x) { *p = x; }
  static F LoadBf16(const uint16_t* p) { return Bf16ToFloat(*p); }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static void StoreBf16(uint16_t* p, F x) { *p = FloatToBf16(x); }
  static void StoreF16(uint16_t* p, F x) { *p = FloatToHalf(x); }
  static void StoreHigh16(uint16_t* p, F x) { *p = static_cast<uint16_t>(__builtin_bit_cast(uint32_t, x) >> 16); }
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return __builtin_sqrtf(a); }
  static F Fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
  static D DZero() { return 0.0; }
  // The product of two floats is exact in double, so this equals an fma.
  static void AccumulateSquares(D& lo, D& /*hi*/, F x) {
    const double d = x;
    lo += d * d;
  }
  static D DAdd(D a, D b) { return a + b; }
  static double DSum(D a) { return a; }
};

constexpr KernelTable kTable = MakeKernelTable<Scalar>();

}  // namespace

const KernelTable& ScalarKernels() { return kTable; }

}  // namespace zinf::optim::internal
