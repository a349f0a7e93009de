// The tests' scratch directory: a fresh directory under $TMPDIR (or /tmp),
// removed with its contents by std::filesystem (not by zinf's own
// RemoveTree, which core's tests check). One for every test folder.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace zinf::test_support {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "zinf-test") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // A path inside the directory (not created).
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }
  std::string File(const std::string& name) const { return Sub(name); }

 private:
  std::string path_;
};

}  // namespace zinf::test_support
