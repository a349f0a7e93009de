// Helpers for swap tests: scratch directories, engines, pools, patterns.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aio/fault_engine.h"
#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "core/fs.h"

namespace zinf::swap::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/zinf-swap-test.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() { RemoveTree(path_).IgnoreError(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline aio::IoEngineOptions EngineOptions(aio::EngineKind kind = aio::EngineKind::kAuto) {
  aio::IoEngineOptions o;
  o.kind = kind;
  o.direct_io = aio::DirectIo::kPrefer;
  o.block_size_bytes = 64 << 10;  // small pieces: many per request
  o.queue_depth = 8;
  o.thread_count = 2;
  return o;
}

inline std::unique_ptr<aio::IoEngine> MakeEngine(aio::EngineKind kind = aio::EngineKind::kAuto) {
  auto e = aio::CreateIoEngine(EngineOptions(kind));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

inline std::unique_ptr<aio::FaultyEngine> MakeFaultyEngine(const aio::FaultOptions& faults,
                                                           aio::EngineKind kind = aio::EngineKind::kAuto) {
  auto e = aio::FaultyEngine::Create(EngineOptions(kind), faults);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

inline std::unique_ptr<aio::PinnedPool> MakePool(int64_t count, int64_t bytes) {
  aio::PinnedPoolOptions o;
  o.buffer_count = count;
  o.buffer_bytes = bytes;
  o.alignment_bytes = 4096;
  o.name = "swap test pool";
  auto p = aio::PinnedPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

inline void FillRandom(void* data, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* p = static_cast<char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<char>(rng());
}

inline std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  FillRandom(v.data(), n, seed);
  return v;
}

// Overwrites `n` bytes of `path` at `offset` behind zinf's back.
inline void CorruptFile(const std::string& path, int64_t offset, int64_t n = 1) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fseek(f, offset, SEEK_SET), 0);
  std::vector<unsigned char> bytes(static_cast<size_t>(n));
  ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
  for (auto& b : bytes) b ^= 0x5a;
  ASSERT_EQ(std::fseek(f, offset, SEEK_SET), 0);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

}  // namespace zinf::swap::testing
