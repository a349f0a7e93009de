// BufferPlan: every window of memory the Engine allocates for one rank, worked
// out once from the config, the blocks, the world size and the device kind.
//
// It is the one place a buffer's size is computed: the Engine allocates from
// these fields, `zinf plan` adds the model's own allocations (activations,
// the trainer's scratch) to Items(), and `zinf config-check` prints Items().
// Each size comes from the formula of the unit that owns the buffer
// (Partitioner for shards, ParamSwapper::PoolOptions,
// OptimizerSwapper::PoolBuffers / RequiredBufferBytes / ResidentPoolOptions,
// aio::PinnedPool::MappedBytes for what a pool really maps).
//
// Units: bytes unless a name ends in _elems (elements) or says count. Every
// figure is per rank: ranks on one node each hold their own copy of every
// window (multiply by the ranks per node for a node's RAM and NVMe).
//
// What the fields hold:
//   * Requests: *_bytes of a device buffer is what the Engine passes to
//     Device::Allocate; a host window is the aio::PinnedPoolOptions the
//     Engine (or the swapper that owns it) creates its pool with
//     (buffer_count 0: not allocated for this config). The swapper options
//     are complete but for the per-rank file prefix and run id, which the
//     Engine appends.
//   * Footprints: Items() and TierBytes() count what the memory really takes:
//     a device buffer rounded to kDeviceAlignBytes (HostDevice and cudaMalloc
//     round every allocation), a pool as PinnedPool::MappedBytes (each buffer
//     aligned, the mapping rounded to pages or huge pages), swap files with
//     their headers and whole stripes.
//   * Gathered blocks are a window, not a fixed buffer: the Engine allocates
//     a block at its gather and frees it at eviction. At most
//     gathered_window_elems non-persistent elements are gathered at once
//     (the largest set of non-persistent blocks whose elements fit in
//     max(stage3_max_live_parameters, max_held_elems): MakeRoom evicts down
//     to stage3_max_live_parameters and goes past it only for blocks held at
//     once), plus every persistent block.
//
// device_kind: on DeviceKind::kHost the device tier is host RAM under the
// device budget (what Device::bytes_in_use counts); the windows are the same
// on both kinds.
//
// Thread-safety: MakeBufferPlan is a pure function; a BufferPlan is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "aio/pinned_pool.h"
#include "device/device.h"
#include "swap/optimizer_swapper.h"
#include "swap/param_swapper.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::zero3 {

// HostDevice and cudaMalloc round every allocation up to this.
inline constexpr int64_t kDeviceAlignBytes = 256;
// What Device::Allocate(bytes) takes from the device: 0 for no allocation.
int64_t DeviceFootprint(int64_t bytes);

enum class BufferTier { kDevice, kPinned, kPageable, kNvme };
std::string_view BufferTierName(BufferTier tier);  // "device", "pinned", "pageable", "nvme"

// One allocation, or a group of equal ones, of one rank.
struct BufferItem {
  BufferTier tier = BufferTier::kDevice;
  std::string what;        // for people: what it holds and which keys size it
  int64_t bytes = 0;       // footprint, per rank
  bool transient = false;  // only while starting (it must fit then)
};

struct BufferPlan {
  // What the plan was made for.
  int world_size = 1;
  DeviceKind device_kind = DeviceKind::kHost;
  int stage = 3;
  // EngineOptions::forward_only: the working parameters and their gathers
  // only (PlanForwardOnly in buffer_plan.cc): no optimizer state, gradient
  // buffers or swap files of the optimizer; new_params is a one-shard ring
  // (none beside a cpu home or for fp32 parameters) and grad_staging one
  // fp32 shard, the way the initial or saved values go home.
  bool forward_only = false;
  ElementType param_type = ElementType::kBf16;  // fp16 / bf16 / fp32 from the config
  ElementType grad_type = ElementType::kF32;
  int64_t param_elem_bytes = 2;
  int64_t grad_elem_bytes = 4;
  // The Partitioner's figures for rank 0 (every rank's shards are equal).
  int64_t total_shard_elems = 0;  // the rank shard: all blocks' shards end to end
  int64_t max_shard_elems = 0;
  int64_t max_padded_elems = 0;             // the largest gathered block
  std::vector<int64_t> block_padded_elems;  // per block: what a gather brings in
  std::vector<bool> persistent;             // per block: stays gathered (stage < 3, or below the persistence threshold)

  // The working parameters' home (zero_optimization.offload_param.device).
  OffloadDevice param_home = OffloadDevice::kNone;
  int64_t param_home_device_bytes = 0;     // kNone: the whole rank shard on the device
  aio::PinnedPoolOptions param_home_host;  // kCpu: one buffer of the rank shard (pinned per pin_memory)
  // kNvme: the ParamSwapper's options (buffer_elems capped at the largest
  // shard) and the pool it makes from them (ParamSwapper::PoolOptions).
  swap::ParamSwapperOptions param_swapper;
  aio::PinnedPoolOptions param_swap_buffers;

