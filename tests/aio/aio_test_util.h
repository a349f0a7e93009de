// Helpers for aio tests: scratch directories and random bytes.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace zinf::aio::testing {

using TempDir = zinf::test_support::TempDir;  // tests/temp_dir.h

inline void FillRandom(char* data, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(data + i, &v, 8);
  }
  for (; i < n; ++i) data[i] = static_cast<char>(rng());
}

inline std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::vector<char> v(n);
  FillRandom(v.data(), n, seed);
  return v;
}

}  // namespace zinf::aio::testing
