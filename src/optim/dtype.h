// Element types the optimizer reads and writes, and exact scalar conversions.
//
// The optimizer state (master weights, Adam m and v) is always fp32; gradients
// arrive as fp32, bf16 or fp16, and the new parameters leave as bf16 or fp16.
// The scalar conversions here are the reference every vector path matches bit
// for bit (tests/optim/convert_test.cc):
//   * fp32 -> bf16 / fp16 round to nearest, ties to even; values past the
//     largest finite 16-bit value (after rounding) become Inf of the same sign;
//     fp16 keeps subnormals (no flush to zero).
//   * NaN stays NaN: fp32 -> 16 bit keeps the sign and the top payload bits
//     and sets the quiet bit (what x86 F16C does); fp16 -> fp32 likewise sets
//     the quiet bit; bf16 -> fp32 is a plain 16-bit shift (exact, payload kept).
//   * 16 bit -> fp32 is exact.
// 16-bit values travel as raw bits in uint16_t.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "zinf/status.h"

namespace zinf::optim {

// The numbering is used to index kernel tables; keep kF32 first.
enum class DType : int { kF32 = 0, kBf16 = 1, kF16 = 2 };

// "fp32", "bf16", "fp16".
std::string_view DTypeName(DType dtype);
// Accepts "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"/"half".
StatusOr<DType> ParseDType(std::string_view name);
// Bytes per element: 4 or 2.
int DTypeSizeBytes(DType dtype);

uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

}  // namespace zinf::optim