  // The fp32 optimizer state (offload_optimizer.device; none runs as cpu).
  // The OptimizerSwapper's options: device kCpu or kNvme, sub_group_elems
  // capped at the shard, the gradient supplied by the Engine.
  swap::OptimizerSwapperOptions optimizer;
  int64_t num_sub_groups = 0;
  aio::PinnedPoolOptions optimizer_pipeline;  // kNvme: PoolBuffers x RequiredBufferBytes, made by the Engine
  aio::PinnedPoolOptions optimizer_resident;  // kCpu: master, m, v per sub-group, made by the swapper

  // Host buffers of the whole shard or of the largest shard (pinned).
  aio::PinnedPoolOptions grad_accumulator;  // fp32 gradient of the rank shard (not with the optimizer on NVMe)
  // Optimizer on NVMe: the gradient accumulates in the optimizer's store
  // (optimizer.gradients_in_store) through swap::GradientWindow's buffers.
  aio::PinnedPoolOptions grad_window;
  // The gradient norm's per-piece sums and scratch (swap::ShardSquares over
  // the rank shard; heap, made at Create): the gradient window's, or the
  // Engine's over the RAM accumulator.
  int64_t norm_squares_bytes = 0;
  // The update's new working parameters (param_type): a ring of
  // new_params_ring_elems (a multiple of the sub-group, at least two
  // sub-groups and the largest shard, or the whole shard when that is
  // smaller) drained block by block into the home (a block that wraps
  // around the ring's end is joined in grad_staging, idle then), on every
  // tier but two: with offload_param and offload_optimizer both none (the
  // all-in-RAM reference run) the whole shard (new_params_ring_elems 0);
  // with offload_param cpu none at all (new_params_in_home): the update
  // writes the pinned home in place.
  aio::PinnedPoolOptions new_params;
  int64_t new_params_ring_elems = 0;
  bool new_params_in_home = false;
  // A gradient shard off the device and its fp32 cast; at start-up, a
  // shard's initial fp32 values on their way into the optimizer state.
  aio::PinnedPoolOptions grad_staging;

  // Device gradient buffers.
  int64_t grad_flat_bytes = 0;   // the largest block's gradient, flat (grad_type)
  int64_t grad_shard_bytes = 0;  // its reduce-scattered shard; 0 with one rank (the flat buffer is the shard)

  // Gathered blocks (see the file comment).
  int64_t persistent_blocks = 0;
  int64_t persistent_elems = 0;
  int64_t persistent_bytes = 0;       // device footprint, all persistent blocks gathered
  int64_t live_limit_elems = 0;       // stage3_max_live_parameters
  int64_t max_held_elems = 0;         // non-persistent elements held at once (MakeBufferPlan's argument)
  int64_t gathered_window_elems = 0;  // non-persistent elements gathered at once, at most
  int64_t gathered_window_bytes = 0;  // their device footprint

  // The two buffers of checkpoint saves and loads (pageable), made at the
  // first SaveCheckpoint or LoadCheckpoint: whole stripes of the optimizer's
  // swap store, at least 1 MiB.
  aio::PinnedPoolOptions checkpoint_buffers;

  // What MakeBufferPlan fitted to the buffers the config gives (FitOptimizerPipeline,
  // FitParamBuffers): one line each for config-check, plan and the Engine's
  // log; empty when the config's buffers were used as given.
  std::vector<std::string> fitted;

  // NVMe swap files of this rank, headers and whole stripes included, over
  // all paths of the section (one file per path).
  int64_t param_swap_file_bytes = 0;      // kNvme parameters
  int64_t optimizer_swap_file_bytes = 0;  // kNvme optimizer: master, m, v, gradient

  // Every item above with its footprint (those not allocated left out).
  std::vector<BufferItem> Items() const;
  // Footprints of one tier; `transient` items included or not.
  int64_t TierBytes(BufferTier tier, bool with_transient = true) const;
  // Device bytes held through a step (homes, gradient buffers), without the
  // gathered blocks.
  int64_t device_fixed_bytes() const;
  // Host bytes the Engine's pools map once Create returns: the parameter
  // home or swap buffers, the optimizer's pipeline or resident state, the
  // gradient accumulator or window, the new parameters and the staging (the
  // checkpoint buffers come at the first save or load).
  int64_t host_fixed_bytes() const;
  // Persistent blocks and the window: what gathered blocks take at most.
  int64_t device_gathered_bytes() const { return persistent_bytes + gathered_window_bytes; }
};

