// Multi-threaded array passes the optimizer needs besides the update: the
// gradient's sum of squares (for global-norm clipping and the fp16 overflow
// check, in one read of the gradient) and fp32 <-> 16-bit casts.
//
// SumSquares accumulates x^2 in double (each square is exact in double), so
// the sum neither overflows nor loses small terms for any fp32/bf16/fp16
// input; an Inf or NaN element makes the sum Inf or NaN, which is how the
// fp16 loss scaler learns of an overflow without a second pass: see
// GradNormAccumulator in grad_clip.h. The array is cut into at most
// kMaxSumChunks chunks whose boundaries depend on n only, and the partial
// sums are added in chunk order, so the result does not depend on the number
// of threads (it does depend on the ISA, in the last bits).
//
// Casts round to nearest even, as core/half.h describes, bit-identically on
// every ISA.
//
// Thread-safety: as CpuAdam: calls sharing a pool must not overlap.
#pragma once

#include <cstdint>

#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf::optim {

inline constexpr int64_t kMaxSumChunks = 1024;

// Sum over i < n of double(x[i])^2, x holding n elements of `dtype` (kF32,
// kBf16 or kF16). Errors: n < 0, x null with n > 0, `isa` unsupported,
// another dtype.
StatusOr<double> SumSquares(ThreadPool& pool, Isa isa, const void* x, ElementType dtype, int64_t n);
// The sums of squares of consecutive pieces of fp32 `x`: out[i] over
// x[bounds[i], bounds[i + 1]) for i < bounds.size() - 1, each piece in one
// kernel pass, so a piece's sum depends on its elements alone, not on the
// array around it or the thread count. Errors: bounds not ascending from 0.
Status SumSquaresPieces(ThreadPool& pool, Isa isa, const float* x, const int64_t* bounds, int64_t pieces, double* out);

// SumSquaresPieces on the calling thread alone, for a caller that spreads
// its own tasks over a pool (which must not call into the pool again): the
// same kernel per piece, so the same bits.
Status SumSquaresPiecesSerial(Isa isa, const float* x, const int64_t* bounds, int64_t pieces, double* out);

// dst[i] = round_to_nearest_even(src[i]) as `dst_dtype` (kBf16 or kF16).
Status CastFromF32(ThreadPool& pool, Isa isa, const float* src, ElementType dst_dtype, void* dst, int64_t n);
// dst[i] = src[i] as fp32 (exact), src holding `src_dtype` (kBf16 or kF16).
Status CastToF32(ThreadPool& pool, Isa isa, const void* src, ElementType src_dtype, float* dst, int64_t n);
// acc[i] += src[i] * scale, rounded after the product and after the sum
// (no fused multiply-add), so the result is the plain C++ loop's on every
// thread count: the engine's gradient accumulation.
Status AddScaled(ThreadPool& pool, const float* src, float scale, float* acc, int64_t n);
// dst[i] = 0 + src[i] * scale: AddScaled's result on a zeroed `dst`, bit
// for bit (a -0 product becomes +0 as it does there), without reading dst.
// src and dst must not overlap.
Status SetScaled(ThreadPool& pool, const float* src, float scale, float* dst, int64_t n);
// SetScaled on the calling thread alone (see SumSquaresPiecesSerial).
void SetScaledSerial(const float* src, float scale, float* dst, int64_t n);

}  // namespace zinf::optim
