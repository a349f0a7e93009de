// ISA names, CPU detection and the ZINF_ADAM_ISA override.
#include "optim/isa.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "optim_test_util.h"

namespace zinf::optim {
namespace {

TEST(IsaTest, NamesRoundTrip) {
  for (Isa isa : testing::AllIsas()) {
    auto parsed = ParseIsa(IsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(ParseIsa("sse9").status().code(), StatusCode::kInvalidArgument);
}

TEST(IsaTest, BestIsaIsSupportedAndScalarAlwaysIs) {
  EXPECT_TRUE(CpuSupports(Isa::kScalar));
  EXPECT_TRUE(CpuSupports(BestIsa()));
  if (CpuSupports(Isa::kAvx512)) {
    EXPECT_TRUE(CpuSupports(Isa::kAvx2));
  }
}

TEST(IsaTest, EnvironmentOverridesTheDefault) {
  const char* old = std::getenv("ZINF_ADAM_ISA");
  const std::string saved = old ? old : "";
  unsetenv("ZINF_ADAM_ISA");
  EXPECT_EQ(*DefaultIsa(), BestIsa());
  setenv("ZINF_ADAM_ISA", "scalar", 1);
  EXPECT_EQ(*DefaultIsa(), Isa::kScalar);
  setenv("ZINF_ADAM_ISA", "bogus", 1);
  EXPECT_EQ(DefaultIsa().status().code(), StatusCode::kInvalidArgument);
  for (Isa isa : testing::AllIsas()) {
    setenv("ZINF_ADAM_ISA", std::string(IsaName(isa)).c_str(), 1);
    EXPECT_EQ(DefaultIsa().ok(), CpuSupports(isa)) << IsaName(isa);
    if (!CpuSupports(isa)) {
      EXPECT_EQ(DefaultIsa().status().code(), StatusCode::kUnavailable);
    }
  }
  if (old)
    setenv("ZINF_ADAM_ISA", saved.c_str(), 1);
  else
    unsetenv("ZINF_ADAM_ISA");
}

}  // namespace
}  // namespace zinf::optim
