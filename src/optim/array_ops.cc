#include "optim/array_ops.h"

#include <string>

#include "optim/cpu_adam.h"
#include "optim/kernels.h"

namespace zinf::optim {
namespace {

Status CheckArgs(Isa isa, const void* a, const void* b, int64_t n, const char* what) {
  if (n < 0) return Status::InvalidArgument(std::string(what) + ": n must be >= 0, got " + std::to_string(n));
  if (n > 0 && (a == nullptr || b == nullptr)) {
    return Status::InvalidArgument(std::string(what) + ": null array with n > 0");
  }
  if (!CpuSupports(isa)) {
    return Status::Unavailable(std::string(what) + ": this CPU does not support " + std::string(IsaName(isa)));
  }
  return Status::Ok();
}

Status CheckPieces(Isa isa, const float* x, const int64_t* bounds, int64_t pieces, const double* out) {
  if (pieces < 0 || (pieces > 0 && (bounds == nullptr || out == nullptr || bounds[0] != 0))) {
    return Status::InvalidArgument("sum of squares by piece: bounds must start at 0");
  }
  for (int64_t i = 0; i < pieces; ++i) {
    if (bounds[i + 1] < bounds[i]) return Status::InvalidArgument("sum of squares by piece: bounds not ascending");
  }
  return pieces == 0 ? Status::Ok() : CheckArgs(isa, x, x, bounds[pieces], "sum of squares by piece");
}

}  // namespace

StatusOr<double> SumSquares(ThreadPool& pool, Isa isa, const void* x, ElementType dtype, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckArgs(isa, x, x, n, "sum of squares"));
  const int index = internal::TypeIndex(dtype);
  if (index < 0) {
    return Status::InvalidArgument("sum of squares: dtype must be f32, bf16 or f16, got " +
                                   std::string(ElementTypeName(dtype)));
  }
  if (n == 0) return 0.0;
  const internal::SumSquaresFn fn = internal::KernelsFor(isa).sum_squares[index];
  // At most kMaxSumChunks chunks, each a multiple of 64 elements: the partial
  // sums fit on the stack and their order is fixed by n alone.
  int64_t grain = (n + kMaxSumChunks - 1) / kMaxSumChunks;
  grain = grain < kChunkElems ? kChunkElems : (grain + 63) / 64 * 64;
  double partial[kMaxSumChunks];
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t size = ElementSizeBytes(dtype);
  const auto* base = static_cast<const char*>(x);
  pool.ParallelFor(n, grain,
                   [&](int64_t c, int64_t begin, int64_t end) { partial[c] = fn(base + begin * size, end - begin); });
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += partial[c];
  return sum;
}

Status SumSquaresPieces(ThreadPool& pool, Isa isa, const float* x, const int64_t* bounds, int64_t pieces, double* out) {
  ZINF_RETURN_IF_ERROR(CheckPieces(isa, x, bounds, pieces, out));
  if (pieces == 0) return Status::Ok();
  const internal::SumSquaresFn fn = internal::KernelsFor(isa).sum_squares[internal::TypeIndex(ElementType::kF32)];
  pool.ParallelFor(pieces, 64, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = fn(x + bounds[i], bounds[i + 1] - bounds[i]);
  });
  return Status::Ok();
}

Status SumSquaresPiecesSerial(Isa isa, const float* x, const int64_t* bounds, int64_t pieces, double* out) {
  ZINF_RETURN_IF_ERROR(CheckPieces(isa, x, bounds, pieces, out));
  if (pieces == 0) return Status::Ok();
  const internal::SumSquaresFn fn = internal::KernelsFor(isa).sum_squares[internal::TypeIndex(ElementType::kF32)];
  for (int64_t i = 0; i < pieces; ++i) out[i] = fn(x + bounds[i], bounds[i + 1] - bounds[i]);
  return Status::Ok();
}

Status CastFromF32(ThreadPool& pool, Isa isa, const float* src, ElementType dst_dtype, void* dst, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckArgs(isa, src, dst, n, "cast from fp32"));
  const int index = internal::TypeIndex(dst_dtype);
  if (index <= 0) {
    return Status::InvalidArgument("cast from fp32: destination must be bf16 or f16, got " +
                                   std::string(ElementTypeName(dst_dtype)));
  }
  if (n == 0) return Status::Ok();
  const internal::CastFromF32Fn fn = internal::KernelsFor(isa).from_f32[index];
  auto* out = static_cast<uint16_t*>(dst);
  pool.ParallelFor(n, kChunkElems,
                   [&](int64_t, int64_t begin, int64_t end) { fn(src + begin, out + begin, end - begin); });
  return Status::Ok();
}

Status CastToF32(ThreadPool& pool, Isa isa, const void* src, ElementType src_dtype, float* dst, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckArgs(isa, src, dst, n, "cast to fp32"));
  const int index = internal::TypeIndex(src_dtype);
  if (index <= 0) {
    return Status::InvalidArgument("cast to fp32: source must be bf16 or f16, got " +
                                   std::string(ElementTypeName(src_dtype)));
  }
  if (n == 0) return Status::Ok();
  const internal::CastToF32Fn fn = internal::KernelsFor(isa).to_f32[index];
  const auto* in = static_cast<const uint16_t*>(src);
  pool.ParallelFor(n, kChunkElems,
                   [&](int64_t, int64_t begin, int64_t end) { fn(in + begin, dst + begin, end - begin); });
  return Status::Ok();
}

Status AddScaled(ThreadPool& pool, const float* src, float scale, float* acc, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckArgs(Isa::kScalar, src, acc, n, "add scaled"));
  if (n == 0) return Status::Ok();
  pool.ParallelFor(n, kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float product = src[i] * scale;
      acc[i] += product;
    }
  });
  return Status::Ok();
}

Status SetScaled(ThreadPool& pool, const float* src, float scale, float* dst, int64_t n) {
  ZINF_RETURN_IF_ERROR(CheckArgs(Isa::kScalar, src, dst, n, "set scaled"));
  if (n == 0) return Status::Ok();
  pool.ParallelFor(n, kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    SetScaledSerial(src + begin, scale, dst + begin, end - begin);
  });
  return Status::Ok();
}

void SetScaledSerial(const float* __restrict src, float scale, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float product = src[i] * scale;
    dst[i] = 0.0f + product;
  }
}

}  // namespace zinf::optim
