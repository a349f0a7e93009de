// GatherCache (gather_cache.h).
#include "zero3/gather_cache.h"

#include <algorithm>
#include <chrono>

#include "comm/communicator.h"
#include "core/log.h"
#include "core/units.h"
#include "device/device.h"
#include "zero3/param_home.h"
#include "zero3/partitioner.h"
#include "zero3/prefetch_coordinator.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

GatherCache::GatherCache(Options options) : o_(std::move(options)), es_(ElementSizeBytes(o_.param_type)) {
  blocks_.resize(static_cast<size_t>(o_.partitioner->num_blocks()));
  for (BlockId b = 0; b < o_.partitioner->num_blocks(); ++b) {
    block(b).persistent = o_.persistent[static_cast<size_t>(b)];
  }
  // Evicting is a rank's own decision, so only a single rank may make it on
  // memory pressure: with several, each rank's next acquire of the block
  // would differ (a gather on one, a hit on the other).
  if (o_.partitioner->world_size() == 1) o_.device->SetReclaimer([this] { return ReclaimOne(); });
}

GatherCache::~GatherCache() {
  if (o_.partitioner->world_size() == 1) o_.device->SetReclaimer({});
  o_.stream->Synchronize().IgnoreError();
  for (Block& b : blocks_) {
    for (auto& [stream, e] : b.reading) e->Synchronize().IgnoreError();
    o_.device->Free(b.full);
  }
}

Status GatherCache::Hold(BlockId b) {
  Block& st = block(b);
  if (st.full != nullptr) {
    ++(st.prefetched ? o_.counters->prefetch_hits : o_.counters->resident_hits);
  } else {
    if (!fitted_) FitToDevice();
    MakeRoom(st.persistent ? 0 : o_.partitioner->layout(b).padded_numel, /*demand=*/true, 0);
    Status s = Fetch(b);
    if (!s.ok()) {
      Evict(b).IgnoreError();
      return s;
    }
  }
  st.prefetched = false;
  ++st.holds;
  return Status::Ok();
}

StatusOr<std::vector<void*>> GatherCache::WaitReady(BlockId b) {
  Block& st = block(b);
  const auto t0 = Clock::now();
  Status s = st.ready->Synchronize();
  o_.counters->fetch_wait_ns += NanosSince(t0);
  if (!s.ok()) {
    --st.holds;
    return s.WithContext("gather of block '" + (*o_.specs)[static_cast<size_t>(b)].name + "'");
  }
  std::vector<void*> ptrs;
  for (const TensorLayout& t : o_.partitioner->layout(b).tensors) {
    ptrs.push_back(static_cast<char*>(st.full) + t.offset * es_);
  }
  return ptrs;
}

Status GatherCache::Release(BlockId b, void* stream, std::unique_ptr<Event> reading) {
  Block& st = block(b);
  if (st.holds == 0) {
    return Status::FailedPrecondition("engine: Release of block '" + (*o_.specs)[static_cast<size_t>(b)].name +
                                      "' that is not acquired");
  }
  if (reading) {
    // A stream runs in order: its latest event covers its earlier reads.
    auto same = std::find_if(st.reading.begin(), st.reading.end(), [&](const auto& r) { return r.first == stream; });
    if (same != st.reading.end()) {
      same->second = std::move(reading);
    } else {
      st.reading.emplace_back(stream, std::move(reading));
    }
  }
  if (--st.holds > 0 || st.persistent) return Status::Ok();
  if (o_.coordinator->KeepOnRelease(b)) return Status::Ok();
  return Evict(b);
}

std::optional<BlockId> GatherCache::FirstHeld() const {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (blocks_[b].holds > 0) return static_cast<BlockId>(b);
  }
  return std::nullopt;
}

Status GatherCache::Fetch(BlockId b) {
  Block& st = block(b);
  const BlockLayout& l = o_.partitioner->layout(b);
  ZINF_RETURN_IF_ERROR(o_.refresh(b, /*wait=*/true).status());
  if (st.full == nullptr) {
    ZINF_ASSIGN_OR_RETURN(st.full, AllocateBlock(b));
  }
  char* dst = static_cast<char*>(st.full) + o_.partitioner->rank() * l.shard_numel * es_;
  ZINF_RETURN_IF_ERROR(o_.home->CopyToDevice(b, dst));
  const auto t1 = Clock::now();
  ZINF_RETURN_IF_ERROR(o_.device_comm->AllGather(dst, st.full, l.shard_numel, o_.param_type, o_.stream)
                           .WithContext("all-gather of block '" + (*o_.specs)[static_cast<size_t>(b)].name + "'"));
  EngineCounters& c = *o_.counters;
  c.allgather_ns += NanosSince(t1);
  c.allgather_bytes += l.padded_numel * es_;
  ZINF_ASSIGN_OR_RETURN(st.ready, o_.stream->Record());
  ++c.fetches;
  if (!st.persistent) {
    c.live_elems += l.padded_numel;
    c.peak_live_elems = std::max(c.peak_live_elems, c.live_elems);
  }
  return Status::Ok();
}

