#include "swap/param_swapper.h"

#include <cstring>

#include "core/units.h"

namespace zinf::swap {

ParamSwapperOptions ParamSwapperOptionsFromConfig(const ZeroConfig& zero) {
  ParamSwapperOptions o;
  o.buffer_count = zero.offload_param.buffer_count;
  o.buffer_elems = zero.offload_param.buffer_size;
  o.max_in_cpu_elems = zero.offload_param.max_in_cpu;
  o.pin_memory = zero.offload_param.pin_memory;
  o.store.paths = zero.offload_param.nvme_paths;
  o.store.file_prefix = "zinf-param";
  return o;
}

aio::PinnedPoolOptions ParamSwapper::PoolOptions(const ParamSwapperOptions& options) {
  aio::PinnedPoolOptions po;
  po.buffer_count = options.buffer_count;
  // What SwapStore::PaddedBytes gives: the store aligns to its options' alignment.
  po.buffer_bytes = AlignUp(options.buffer_elems * options.element_size_bytes, options.store.alignment_bytes);
  po.alignment_bytes = options.store.alignment_bytes;
  po.pin = options.pin_memory;
  po.name = "parameter buffers (offload_param)";
  return po;
}

StatusOr<std::unique_ptr<ParamSwapper>> ParamSwapper::Create(const ParamSwapperOptions& options, aio::IoEngine* engine,
                                                             const std::vector<ParamShardSpec>& shards) {
  if (options.buffer_count < 1) {
    return Status::InvalidArgument("offload_param.buffer_count: expected >= 1, got " +
                                   std::to_string(options.buffer_count));
  }
  if (options.buffer_elems < 1) {
    return Status::InvalidArgument("offload_param.buffer_size: expected >= 1, got " +
                                   std::to_string(options.buffer_elems));
  }
  if (options.max_in_cpu_elems < 0) {
    return Status::InvalidArgument("offload_param.max_in_cpu: expected >= 0, got " +
                                   std::to_string(options.max_in_cpu_elems));
  }
  if (engine == nullptr) return Status::InvalidArgument("param swapper: no I/O engine");
  if (shards.empty()) return Status::InvalidArgument("param swapper: no shards");
  const int32_t es = options.element_size_bytes;
  std::vector<TensorSpec> tensors;
  tensors.reserve(shards.size());
  for (const ParamShardSpec& s : shards) {
    if (s.elems > options.buffer_elems) {
      return Status::InvalidArgument("offload_param.buffer_size: parameter shard '" + s.name + "' has " +
                                     std::to_string(s.elems) + " elements, more than a buffer holds (" +
                                     std::to_string(options.buffer_elems) + "); raise buffer_size to at least " +
                                     std::to_string(s.elems));
    }
    tensors.push_back({s.name, s.elems * es, es});  // SwapStore checks names and sizes
  }
  std::unique_ptr<ParamSwapper> p(new ParamSwapper(options));
  p->engine_ = engine;
  ZINF_ASSIGN_OR_RETURN(p->store_, SwapStore::Create(engine, std::move(tensors), options.store));
  ZINF_ASSIGN_OR_RETURN(p->pool_, aio::PinnedPool::Create(PoolOptions(options)));
  p->shards_.resize(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    p->shards_[i].name = shards[i].name;
    p->shards_[i].elems = shards[i].elems;
    p->shards_[i].tensor = static_cast<TensorId>(i);
  }
  return p;
}

ParamSwapper::~ParamSwapper() {
  // Transfers use pool buffers: finish them before anything is freed.
  for (Shard& s : shards_) {
    if (s.read.valid()) store_->Wait(s.read).IgnoreError();
    if (s.write.valid()) store_->Wait(s.write).IgnoreError();
    s.read = {};
    s.write = {};
  }
}

StatusOr<ParamSwapper::ShardId> ParamSwapper::Find(const std::string& name) const {
  ZINF_ASSIGN_OR_RETURN(TensorId id, store_->Find(name));
  return static_cast<ShardId>(id);
}

void ParamSwapper::LruRemove(Shard& s) {
  if (!s.in_lru) return;
  lru_.erase(s.lru);
  s.in_lru = false;
  cached_elems_ -= s.elems;
}

Status ParamSwapper::WaitWrite(Shard& s) {
  if (!s.write.valid()) return Status::Ok();
  Status st = store_->Wait(s.write);
  s.write = {};
  // Kept: the caller that meets it may drop it (a prefetch's trim), and the
  // shard's bytes on disk are not what its buffer held. Flush returns it.
  if (!st.ok() && write_error_.ok()) write_error_ = st;
  return st;
}

Status ParamSwapper::Evict(ShardId id) {
  Shard& s = shards_[static_cast<size_t>(id)];
  // The buffer may hold the only good copy until its write-back completed.
  ZINF_RETURN_IF_ERROR(WaitWrite(s));
  LruRemove(s);
  s.state = State::kOnDisk;
  s.buffer.Reset();
  ++stats_.evictions;
  return Status::Ok();
}

StatusOr<aio::PinnedBuffer> ParamSwapper::TakeBuffer(ShardId for_shard, bool demand) {
  if (auto b = pool_->TryAcquire(); b.ok()) return std::move(b).value();
  if (!lru_.empty()) {
    // The least recently released shard with no write in flight, else the
    // least recently released one (waiting for its write).
    ShardId victim = lru_.front();
    for (ShardId id : lru_) {
      if (!Writing(shards_[static_cast<size_t>(id)])) {
        victim = id;
        break;
      }
    }
    ZINF_RETURN_IF_ERROR(Evict(victim));
    return pool_->TryAcquire();
  }
  // A demanded shard may take the buffer of a prefetch nobody has acquired
  // yet: a stale prefetch plan must cost a re-read, never a failed fetch.
  // (A prefetch does not steal from another prefetch.)
  if (demand) {
    for (size_t i = 0; i < shards_.size(); ++i) {
      Shard& victim = shards_[i];
      if (static_cast<ShardId>(i) == for_shard || victim.state != State::kReading || victim.pins > 0) continue;
      Status r = store_->Wait(victim.read);  // the buffer is the store's until its read ends
      victim.read = {};
      victim.state = State::kOnDisk;
      victim.buffer.Reset();
      ++stats_.evictions;
      if (!r.ok()) return r;
      return pool_->TryAcquire();
    }
  }
  return Status::ResourceExhausted("parameter shard '" + shards_[static_cast<size_t>(for_shard)].name + "': all " +
                                   std::to_string(options_.buffer_count) +
                                   " parameter buffers hold acquired or incoming shards "
                                   "(offload_param.buffer_count)");
}

// Evicts released shards, least recent first, while they hold more than
// max_in_cpu. A shard whose write-back is still in flight is passed over:
// its buffer cannot be reused before the write lands anyway, and waiting
// for it here would make every Store synchronous (max_in_cpu 0). It stays
// readable (Acquire is a hit) until a later trim or TakeBuffer evicts it.
Status ParamSwapper::TrimCache() {
  for (auto it = lru_.begin(); cached_elems_ > options_.max_in_cpu_elems && it != lru_.end();) {
    const ShardId id = *it++;  // Evict erases id's node
    if (Writing(shards_[static_cast<size_t>(id)])) continue;
    ZINF_RETURN_IF_ERROR(Evict(id));
  }
  return Status::Ok();
}

Status ParamSwapper::Store(ShardId id, const void* data) {
  Shard& s = shards_[static_cast<size_t>(id)];
  if (s.pins > 0) return Status::FailedPrecondition("parameter shard '" + s.name + "' is acquired; cannot store");
  if (s.state == State::kReading) {
    Status r = store_->Wait(s.read);  // its bytes are about to be replaced anyway
    s.read = {};
    s.state = State::kResident;
    if (!r.ok()) return r;
  }
  ZINF_RETURN_IF_ERROR(WaitWrite(s));
  if (s.state == State::kOnDisk) {
    ZINF_ASSIGN_OR_RETURN(s.buffer, TakeBuffer(id, /*demand=*/true));
    s.state = State::kResident;
  }
  const int64_t bytes = s.elems * options_.element_size_bytes;
  std::memcpy(s.buffer.data(), data, static_cast<size_t>(bytes));
  std::memset(s.buffer.data() + bytes, 0, static_cast<size_t>(store_->PaddedBytes(bytes) - bytes));
  ZINF_ASSIGN_OR_RETURN(s.write, store_->SwapOut(s.tensor, s.buffer.data()));
  ++stats_.writes;
  stats_.write_bytes += bytes;
  s.stored = true;
  if (!s.in_lru) {
    lru_.push_back(id);
    s.lru = std::prev(lru_.end());
    s.in_lru = true;
    cached_elems_ += s.elems;
  }
  return TrimCache();
}

Status ParamSwapper::Prefetch(ShardId id) { return StartRead(id, /*demand=*/false); }

Status ParamSwapper::StartRead(ShardId id, bool demand) {
  Shard& s = shards_[static_cast<size_t>(id)];
  if (!s.stored) return Status::FailedPrecondition("parameter shard '" + s.name + "' was never stored");
  if (s.state != State::kOnDisk) {
    if (s.state == State::kResident) ++stats_.hits;
    return Status::Ok();
  }
  ZINF_ASSIGN_OR_RETURN(s.buffer, TakeBuffer(id, demand));
  auto h = store_->SwapIn(s.tensor, s.buffer.data());
  if (!h.ok()) {
    s.buffer.Reset();
    return h.status();
  }
  s.read = *h;
  s.state = State::kReading;
  ++stats_.reads;
  stats_.read_bytes += s.elems * options_.element_size_bytes;
  return Status::Ok();
}

StatusOr<char*> ParamSwapper::Acquire(ShardId id) {
  Shard& s = shards_[static_cast<size_t>(id)];
  if (s.state == State::kOnDisk) {
    ZINF_RETURN_IF_ERROR(StartRead(id, /*demand=*/true));
  } else if (s.state == State::kResident && s.pins == 0) {
    ++stats_.hits;
  }
  if (s.state == State::kReading) {
    Status r = store_->Wait(s.read);
    s.read = {};
    if (!r.ok()) {
      s.state = State::kOnDisk;
      s.buffer.Reset();
      return r;
    }
    s.state = State::kResident;
  }
  LruRemove(s);
  ++s.pins;
  return s.buffer.data();
}

Status ParamSwapper::Release(ShardId id, bool dirty) {
  Shard& s = shards_[static_cast<size_t>(id)];
  if (s.pins <= 0) return Status::FailedPrecondition("parameter shard '" + s.name + "' released more than acquired");
  if (dirty) {
    ZINF_RETURN_IF_ERROR(WaitWrite(s));
    ZINF_ASSIGN_OR_RETURN(s.write, store_->SwapOut(s.tensor, s.buffer.data()));
    ++stats_.writes;
    stats_.write_bytes += s.elems * options_.element_size_bytes;
  }
  if (--s.pins > 0) return Status::Ok();
  lru_.push_back(id);
  s.lru = std::prev(lru_.end());
  s.in_lru = true;
  cached_elems_ += s.elems;
  return TrimCache();
}

Status ParamSwapper::Flush() {
  for (Shard& s : shards_) WaitWrite(s).IgnoreError();  // recorded in write_error_
  if (!write_error_.ok()) return write_error_;
  return TrimCache();  // every write has landed: back under max_in_cpu
}

}  // namespace zinf::swap
