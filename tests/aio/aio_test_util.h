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

namespace zinf::aio::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/zinf-aio-test.XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

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