Status GatherCache::Evict(BlockId b) {
  Block& st = block(b);
  if (st.full == nullptr) return Status::Ok();
  // The memory goes back without waiting here, to be reused once the
  // model's reads have run (they began after the gather had landed: the
  // model got the pointers from WaitReady), else once the gather has landed
  // (a prefetch may be dropped while in flight), else (a fetch that failed
  // after queueing its copies) once the stream's queued work has run.
  // Reads on more than one stream: all but the last are waited for here.
  Status s;
  std::shared_ptr<Event> done;
  if (!st.reading.empty()) {
    for (size_t i = 0; i + 1 < st.reading.size(); ++i) st.reading[i].second->Synchronize().IgnoreError();
    done = std::move(st.reading.back().second);
  } else if (st.ready) {
    done = std::move(st.ready);
  }
  const int64_t elems = st.persistent ? 0 : o_.partitioner->layout(b).padded_numel;
  if (done) {
    o_.device->FreeAfter(st.full, done);
    if (elems > 0 && !done->Finished()) {
      pending_.push_back({std::move(done), elems});
    } else {
      o_.counters->live_elems -= elems;
    }
  } else {
    s = o_.device->FreeAfter(st.full, *o_.stream);
    o_.counters->live_elems -= elems;
  }
  st.reading.clear();
  st.ready.reset();
  st.full = nullptr;
  st.prefetched = false;
  ++o_.counters->evictions;
  return s;
}

// Frees released, non-persistent gathered blocks, farthest next use first,
// until `need` more elements fit under max_live. A prefetch (demand false)
// only evicts blocks used later than the candidate and gives up (false)
// rather than exceed the limit; a demanded fetch goes ahead past the limit
// when every gathered block is held (counted as an overrun).
bool GatherCache::MakeRoom(int64_t need, bool demand, int64_t candidate_distance) {
  EngineCounters& c = *o_.counters;
  RetirePending();
  while (c.live_elems + need > live_cap_elems_) {
    const BlockId victim = FarthestReleased(demand ? -1 : candidate_distance);
    if (victim >= 0) {
      Evict(victim).IgnoreError();  // a failed gather's error was returned when it was issued
      continue;
    }
    if (demand && !pending_.empty()) {  // the model's reads of evicted blocks: waited for
      pending_.front().done->Synchronize().IgnoreError();
      RetirePending();
      continue;
    }
    if (demand) ++c.live_limit_overruns;
    return demand;
  }
  return true;
}

void GatherCache::RetirePending() {
  std::erase_if(pending_, [&](const Pending& p) {
    if (!p.done->Finished()) return false;
    o_.counters->live_elems -= p.elems;
    return true;
  });
}

// A block whose home the optimizer update has not reached yet, and every
// block after it, waits for a later Acquire: its home still holds the old
// parameters. NVMe reads run ahead over twice the bucket: they are
// asynchronous and cheap to hold in the swapper's buffers.
void GatherCache::Prefetch(bool wait_for_home) {
  if (!o_.coordinator->replaying()) return;
  const int64_t bucket = o_.coordinator->options().prefetch_bucket_elems;
  if (bucket <= 0) return;  // stage3_prefetch_bucket_size 0: no prefetching, as in DeepSpeed
  auto gathered = [&](int b) { return block(b).full != nullptr; };
  auto current = [&](int b, bool wait) {
    StatusOr<bool> r = o_.refresh(b, wait);
    return r.ok() && *r;  // an error surfaces in the demanded fetch
  };
  if (o_.home->reads_ahead()) {
    for (int b : o_.coordinator->Upcoming(2 * bucket, gathered)) {
      if (!current(b, /*wait=*/false)) break;
      if (!o_.home->Prefetch(b).ok()) break;  // every buffer busy: the next Acquire reads it
    }
  }
  for (int b : o_.coordinator->Upcoming(bucket, gathered)) {
    if (!current(b, wait_for_home)) break;
    Block& st = block(b);
    const int64_t need = st.persistent ? 0 : o_.partitioner->layout(b).padded_numel;
    if (!MakeRoom(need, /*demand=*/false, o_.coordinator->NextUseDistance(b))) break;
    prefetching_ = true;
    Status s = Fetch(b);
    prefetching_ = false;
    if (!s.ok()) {
      Evict(b).IgnoreError();  // the demanded fetch will retry and report
      break;
    }
    st.prefetched = true;
    ++o_.counters->prefetches;
  }
}

