// PinnedPool: a fixed number of fixed-size, aligned, page-locked host buffers,
// leased as move-only RAII objects.
//
// All memory is mapped once, at Create: one region (huge-page backed where
// the kernel allows), pre-faulted, bound to the
// NUMA node of the calling thread's CPU (hwloc) and page-locked with
// PinHostMemory (cudaHostRegister when a GPU is present, mlock otherwise).
// Leasing never allocates: it pops a free-list entry. When every buffer is
// leased, TryAcquire reports kResourceExhausted (and how many are out)
// instead of allocating; Acquire blocks until one is returned.
//
// Register region() with an IoEngine (RegisterMemory) so its pieces use
// io_uring fixed buffers.
//
// Thread-safety: every method may be called from any thread. A lease may be
// moved to and released on any thread. The pool must outlive its leases
// (checked at destruction).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::aio {

class PinnedPool;

// One leased buffer; returns itself to its pool when destroyed or Reset.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  explicit operator bool() const { return pool_ != nullptr; }
  char* data() const { return data_; }
  // Capacity of the buffer in bytes (the pool's buffer_bytes).
  int64_t size() const { return size_; }
  std::span<char> span() const { return {data_, static_cast<size_t>(size_)}; }
  // Index of this buffer within its pool.
  int index() const { return index_; }
  // Gives the buffer back early.
  void Reset();

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, char* data, int64_t size, int index)
      : pool_(pool), data_(data), size_(size), index_(index) {}

  PinnedPool* pool_ = nullptr;
  char* data_ = nullptr;
  int64_t size_ = 0;
  int index_ = -1;
};

struct PinnedPoolOptions {
  int64_t buffer_count = 4;
  int64_t buffer_bytes = 1 << 20;  // rounded up to alignment_bytes
  int64_t alignment_bytes = 4096;  // power of two, at least the O_DIRECT alignment
  // Pin the memory. When pinning fails (RLIMIT_MEMLOCK), the pool works
  // unpinned and logs once, unless require_pinned.
  bool pin = true;
  bool require_pinned = false;
  // Back the pool with transparent huge pages (2 MiB aligned, MADV_HUGEPAGE).
  // A buffer then spans few physical segments, so the block layer does not
  // split a large O_DIRECT request at the device's max_segments (e.g. 254
  // on virtio-blk: a 1 MiB request in 4 KiB pages needs 256) -- worth 2x on
  // such devices. Ignored where THP is off.
  bool huge_pages = true;
  // NUMA node to bind to; -1 picks the node of the calling thread's CPU.
  int numa_node = -1;
  std::string name = "pinned pool";  // for messages
};

class PinnedPool {
 public:
  // kInvalidArgument for a bad size or alignment, kOutOfMemory when the
  // mapping fails, kUnavailable when require_pinned and pinning fails.
  static StatusOr<std::unique_ptr<PinnedPool>> Create(const PinnedPoolOptions& options);
  // Bytes the pool Create makes from `options` maps (region().size()): each
  // buffer rounded up to the alignment, the whole to pages or huge pages.
  static int64_t MappedBytes(const PinnedPoolOptions& options);
  // Bytes mapped by every pool of the process alive now: what a test
  // compares with a plan of the host windows. Thread-safe.
  static int64_t LiveMappedBytes();
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A free buffer, or kResourceExhausted naming the pool and its size.
  StatusOr<PinnedBuffer> TryAcquire();
  // A free buffer able to hold `bytes`: kInvalidArgument when `bytes` exceeds
  // buffer_bytes, kResourceExhausted when none is free.
  StatusOr<PinnedBuffer> TryAcquire(int64_t bytes);
  // Blocks until a buffer is free. Deadlocks if the caller holds them all.
  PinnedBuffer Acquire();

  int64_t buffer_count() const { return count_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }
  int64_t alignment_bytes() const { return alignment_; }
  int64_t free_count() const;
  bool pinned() const { return pinned_; }
  int numa_node() const { return numa_node_; }
  // All buffers, contiguous: hand to IoEngine::RegisterMemory.
  std::span<char> region() const { return {base_, static_cast<size_t>(mapped_bytes_)}; }

 private:
  friend class PinnedBuffer;
  PinnedPool() = default;
  void Release(int index);
  PinnedBuffer Lease();  // mu_ held, free_ non-empty

  std::string name_;
  char* base_ = nullptr;
  int64_t mapped_bytes_ = 0;
  int64_t count_ = 0;
  int64_t buffer_bytes_ = 0;
  int64_t stride_ = 0;
  int64_t alignment_ = 0;
  bool pinned_ = false;
  int numa_node_ = -1;
  mutable std::mutex mu_;
  std::condition_variable freed_cv_;
  std::vector<int> free_;  // capacity count_, reserved at Create
};

}  // namespace zinf::aio
