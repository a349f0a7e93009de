// Checkpoint: a rank's named state saved crash-safely and loaded verified.
//
// Nothing below zero3 knows what a parameter is, so a checkpoint is a set of
// opaque named byte blobs (master weights, Adam m and v, loss-scaler and
// scheduler state, the config text, the data position, ...) plus small
// key/value metadata (step, format notes). Each blob is read from wherever it
// lives: a RAM buffer or a SwapStore tensor.
//
// On disk, a checkpoint is a directory:
//   manifest        "zinf-checkpoint <version> <body bytes> <body crc32c>\n" then
//                   a JSON body (metadata; per blob: name, file, size, crc32c
//                   of the whole blob and of every chunk), zero-padded to the
//                   alignment
//   blob-00000.bin  one file per blob, zero-padded to the alignment
// and the parent directory may hold `latest`, a one-line pointer file naming
// the newest complete checkpoint directory.
//
// Save writes everything into a NEW directory `<dir>.tmp-<random>`, fsyncs
// every file and the directory, renames it to `<dir>` and fsyncs the parent;
// then (optionally) writes `latest.tmp-<random>`, fsyncs it, renames it over
// `latest` and fsyncs the parent. A crash at any point leaves the previous
// checkpoint and the previous `latest` untouched; the newest one appears
// whole or not at all. `<dir>` must not exist yet (checkpoints are never
// overwritten in place). Leftover `<dir>.tmp-*` directories from a crashed
// save are removed by the next Save of the same `<dir>`.
//
// Load (CheckpointReader) parses and checks the manifest (version, crc,
// every file present with the size the manifest says), can verify every
// blob's chunk crcs before anything is restored, and reads blobs into RAM or
// SwapStore tensors, verifying as it reads. Everything wrong is refused with
// kCorruption (or kNotFound for a missing manifest, kFailedPrecondition for
// another format version) naming the file and, for data, the offset.
//
// Every byte goes through the aio::IoEngine given, in buffers leased from the
// given aio::PinnedPool (at least one buffer, two for overlap; buffers of at
// least the SwapStore's stripe size when swap tensors are involved).
// Renames, directory fsyncs and unlinks are filesystem metadata (core/fs.h).
// Where a training run puts its checkpoints, and the rules of those folders
// (`latest`, pruning, orphans, resume): checkpoint_dirs.h.
//
// Thread-safety: functions and CheckpointReader are thread-compatible: use
// one object from one thread at a time. Two concurrent Saves must target
// different directories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "core/progress.h"
#include "swap/swap_store.h"
#include "zinf/status.h"

namespace zinf::swap {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kLatestFileName[] = "latest";

// Where a blob's bytes are: a RAM buffer, or a SwapStore tensor (all of it).
struct BlobRef {
  std::string name;
  std::span<std::byte> ram;  // used when store is null
  SwapStore* store = nullptr;
  TensorId tensor = -1;