void GatherCache::DropAll() {
  for (BlockId b = 0; b < static_cast<BlockId>(blocks_.size()); ++b) Evict(b).IgnoreError();
  FitToDevice();
}

// The released, non-persistent gathered block used farthest ahead, if its
// next use is beyond `beyond_distance`; -1 when there is none.
BlockId GatherCache::FarthestReleased(int64_t beyond_distance) const {
  BlockId victim = -1;
  int64_t farthest = -1;
  for (BlockId b = 0; b < static_cast<BlockId>(blocks_.size()); ++b) {
    const Block& st = blocks_[static_cast<size_t>(b)];
    if (st.full == nullptr || st.persistent || st.holds > 0) continue;
    const int64_t d = o_.coordinator->NextUseDistance(b);
    if (d <= beyond_distance) continue;
    if (d > farthest) {
      farthest = d;
      victim = b;
    }
  }
  return victim;
}

void GatherCache::FitToDevice() {
  fitted_ = true;
  int64_t room = static_cast<int64_t>(o_.device->capacity_bytes()) - static_cast<int64_t>(o_.device->bytes_in_use());
  int64_t largest = 0;
  for (BlockId b = 0; b < static_cast<BlockId>(blocks_.size()); ++b) {
    const Block& st = block(b);
    const int64_t bytes = o_.partitioner->layout(b).padded_numel * es_;
    if (st.full != nullptr) room += bytes;  // gathered now: counted in use, and in the room again
    if (st.persistent) {
      room -= AlignUp(bytes, 256);
    } else {
      room -= 256;  // each block's allocation rounds up to 256 bytes
      largest = std::max(largest, o_.partitioner->layout(b).padded_numel);
    }
  }
  const int64_t room_elems = std::max<int64_t>(room, 0) / es_;
  live_cap_elems_ = std::min(o_.max_live_elems, room_elems);
  if (live_cap_elems_ < o_.max_live_elems && !capped_logged_) {
    capped_logged_ = true;
    Log("zero3").info(
        "gathered blocks capped at {} elements by the device's room ({} free of {}), below "
        "stage3_max_live_parameters {}{}",
        FormatCount(live_cap_elems_), FormatBytes(room), FormatBytes(o_.device->capacity_bytes()),
        FormatCount(o_.max_live_elems),
        live_cap_elems_ < largest ? "; less than the largest block: each fetch waits for the last" : "");
  }
}

bool GatherCache::ReclaimOne() {
  if (prefetching_) return false;  // a prefetch never pushes out what is needed sooner: it stops instead
  const BlockId victim = FarthestReleased(-1);
  if (victim < 0) return false;
  ++o_.counters->evictions_for_memory;
  Evict(victim).IgnoreError();
  return true;
}

StatusOr<void*> GatherCache::AllocateBlock(BlockId b) {
  const int64_t bytes = o_.partitioner->layout(b).padded_numel * es_;
  StatusOr<void*> p = o_.device->Allocate(static_cast<size_t>(bytes));  // reclaims released blocks first
  if (p.ok() || p.status().code() != StatusCode::kOutOfMemory || prefetching_) return p;
  int64_t gathered = 0;
  for (BlockId h = 0; h < static_cast<BlockId>(blocks_.size()); ++h) {
    if (block(h).full != nullptr) gathered += o_.partitioner->layout(h).padded_numel * es_;
  }
  return Status::OutOfMemory(
      "device out of memory gathering block '" + (*o_.specs)[static_cast<size_t>(b)].name + "': it needs " +
      FormatBytes(bytes) + "; " + FormatBytes(static_cast<int64_t>(o_.device->bytes_in_use())) + " of " +
      FormatBytes(static_cast<int64_t>(o_.device->capacity_bytes())) + " is in use, " + FormatBytes(gathered) +
      " of it by blocks the model holds" + (o_.partitioner->world_size() > 1 ? " or keeps" : "") +
      "; give the device at least " +
      FormatBytes(bytes - (static_cast<int64_t>(o_.device->capacity_bytes()) -
                           static_cast<int64_t>(o_.device->bytes_in_use()))) +
      " more (--device-budget), or lower stage3_max_live_parameters / stage3_max_reuse_distance");
}

}  // namespace zinf::zero3
