// Seeded fault injection for the data plane (leveldb's fault env,
// tigerbeetle's testing/storage), for aio tests and for the layers above
// (swap, checkpoint): they build a FaultyEngine instead of an IoEngine.
//
// Two levels:
//   * FaultInjector (a CompletionHook) sits between the kernel and the real
//     completion handler of the wrapped engine, so injected faults exercise
//     the code that handles real ones: EIO (fails the request), EAGAIN and
//     EINTR (resubmitted), short transfers (continued), delayed completions
//     (held for a few reap rounds so later pieces overtake them; io_uring
//     only). The kernel did transfer the bytes; the injector only changes
//     what the engine is told, which is exactly what makes a missing retry or
//     a dropped remainder show up as wrong bytes in a test.
//   * FaultyEngine wraps the engine and adds what a completion cannot
//     express: torn writes (only a block-aligned prefix reaches the file, the
//     request fails) and Crash(), which drops every write not yet made
//     durable by Sync() (optionally keeping or tearing some of them).
//
// Determinism: every decision is a hash of (seed, epoch, op, file, offset,
// remaining length, retry count) -- not of thread timing -- so a seed
// replays the same faults whatever the interleaving of worker threads.
// Torn-write decisions also hash the write's submission number, which is
// deterministic for a single submitting thread. Bump the epoch (NextEpoch)
// to get fresh decisions for a repeated access pattern.
//
// FaultyEngine allocates per write (it keeps the bytes a write overwrote so
// Crash can restore them): it is a test engine, not a hot path.
//
// Thread-safety: as IoEngine. Crash() must not race with Submit.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aio/completion.h"
#include "aio/file.h"
#include "aio/io_engine.h"

namespace zinf::aio {

struct FaultOptions {
  uint64_t seed = 1;
  // Per piece completion (each in [0, 1], their sum at most 1).
  double eio_rate = 0;     // the piece fails with EIO
  double short_rate = 0;   // the piece reports a block-aligned part of its bytes
  double eagain_rate = 0;  // the piece reports EAGAIN
  double eintr_rate = 0;   // the piece reports EINTR
  double delay_rate = 0;   // the completion is held 1..max_delay_rounds reap rounds
  int max_delay_rounds = 4;
  // Per write request: only a block-aligned prefix is written, the request fails.
  double torn_write_rate = 0;
  // At Crash(), per write not yet synced (the rest are dropped):
  double crash_keep_rate = 0;  // the whole write survives
  double crash_tear_rate = 0;  // a block-aligned prefix survives
  // Inject only into files whose path contains this (empty: every file).
  std::string path_filter;
};

// How many faults of each kind have been injected so far.
struct FaultCounts {
  int64_t eio = 0;
  int64_t short_io = 0;
  int64_t eagain = 0;
  int64_t eintr = 0;
  int64_t delayed = 0;
  int64_t torn_writes = 0;
  int64_t crash_dropped = 0;
  int64_t crash_kept = 0;
  int64_t crash_torn = 0;
  int64_t total() const { return eio + short_io + eagain + eintr + delayed + torn_writes; }
};

// A uniform double in [0, 1) from a seed and a list of values (splitmix64).
double FaultHash(uint64_t seed, std::initializer_list<uint64_t> values);

class FaultInjector final : public CompletionHook {
 public:
  explicit FaultInjector(FaultOptions options) : options_(std::move(options)) {}
  Decision OnCompletion(const Piece& piece, const FileInfo& file, int64_t res) override;

  const FaultOptions& options() const { return options_; }
  void set_enabled(bool on) { enabled_.store(on); }
  bool enabled() const { return enabled_.load(); }
  void NextEpoch() { epoch_.fetch_add(1); }
  uint64_t epoch() const { return epoch_.load(); }
  bool Applies(const FileInfo& file) const;
  FaultCounts counts() const;

 private:
  friend class FaultyEngine;
  FaultOptions options_;
  std::atomic<bool> enabled_{true};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int64_t> eio_{0}, short_{0}, eagain_{0}, eintr_{0}, delayed_{0}, torn_{0};
  std::atomic<int64_t> crash_dropped_{0}, crash_kept_{0}, crash_torn_{0};
};

class FaultyEngine final : public IoEngine {
 public:
  // Builds the inner engine from `inner` (any kind) with the injector as its
  // completion hook.
  static StatusOr<std::unique_ptr<FaultyEngine>> Create(const IoEngineOptions& inner, const FaultOptions& faults);

  std::string_view name() const override { return name_; }
  const IoEngineOptions& options() const override { return inner_->options(); }
  StatusOr<FileId> OpenFile(const std::string& path, const OpenOptions& open) override;
  Status CloseFile(FileId file) override;
  const FileInfo& file_info(FileId file) const override { return inner_->file_info(file); }
  Status RegisterMemory(void* base, size_t bytes) override { return inner_->RegisterMemory(base, bytes); }
  using IoEngine::Submit;
  StatusOr<IoTicket> Submit(IoOp op, std::span<const IoSegment> segments) override;
  Status Wait(IoTicket ticket) override;
  bool IsDone(IoTicket ticket) override { return inner_->IsDone(ticket); }
  Status WaitAll() override;
  Status Sync(FileId file) override;
  StatusOr<int64_t> FileSize(FileId file) override { return inner_->FileSize(file); }
  Status Truncate(FileId file, int64_t size_bytes) override;
  Status Allocate(FileId file, int64_t size_bytes) override;
  Status sticky_error() const override;
  IoQueueTime queue_time() const override { return inner_->queue_time(); }

  // Simulates power loss: waits for outstanding requests, then every write
  // since the file's last Sync is undone (or kept / torn, per the options),
  // and files shrink back to their synced size. The engine stays usable.
  Status Crash();

  FaultInjector& injector() { return *injector_; }
  IoEngine& inner() { return *inner_; }

 private:
  FaultyEngine() = default;
  struct Unsynced {
    int64_t offset;
    int64_t length;
    std::string old_bytes;  // what the write overwrote (shorter at EOF)
  };
  struct Tracked {
    File aux;                 // buffered descriptor for capture and restore
    int64_t synced_size = 0;  // size at the last Sync (or open)
    std::vector<Unsynced> writes;
  };
  Status CaptureBeforeWrite(const IoSegment& seg);  // mu_ held

  std::string name_;
  std::shared_ptr<FaultInjector> injector_;
  std::unique_ptr<IoEngine> inner_;
  mutable std::mutex mu_;
  std::map<FileId, Tracked> tracked_;
  std::map<uint64_t, Status> torn_;  // ticket id -> the error its Wait returns
  uint64_t write_seq_ = 0;
  Status sticky_;
};

}  // namespace zinf::aio