// The working parameters' type: fp16 or bf16 when enabled, else fp32.
ElementType WorkingType(const Config& config);

// DeepSpeed's buffer semantics: offload_optimizer.buffer_count buffers of
// one fp32 sub-group (sub_group_size, capped at the shard, padded to the
// store's alignment) are the pinned memory the optimizer's pipeline may
// take. When the pipeline needs more buffers than that (RequiredBuffers:
// the arrays of every sub-group in flight with pipeline_read /
// pipeline_write), the sub-groups are cut into pieces of the largest
// aligned size of which RequiredBuffers fit in that memory, keeping the
// pipeline the config asks for. Results are bit-identical (Adam is
// elementwise, and the kernels run a sub-group's tail through the same
// vector code as its body); checkpoints record the fitted sub-group size.
// A buffer holds at least one alignment unit, so sub-groups within one are
// left whole (their pipeline pins RequiredBuffers such units, a few KiB).
// Updates sub_group_elems and buffer_count of `options` (kNvme only) and
// returns what was fitted, in one line; empty: nothing. Never fails: any
// buffer_count >= 1 runs.
std::string FitOptimizerPipeline(swap::OptimizerSwapperOptions& options);

// offload_optimizer nvme: pipeline_read and pipeline_write off (DeepSpeed's
// defaults) would leave the step serial: read a sub-group, step it, write
// it, then read the next, at a fraction of the drive's speed, while the
// next forward waits. The pipelined step is bit-identical, and
// FitOptimizerPipeline fits it into the pinned memory buffer_count x
// sub-group amounts to, so it costs no memory: both are turned on. Returns
// what was changed, in one line; empty: nothing (kCpu, or both on).
std::string PipelineAlways(swap::OptimizerSwapperOptions& options);

// offload_optimizer nvme: a sub_group_size that leaves the shard in fewer
// than kPipelineSubGroups sub-groups would leave nothing to pipeline (the
// whole state read, stepped, then written, and the next forward waiting for
// all of it), with pinned buffers the size of the shard. Such a shard is cut
// into kPipelineSubGroups sub-groups, each at least kMinPipelineSubGroupElems
// (4 MiB reads and writes per array) and a multiple of ShardSquares::kAtom
// (the gradient window squares whole pieces; so a shard just above the
// minimum may be left in fewer), never larger than the config's size.
// Results are bit-identical (as FitOptimizerPipeline's). Updates
// sub_group_elems (kNvme only) and returns what was split, in one line;
// empty: nothing.
inline constexpr int64_t kPipelineSubGroups = 8;
inline constexpr int64_t kMinPipelineSubGroupElems = int64_t{1} << 20;
std::string SplitForPipeline(swap::OptimizerSwapperOptions& options);

// offload_param: a shard larger than buffer_size is not refused: the pinned
// memory of buffer_count x buffer_size elements is re-cut into buffers of
// the largest shard (as many as it holds). Returns what was fitted (empty:
// nothing; buffer_elems is capped at the largest shard either way). Error:
// buffers that together hold less than the largest shard (a shard is read
// into one buffer), naming buffer_count / buffer_size and what would do.
StatusOr<std::string> FitParamBuffers(swap::ParamSwapperOptions& options, int64_t max_shard_elems);

// The config checks of Engine::Create that need no device: a stage outside
// 1..3, fp16 with bf16, gradient_accumulation_steps < 1, a gradient type
// that is neither fp32 nor the parameters', sub_group_size < 1; each error
// names its key. MakeBufferPlan runs them first.
Status CheckEngineConfig(const Config& config, ElementType grad_type);

// The plan of an Engine created with `config` on `blocks` by each of
// `world_size` ranks on a device of `device_kind`, with gradients of
// `grad_type` (EngineOptions::grad_type). `max_held_elems`: the most
// non-persistent elements the model holds acquired at once (a tied head
// holds the embedding and the head); 0: the largest non-persistent block.
// Errors are those Engine::Create would return for the config and blocks,
// naming the key: a stage outside 1..3, fp16 with bf16, a gradient type
// that is neither fp32 nor the parameters', gradient_accumulation_steps < 1,
// the Partitioner's, offload_param.buffer_count < 1, sub_group_size < 1, and
// those of FitParamBuffers and FitOptimizerPipeline. `forward_only`: the
// plan of a forward-only engine (BufferPlan::forward_only).
StatusOr<BufferPlan> MakeBufferPlan(const Config& config, const std::vector<BlockSpec>& blocks, int world_size,
                                    DeviceKind device_kind, ElementType grad_type, int64_t max_held_elems = 0,
                                    bool forward_only = false);

}  // namespace zinf::zero3