  static BlobRef Ram(std::string name, std::span<std::byte> bytes) { return {std::move(name), bytes, nullptr, -1}; }
  static BlobRef Ram(std::string name, std::span<const std::byte> bytes) {
    return {std::move(name), {const_cast<std::byte*>(bytes.data()), bytes.size()}, nullptr, -1};
  }
  static BlobRef Swap(std::string name, SwapStore* store, TensorId tensor) {
    return {std::move(name), {}, store, tensor};
  }
  // Bytes in the blob.
  int64_t size_bytes() const;
};

struct SaveOptions {
  // Rewrite `<parent of dir>/latest` to name this checkpoint once it is in place.
  bool update_latest = true;
  // An existing `dir` is an error, unless this is set and `latest` does not
  // name it: then it is the orphan of a run killed between renaming it into
  // place and updating `latest`, since resumed from `latest`, and is
  // replaced (with a warning). The checkpoint `latest` names is never
  // replaced.
  bool replace_orphan = false;
  // Bytes per checksummed chunk (a multiple of the pool's alignment; a
  // multiple of the stripe for swap tensors). 0: the pool's buffer size.
  int64_t chunk_bytes = 0;
  // Test hook: called after each file is complete and synced (blob files,
  // then the manifest), after the rename into place, and after `latest` is
  // renamed, with the path concerned. Used by crash tests; null otherwise.
  std::function<void(const std::string& path)> after_step;
  // Called on the saving thread as blob bytes are written: (bytes done, all
  // blob bytes), first with 0 and last with the total once `dir` is in place.
  // Null: no report.
  ProgressFn progress;
};

// Saves `metadata` and `blobs` as checkpoint `dir` (see the file comment).
// Blob names must be unique and non-empty; metadata keys and values must be
// valid UTF-8. A swap blob must be fully written in its store, and no
// swap-out of it may be outstanding. Needs one free pool buffer (blocks until
// one is free) and uses a second one for overlap when it is free. On an error
// before the rename, `dir` does not exist and the temporary directory is
// removed (best effort); on an error while updating `latest`, `dir` is
// complete and loadable but `latest` still names the previous checkpoint.
Status SaveCheckpoint(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& dir,
                      const std::map<std::string, std::string>& metadata, const std::vector<BlobRef>& blobs,
                      const SaveOptions& options = {});

// The checkpoint directory `<root>/latest` names, as a path; kNotFound when
// there is none, kCorruption when the pointer file is damaged.
StatusOr<std::string> ResolveLatest(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& root);

struct BlobInfo {
  std::string name;
  std::string file;  // path of the blob's file
  int64_t size_bytes = 0;
  uint32_t crc32c = 0;                 // of the whole blob
  std::vector<uint32_t> chunk_crc32c;  // per chunk of chunk_bytes
};

class CheckpointReader {
 public:
  // Reads and checks the manifest and every blob file's size. Errors:
  // kNotFound (no directory or no manifest: not a checkpoint, or a partial
  // one), kFailedPrecondition (another format version), kCorruption (bad
  // manifest crc or syntax, a missing or truncated blob file).
  static StatusOr<CheckpointReader> Open(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<BlobInfo>& blobs() const { return blobs_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // kNotFound naming the checkpoint when there is no blob `name`.
  StatusOr<const BlobInfo*> Find(const std::string& name) const;

  // Reads every blob and checks every chunk crc; writes nothing.
  Status VerifyAll() const;
  // Reads blob `target.name` into target.ram or target.store's tensor; the
  // sizes must match. Verifies each chunk as it is read; on kCorruption the
  // destination holds a partial copy.
  Status ReadBlob(const BlobRef& target) const;
  // Streams blob `name` to `sink` in pieces (offset in the blob, bytes,
  // length), in order, verifying each chunk as it is read: on kCorruption
  // the sink may already have had the damaged piece. For a reader that
  // places a blob's bytes itself (a forward-only engine's master weights).
  Status ReadBlobPieces(const std::string& name,
                        const std::function<Status(int64_t offset, const char* data, int64_t n)>& sink) const;
  // VerifyAll, then ReadBlob for each target: a damaged checkpoint is found
  // before any destination is touched.
  // `progress`, when set, hears (bytes done, total) as the blobs are verified
  // and then read (the total counts each blob twice), on this thread.
  Status Restore(const std::vector<BlobRef>& targets, const ProgressFn& progress = {}) const;

 private:
  CheckpointReader(aio::IoEngine& engine, aio::PinnedPool& pool) : engine_(&engine), pool_(&pool) {}
  // Streams blob `info` through a pool buffer in pieces that are multiples
  // of `granule_bytes`, checking every chunk crc; `sink` (may be null)
  // receives each piece (offset in the blob, bytes, length; the buffer holds
  // the length rounded up to the alignment, zero-padded).
  // Restore's progress, while it runs: bytes streamed so far.
  mutable const ProgressFn* progress_ = nullptr;
  mutable int64_t progress_done_ = 0, progress_total_ = 0;
  Status Stream(const BlobInfo& info, int64_t granule_bytes,
                const std::function<Status(int64_t, const char*, int64_t)>& sink) const;

  aio::IoEngine* engine_;
  aio::PinnedPool* pool_;
  std::string dir_;
  int64_t chunk_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<BlobInfo> blobs_;
};

// Open + Restore: loads `targets` from checkpoint `dir`, returning its
// metadata. Nothing is written to any target unless the whole checkpoint
// verifies.
StatusOr<std::map<std::string, std::string>> LoadCheckpoint(aio::IoEngine& engine, aio::PinnedPool& pool,
                                                            const std::string& dir,
                                                            const std::vector<BlobRef>& targets);

// The integer value of metadata key `key` of checkpoint `dir` (`dir` names
// it in errors). kCorruption naming both when the key is missing, is not a
// decimal integer within int64, or is below `min_value`.
StatusOr<int64_t> ManifestInteger(const std::string& dir, const std::map<std::string, std::string>& metadata,
                                  const std::string& key, int64_t min_value = std::numeric_limits<int64_t>::min());

}  // namespace zinf::swap
