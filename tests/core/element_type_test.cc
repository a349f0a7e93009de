// ElementType (include/zinf/element_type.h): sizes, names, parsing.
#include "zinf/element_type.h"

#include <string>

#include <gtest/gtest.h>

namespace zinf {
namespace {

constexpr ElementType kAll[] = {ElementType::kF32, ElementType::kF16, ElementType::kBf16,
                                ElementType::kF64, ElementType::kU8,  ElementType::kI64};

TEST(ElementTypeTest, Sizes) {
  EXPECT_EQ(ElementSizeBytes(ElementType::kF32), 4);
  EXPECT_EQ(ElementSizeBytes(ElementType::kF16), 2);
  EXPECT_EQ(ElementSizeBytes(ElementType::kBf16), 2);
  EXPECT_EQ(ElementSizeBytes(ElementType::kF64), 8);
  EXPECT_EQ(ElementSizeBytes(ElementType::kU8), 1);
  EXPECT_EQ(ElementSizeBytes(ElementType::kI64), 8);
}

TEST(ElementTypeTest, NamesAreTheManifestOnes) {
  // Checkpoint manifests store these strings: they must not change.
  EXPECT_EQ(ElementTypeName(ElementType::kF32), "f32");
  EXPECT_EQ(ElementTypeName(ElementType::kF16), "f16");
  EXPECT_EQ(ElementTypeName(ElementType::kBf16), "bf16");
  EXPECT_EQ(ElementTypeName(ElementType::kF64), "f64");
  EXPECT_EQ(ElementTypeName(ElementType::kU8), "u8");
  EXPECT_EQ(ElementTypeName(ElementType::kI64), "i64");
}

TEST(ElementTypeTest, NamesRoundTrip) {
  for (ElementType t : kAll) {
    auto parsed = ParseElementType(ElementTypeName(t));
    ASSERT_TRUE(parsed.ok()) << ElementTypeName(t);
    EXPECT_EQ(*parsed, t);
  }
}

TEST(ElementTypeTest, ParsesAliases) {
  const struct {
    const char* name;
    ElementType type;
  } cases[] = {{"fp32", ElementType::kF32},    {"float32", ElementType::kF32}, {"fp16", ElementType::kF16},
               {"float16", ElementType::kF16}, {"half", ElementType::kF16},    {"bfloat16", ElementType::kBf16},
               {"fp64", ElementType::kF64},    {"double", ElementType::kF64},  {"uint8", ElementType::kU8},
               {"int64", ElementType::kI64}};
  for (const auto& c : cases) {
    auto parsed = ParseElementType(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name;
    EXPECT_EQ(*parsed, c.type) << c.name;
  }
}

TEST(ElementTypeTest, RejectsUnknownNamesNamingThem) {
  for (const char* bad : {"int8", "", "F32", "bf", "f32 "}) {
    auto parsed = ParseElementType(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("'" + std::string(bad) + "'"), std::string::npos)
        << parsed.status().message();
  }
}

}  // namespace
}  // namespace zinf
