// ParamHome: where this rank's shard of the 16-bit (or fp32) working
// parameters lives between uses (offload_param.device), behind one
// interface so the engine never switches on the tier:
//   * DeviceParamHome (none): the whole rank shard in device memory;
//   * PinnedParamHome (cpu): the whole rank shard in (pinned) host RAM;
//   * NvmeParamHome (nvme): a swap::ParamSwapper over the nvme paths, with
//     reads started ahead (Prefetch) into its pinned buffers, each held
//     until the stream has copied it to the device.
// Every block's shard sits at its Partitioner rank_offset in the rank shard
// (one ParamSwapper shard per block on NVMe).
//
// Counting: the homes add their host-to-device bytes and the driving
// thread's waits for NVMe reads to the EngineCounters given at creation;
// NVMe bytes come from the swapper's own stats (nvme_read_bytes...).
//
// Thread-safety: thread-compatible: the engine's driving thread only; but
// the memory resident() returns is written by the engine's update worker
// between its Start and Join, and CopyToDevice reads a block of it only
// once the engine has seen the worker publish that block.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf {
class Device;
class Stream;
namespace aio {
class IoEngine;
}
}  // namespace zinf

namespace zinf::zero3 {

class Partitioner;
struct BufferPlan;

class ParamHome {
 public:
  virtual ~ParamHome() = default;

  // Writes the whole rank shard (total_shard_numel elements at `params`)
  // home and waits until it is there.
  virtual Status WriteAll(const char* params) = 0;
  // Writes block b's shard (shard_numel elements at `src`) home. `src` must
  // stay unchanged until Flush returns and the stream is synchronised (the
  // device home copies asynchronously on the engine's stream).
  virtual Status WriteBlock(BlockId b, const char* src) = 0;
  // Waits for writes started by WriteBlock (NVMe write-backs) and for the
  // copies CopyToDevice queued out of the home's own buffers.
  virtual Status Flush() { return Status::Ok(); }
  // The whole rank shard in host memory when the home is one (cpu), which
  // the update writes in place (BufferPlan::new_params_in_home): block b's
  // shard at its rank_offset. Null for the others.
  virtual char* resident() { return nullptr; }
  // Whether WriteBlock reads `src` later, on the engine's stream (the
  // device home's H2D copy), rather than before it returns: its source is
  // free for reuse only once the stream has passed the copy.
  virtual bool writes_on_stream() const { return false; }
  // Enqueues on the engine's stream the copy of block b's shard to `dst`
  // (device memory, shard_numel elements) and returns without waiting for
  // it: `dst` is written once the stream gets there. The NVMe home keeps
  // the pinned buffer it copies from until an event after the copy has
  // passed, and waits for the oldest such copy only when it needs a buffer
  // (a copy, a WriteBlock) and every one is held that way, so a prefetch
  // reads ahead into fewer buffers while copies are queued; a WriteBlock
  // of the block waits for its copies. (The pinned home is written in
  // place at once: its caller drains the stream before writing it.)
  virtual Status CopyToDevice(BlockId b, char* dst) = 0;
  // Starts reading block b's shard ahead of CopyToDevice (NVMe only; the
  // others are always ready). An error means "not now" (every buffer busy).
  virtual Status Prefetch(BlockId /*b*/) { return Status::Ok(); }
  // Whether Prefetch does anything (the engine reads ahead over a wider
  // window than it gathers when it does).
  virtual bool reads_ahead() const { return false; }
  // Bytes read from and written to NVMe so far (prefetched reads included).
  virtual int64_t nvme_read_bytes() const { return 0; }
  virtual int64_t nvme_write_bytes() const { return 0; }
};

struct ParamHomeOptions {
  const BufferPlan* plan = nullptr;  // the home's tier and windows
  const std::vector<BlockSpec>* specs = nullptr;
  const Partitioner* partitioner = nullptr;
  Device* device = nullptr;
  Stream* stream = nullptr;            // the engine's stream
  aio::IoEngine* io = nullptr;         // NVMe only
  std::string run_id;                  // swap file names (SwapStore run id)
  EngineCounters* counters = nullptr;  // h2d_bytes, nvme_wait_ns
};

// The home for plan->param_home, sized as the plan says. Errors: the device's
// kOutOfMemory, the pinned pool's, and the swapper's (naming
// zero_optimization.offload_param.nvme_path).
StatusOr<std::unique_ptr<ParamHome>> CreateParamHome(const ParamHomeOptions& options);

}  // namespace zinf::zero3
