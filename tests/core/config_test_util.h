// Helpers shared by the config tests.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "zinf/config.h"

namespace zinf::test_support {

// `text` parsed; a parse error fails the test, and the defaults come back.
inline Config MustParse(const std::string& text) {
  auto c = ParseConfig(text);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config{};
}

}  // namespace zinf::test_support
