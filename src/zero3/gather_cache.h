// GatherCache: the full (all-gathered) blocks on the device: fetching one
// when the model acquires it or ahead of that, keeping released ones while
// they are needed again soon, and evicting the rest.
//
// A fetch refreshes the block's home (the optimizer update may still owe it
// new parameters: the `refresh` callback), copies this rank's shard from
// the ParamHome into a freshly allocated device buffer of padded_numel
// elements, all-gathers the other ranks' shards around it on the engine's
// stream and records an event. Non-persistent gathered elements are bounded
// by stage3_max_live_parameters (MakeRoom evicts released blocks, farthest
// next use first); persistent blocks (BufferPlan::persistent: below
// stage3_param_persistence_threshold, or every block below stage 3) stay
// gathered until DropAll.
//
// The cache yields to memory. Before the first fetch and after every DropAll
// (nothing gathered), the room the device has left for gathered blocks
// (its capacity less what is in use and the persistent blocks) caps the
// non-persistent elements below stage3_max_live_parameters: prefetched and
// kept blocks never crowd out a block the model needs. The cap is a
// function of allocations every rank makes alike, so all ranks keep and
// evict the same blocks and their gathers stay matched. Should an
// allocation still fail (the model's own, or memory the engine does not
// see), a single rank's device reclaims released blocks, farthest next use
// first, and retries (Device::SetReclaimer); only a block's own working set
// is then out of memory, an error naming the block, what it needs and what
// is in use.
//
// Prefetch, from the PrefetchCoordinator's record of the acquire order:
// NVMe reads over twice stage3_prefetch_bucket_size ahead, gathers over one
// bucket, stopping at the first block whose home is not current yet.
//
// Thread-safety: thread-compatible: the engine's driving thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf {
class Device;
class Event;
class Stream;
namespace comm {
class Communicator;
}
}  // namespace zinf

namespace zinf::zero3 {

class Partitioner;
class PrefetchCoordinator;
class ParamHome;

class GatherCache {
 public:
  // Brings block b's home up to date (true), or, with `wait` false, says
  // it cannot yet (false); an error is the update's.
  using RefreshFn = std::function<StatusOr<bool>(BlockId b, bool wait)>;

  struct Options {
    Device* device = nullptr;
    Stream* stream = nullptr;
    comm::Communicator* device_comm = nullptr;
    const Partitioner* partitioner = nullptr;
    const std::vector<BlockSpec>* specs = nullptr;
    ParamHome* home = nullptr;
    PrefetchCoordinator* coordinator = nullptr;
    EngineCounters* counters = nullptr;
    ElementType param_type = ElementType::kBf16;
    std::vector<bool> persistent;  // per block (BufferPlan::persistent)
    int64_t max_live_elems = 0;    // stage3_max_live_parameters
    RefreshFn refresh;
  };

  explicit GatherCache(Options options);
  ~GatherCache();  // frees every gathered block (after its copies finished)
  GatherCache(const GatherCache&) = delete;
  GatherCache& operator=(const GatherCache&) = delete;

  // The model acquires block b: counts a hit, or makes room and fetches it;
  // then holds it (released blocks only are evicted). A failed fetch is
  // cleaned up and returned.
  Status Hold(BlockId b);
  // Waits for b's gather and returns one device pointer per tensor. On
  // error the hold is given back.
  StatusOr<std::vector<void*>> WaitReady(BlockId b);
  // Gives a hold back; a released, non-persistent block is evicted unless
  // its next use is within stage3_max_reuse_distance. `reading`: recorded
  // on `stream` after the model's work that reads the block (null: that
  // work is done); its memory is reused only after it, and until then it
  // counts against stage3_max_live_parameters.
  Status Release(BlockId b, void* stream = nullptr, std::unique_ptr<Event> reading = nullptr);
  // Starts NVMe reads and gathers ahead of the recorded order. `wait_for_home`
  // true: a gather waits for the home to be current instead of stopping
  // there (several ranks must issue the same gathers).
  void Prefetch(bool wait_for_home);
  // Frees every gathered block (their copies are stale after a step).
  void DropAll();

  // The first block held now, if any.
  std::optional<BlockId> FirstHeld() const;
  bool persistent(BlockId b) const { return blocks_[static_cast<size_t>(b)].persistent; }

 private:
  struct Block {
    void* full = nullptr;          // gathered block on the device (padded_numel elements)
    std::unique_ptr<Event> ready;  // recorded after its gather
    // After the model's reads (Release's), the latest per stream.
    std::vector<std::pair<void*, std::shared_ptr<Event>>> reading;
    bool persistent = false;
    bool prefetched = false;  // gathered ahead, not yet acquired
    int holds = 0;
  };

  // An evicted block's memory that queued work still reads: live until
  // its event completes.
  struct Pending {
    std::shared_ptr<Event> done;
    int64_t elems = 0;
  };

  Status Fetch(BlockId b);
  Status Evict(BlockId b);
  // Stops counting the pending memory whose work has run.
  void RetirePending();
  bool MakeRoom(int64_t need, bool demand, int64_t candidate_distance);
  // The device buffer of a gathered block (the device reclaims released
  // blocks first, on one rank); out of memory names the block and what it
  // needs.
  StatusOr<void*> AllocateBlock(BlockId b);
  // The device's reclaimer: evicts the released block used farthest ahead.
  bool ReclaimOne();
  // Sets live_cap_elems_ from the device's room (see the file comment).
  void FitToDevice();
  BlockId FarthestReleased(int64_t beyond_distance) const;
  Block& block(BlockId b) { return blocks_[static_cast<size_t>(b)]; }

  Options o_;
  int64_t es_ = 2;  // bytes per working parameter
  std::vector<Block> blocks_;
  std::vector<Pending> pending_;
  bool fitted_ = false;
  bool capped_logged_ = false;
  bool prefetching_ = false;    // a prefetch's fetch is under way: nothing is reclaimed for it
  int64_t live_cap_elems_ = 0;  // min(stage3_max_live_parameters, the device's room)
};

}  // namespace zinf::zero3
