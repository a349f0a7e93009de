// Helpers for swap tests: scratch directories, engines, pools, patterns.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir.h"

#include "aio/fault_engine.h"
#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "core/fs.h"
#include "optim/thread_pool.h"

namespace zinf::swap::testing {

using TempDir = zinf::test_support::TempDir;  // tests/temp_dir.h

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

// The optimizer's thread pool as the swap tests run it: two threads, not
// bound to cores (ctest runs tests side by side).
inline std::unique_ptr<optim::ThreadPool> MakeThreads() {
  optim::ThreadPool::Options o;
  o.num_threads = 2;
  o.bind_threads = false;
  auto pool = optim::ThreadPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

// `n` floats from a normal distribution of mean 0 and `stddev`, seeded.
inline std::vector<float> RandomFloats(int64_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
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

// The wrapped engine, counting the read and write requests it is given, except that
// while `hold` is set a write it was given never reads as done (IsDone);
// Wait still waits for the real one. Lets a test see what a swapper does
// with a write-back that has not landed, and how often it reads.
// Thread-compatible: one thread submits and waits.
class HeldWritesEngine final : public aio::IoEngine {
 public:
  explicit HeldWritesEngine(aio::IoEngine* inner) : inner_(inner) {}
  bool hold = false;
  int64_t reads = 0;   // read requests submitted
  int64_t writes = 0;  // write requests submitted

  std::string_view name() const override { return inner_->name(); }
  const aio::IoEngineOptions& options() const override { return inner_->options(); }
  StatusOr<aio::FileId> OpenFile(const std::string& path, const aio::OpenOptions& open) override {
    return inner_->OpenFile(path, open);
  }
  Status CloseFile(aio::FileId file) override { return inner_->CloseFile(file); }
  const aio::FileInfo& file_info(aio::FileId file) const override { return inner_->file_info(file); }
  Status RegisterMemory(void* base, size_t bytes) override { return inner_->RegisterMemory(base, bytes); }
  using IoEngine::Submit;
  StatusOr<aio::IoTicket> Submit(aio::IoOp op, std::span<const aio::IoSegment> segments) override {
    auto t = inner_->Submit(op, segments);
    if (t.ok() && op == aio::IoOp::kWrite) {
      writes_.insert(t->id);
      ++writes;
    }
    if (t.ok() && op == aio::IoOp::kRead) ++reads;
    return t;
  }
  Status Wait(aio::IoTicket ticket) override {
    writes_.erase(ticket.id);
    return inner_->Wait(ticket);
  }
  bool IsDone(aio::IoTicket ticket) override {
    if (hold && writes_.count(ticket.id) > 0) return false;
    return inner_->IsDone(ticket);
  }
  Status WaitAll() override { return inner_->WaitAll(); }
  Status Sync(aio::FileId file) override { return inner_->Sync(file); }
  StatusOr<int64_t> FileSize(aio::FileId file) override { return inner_->FileSize(file); }
  Status Truncate(aio::FileId file, int64_t size_bytes) override { return inner_->Truncate(file, size_bytes); }
  Status Allocate(aio::FileId file, int64_t size_bytes) override { return inner_->Allocate(file, size_bytes); }
  Status sticky_error() const override { return inner_->sticky_error(); }

 private:
  aio::IoEngine* inner_;
  std::set<uint64_t> writes_;
};

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
