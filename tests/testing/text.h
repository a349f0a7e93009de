// Text helpers the tests share: a file's bytes as a string, and how often a
// string occurs in another. Header-only, for any test target (tests/ is on
// every test's include path).
#pragma once

#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>

namespace zinf::test_support {

// The whole file at `path`, byte for byte; empty when it cannot be opened.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Occurrences of `needle` in `haystack`, overlapping ones counted.
inline size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace zinf::test_support
