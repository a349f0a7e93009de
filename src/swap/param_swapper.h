// ParamSwapper: the 16-bit parameter shards of one rank on NVMe, brought into
// a small set of pinned buffers when the model needs them.
//
// Design (DeepSpeed's AsyncPartitionedParameterSwapper). Every shard lives in
// a SwapStore (offload_param.nvme_paths). `buffer_count` pinned buffers of
// `buffer_elems` elements (offload_param.buffer_count / buffer_size) hold the
// shards in CPU memory: Prefetch starts a shard's read into a free buffer,
// Acquire waits for it and pins it, Release unpins it (writing it back first
// when the caller changed it). A released shard stays cached, so a second
// Acquire costs no I/O, while the released shards together hold at most
// `max_in_cpu_elems` elements (offload_param.max_in_cpu) plus those whose
// write-back is still in flight; past that, the least recently released
// shard whose write has landed is evicted, and whenever a buffer is needed
// and none is free, the least recently released one (its write-back, if
// any, waited for first).
//
// A shard larger than a buffer is refused in Create (naming the shard and
// offload_param.buffer_size): sizes are known up front, so the problem is
// found at start, not in the middle of a step.
//
// Thread-safety: thread-compatible: one thread (the prefetch coordinator) at
// a time. Pointers returned by Acquire stay valid until Release.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "swap/swap_store.h"
#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::swap {

struct ParamShardSpec {
  std::string name;
  int64_t elems = 0;
};

struct ParamSwapperOptions {
  int64_t buffer_count = 5;                  // offload_param.buffer_count
  int64_t buffer_elems = 100'000'000;        // offload_param.buffer_size
  int64_t max_in_cpu_elems = 1'000'000'000;  // offload_param.max_in_cpu: cache of released shards
  int32_t element_size_bytes = 2;            // bf16 / fp16
  bool pin_memory = true;
  SwapStoreOptions store;
};

ParamSwapperOptions ParamSwapperOptionsFromConfig(const ZeroConfig& zero);

struct ParamSwapperStats {
  int64_t reads = 0;   // shards read from NVMe
  int64_t writes = 0;  // shards written to NVMe
  int64_t hits = 0;    // Prefetch/Acquire served from the cache
  int64_t evictions = 0;
  int64_t read_bytes = 0;  // shard bytes read (prefetches included)
  int64_t write_bytes = 0;
};

class ParamSwapper {
 public:
  using ShardId = int32_t;

  // `engine` is not owned and must outlive the swapper. Errors:
  // kInvalidArgument (a shard larger than a buffer, bad counts), and
  // SwapStore::Create's and PinnedPool::Create's errors.
  static StatusOr<std::unique_ptr<ParamSwapper>> Create(const ParamSwapperOptions& options, aio::IoEngine* engine,
                                                        const std::vector<ParamShardSpec>& shards);
  // The pool of buffer_count buffers Create makes from `options`: each holds
  // buffer_elems elements padded to the store's alignment.
  static aio::PinnedPoolOptions PoolOptions(const ParamSwapperOptions& options);
  // Waits for outstanding transfers (errors are dropped: call Flush first).
  ~ParamSwapper();
  ParamSwapper(const ParamSwapper&) = delete;
  ParamSwapper& operator=(const ParamSwapper&) = delete;

  StatusOr<ShardId> Find(const std::string& name) const;
  int64_t shard_elems(ShardId id) const { return shards_[static_cast<size_t>(id)].elems; }

  // Writes the whole shard from `data` (shard_elems elements) and keeps it
  // cached. The shard must not be acquired.
  Status Store(ShardId id, const void* data);
  // Starts reading the shard unless it is cached or on its way.
  // kResourceExhausted when every buffer holds an acquired or incoming shard;
  // kFailedPrecondition for a shard never stored.
  Status Prefetch(ShardId id);
  // Waits for the shard (prefetching it if needed) and pins it in its buffer.
  // Acquires nest: each needs its Release.
  StatusOr<char*> Acquire(ShardId id);
  // Unpins; with `dirty`, the buffer's bytes are written back (asynchronously;
  // the shard is not evicted before the write has completed).
  Status Release(ShardId id, bool dirty);
  // Waits for every write-back, then trims the cache to max_in_cpu. Returns
  // the first write-back that failed since Create, wherever it was met
  // (sticky: the shard on disk is not what was stored).
  Status Flush();

  int64_t cached_elems() const { return cached_elems_; }
  const ParamSwapperStats& stats() const { return stats_; }

 private:
  enum class State { kOnDisk, kReading, kResident };
  struct Shard {
    std::string name;
    int64_t elems = 0;
    TensorId tensor = -1;
    bool stored = false;
    State state = State::kOnDisk;
    aio::PinnedBuffer buffer;
    SwapHandle read;
    SwapHandle write;
    int pins = 0;
    std::list<ShardId>::iterator lru;  // valid when in lru_
    bool in_lru = false;
  };

  explicit ParamSwapper(const ParamSwapperOptions& options) : options_(options) {}
  // A free buffer, else the least recently released shard's, else (only
  // when `demand`) the buffer of an unacquired prefetch in flight.
  StatusOr<aio::PinnedBuffer> TakeBuffer(ShardId for_shard, bool demand);
  // Starts reading shard `id` into a buffer (Prefetch: demand false).
  Status StartRead(ShardId id, bool demand);
  Status Evict(ShardId id);
  Status WaitWrite(Shard& s);
  // Whether the shard's write-back is still in flight (does not block).
  bool Writing(const Shard& s) const { return s.write.valid() && !store_->IsDone(s.write); }
  Status TrimCache();
  void LruRemove(Shard& s);

  ParamSwapperOptions options_;
  aio::IoEngine* engine_ = nullptr;
  std::unique_ptr<SwapStore> store_;
  std::unique_ptr<aio::PinnedPool> pool_;
  std::vector<Shard> shards_;
  std::list<ShardId> lru_;    // released resident shards, least recent first
  int64_t cached_elems_ = 0;  // elements of the shards in lru_
  ParamSwapperStats stats_;
  Status write_error_;  // the first failed write-back (WaitWrite)
};

}  // namespace zinf::swap
