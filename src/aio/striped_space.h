// StripedSpace: one logical byte range striped over files on 1..N paths (one
// per drive), the swap space the swap layer carves extents from.
//
// Layout: logical stripe s (stripe_bytes long) lives on path s % N at file
// offset (s / N) * stripe_bytes, RAID-0 style. Each path has its own IoEngine
// (thread_count rings of its own), so a request that spans several stripes
// keeps every drive busy at once. Each path's file is sized (and, by default,
// fallocated) at Open so a later write cannot fail with ENOSPC and a read of a
// never-written range returns zeros instead of hitting end of file.
//
// Two ways in:
//   * Submit/Wait: asynchronous, aligned (offset, length and buffer multiples
//     of alignment_bytes(), the largest O_DIRECT alignment of the paths).
//     The hot path; buffers should come from a PinnedPool registered with
//     RegisterMemory.
//   * Read/Write: synchronous and byte-granular: any offset, length and
//     caller pointer. Goes through an internal pinned bounce buffer; a write
//     that covers a block only in part reads the block first
//     (read-modify-write). For metadata, headers and tails, not bulk data.
//
// Thread-safety: Submit, Wait, IsDone, WaitAll from any thread. Read and
// Write may be called from any thread (serialised on the bounce buffer);
// concurrent writes to overlapping ranges are the caller's race, as are
// Read/Write of a range with an aligned request in flight.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"

namespace zinf::aio {

struct StripedSpaceOptions {
  std::vector<std::string> dirs;         // one directory per drive
  std::string file_name = "zinf.swap";   // created in each directory
  int64_t capacity_bytes = 0;            // logical size, rounded up to whole stripes
  int64_t stripe_bytes = 1 << 20;        // a multiple of every path's alignment
  bool preallocate = true;               // fallocate each file at Open
  bool truncate = false;                 // start from an empty file
  IoEngineOptions engine;                // each path's engine
  int64_t bounce_bytes = 4 << 20;        // Read/Write bounce buffer
};

// Makes the engine for path `index`; the default is CreateIoEngine(options).
// Tests pass one that returns FaultyEngines.
using EngineFactory =
    std::function<StatusOr<std::unique_ptr<IoEngine>>(int index, const IoEngineOptions& options)>;

class StripedSpace {
 public:
  static constexpr int kMaxPaths = 16;

  // Opens (creating) `file_name` in every dir. kInvalidArgument for bad
  // options (naming the option), kNotFound for a missing dir, kNoSpace when
  // a drive cannot hold its share.
  static StatusOr<std::unique_ptr<StripedSpace>> Open(const StripedSpaceOptions& options,
                                                      EngineFactory factory = {});
  // Waits for outstanding requests.
  ~StripedSpace();
  StripedSpace(const StripedSpace&) = delete;
  StripedSpace& operator=(const StripedSpace&) = delete;

  int64_t capacity_bytes() const { return capacity_; }
  int64_t alignment_bytes() const { return alignment_; }
  int64_t stripe_bytes() const { return stripe_; }
  int path_count() const { return static_cast<int>(paths_.size()); }
  const std::string& file_path(int index) const { return paths_[index].path; }
  IoEngine& engine(int index) { return *paths_[index].engine; }

  // Registers caller memory (a PinnedPool's region) with every path's engine.
  Status RegisterMemory(void* base, size_t bytes);

  // Aligned asynchronous transfer of [offset, offset+length) of the logical
  // space. kInvalidArgument for misalignment or a range past capacity (naming
  // offset and length); otherwise as IoEngine::Submit.
  StatusOr<IoTicket> Submit(IoOp op, int64_t offset, void* buffer, int64_t length);
  Status Wait(IoTicket ticket);
  bool IsDone(IoTicket ticket);
  Status WaitAll();

  // Synchronous, byte-granular (see the file comment).
  Status Read(int64_t offset, void* dst, int64_t length);
  Status Write(int64_t offset, const void* src, int64_t length);

  // fdatasync on every path.
  Status Sync();

 private:
  StripedSpace() = default;
  struct Path {
    std::string path;
    std::unique_ptr<IoEngine> engine;
    FileId file = -1;
  };
  struct Compound {
    bool in_use = false;
    uint32_t generation = 1;
    std::array<IoTicket, kMaxPaths> tickets{};  // by path; invalid where unused
  };
  Status CheckRange(std::string_view op, int64_t offset, int64_t length) const;
  uint32_t SlotOf(IoTicket ticket) const;  // mu_ held; checks the ticket
  Status Transfer(IoOp op, int64_t offset, char* data, int64_t length);  // bounce_mu_ held

  std::vector<Path> paths_;
  int64_t capacity_ = 0;
  int64_t stripe_ = 0;
  int64_t alignment_ = 0;
  int64_t per_path_bytes_ = 0;

  std::mutex mu_;
  std::vector<Compound> compounds_;
  std::vector<uint32_t> free_;
  std::vector<std::vector<IoSegment>> scratch_;  // per path; capacity reused

  std::mutex bounce_mu_;
  std::unique_ptr<PinnedPool> bounce_pool_;
};

}  // namespace zinf::aio
