// ElementType: the one enumeration of element types in zinf, shared by every
// layer (the engine's parameters and gradients, the optimizer's arrays, the
// collectives, the kernels' casts).
//
// A layer that handles only some types says which in its own contract and
// rejects the others (kInvalidArgument); the numeric values are not an index
// into anything, so a layer that keeps per-type tables maps the types it
// takes itself.
//
// Names are the short lower-case ones ("f32", "f16", "bf16", "f64", "u8",
// "i64"); checkpoint manifests store them, so they never change.
//
// Plain C++17 (CUDA sources include it through the kernels' headers).
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "zinf/status.h"

namespace zinf {

enum class ElementType { kF32, kF16, kBf16, kF64, kU8, kI64 };

// Bytes per element: 4, 2, 2, 8, 1, 8.
int ElementSizeBytes(ElementType type);

// "f32", "f16", "bf16", "f64", "u8", "i64".
std::string_view ElementTypeName(ElementType type);

// The type named `name`: the names above, and the aliases "fp32", "float32",
// "fp16", "float16", "half", "bfloat16", "fp64", "float64", "double",
// "uint8", "int64". kInvalidArgument naming `name` otherwise.
StatusOr<ElementType> ParseElementType(std::string_view name);

}  // namespace zinf
