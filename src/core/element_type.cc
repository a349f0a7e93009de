#include "zinf/element_type.h"

#include <string>

namespace zinf {

int ElementSizeBytes(ElementType type) {
  switch (type) {
    case ElementType::kF32: return 4;
    case ElementType::kF16: return 2;
    case ElementType::kBf16: return 2;
    case ElementType::kF64: return 8;
    case ElementType::kU8: return 1;
    case ElementType::kI64: return 8;
  }
  return 0;
}

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kF32: return "f32";
    case ElementType::kF16: return "f16";
    case ElementType::kBf16: return "bf16";
    case ElementType::kF64: return "f64";
    case ElementType::kU8: return "u8";
    case ElementType::kI64: return "i64";
  }
  return "?";
}

StatusOr<ElementType> ParseElementType(std::string_view name) {
  struct Alias {
    std::string_view name;
    ElementType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", ElementType::kF32},    {"fp32", ElementType::kF32},  {"float32", ElementType::kF32},
      {"f16", ElementType::kF16},    {"fp16", ElementType::kF16},  {"float16", ElementType::kF16},
      {"half", ElementType::kF16},   {"bf16", ElementType::kBf16}, {"bfloat16", ElementType::kBf16},
      {"f64", ElementType::kF64},    {"fp64", ElementType::kF64},  {"float64", ElementType::kF64},
      {"double", ElementType::kF64}, {"u8", ElementType::kU8},     {"uint8", ElementType::kU8},
      {"i64", ElementType::kI64},    {"int64", ElementType::kI64},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.type;
  }
  return Status::InvalidArgument("unknown element type '" + std::string(name) +
                                 "' (expected f32, f16, bf16, f64, u8 or i64)");
}

}  // namespace zinf
