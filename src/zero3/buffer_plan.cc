// The buffer plan (buffer_plan.h). Each field names the allocation it stands
// for in the Engine; sizes come from the unit that owns the buffer.
#include "zero3/buffer_plan.h"

#include <algorithm>
#include <map>

#include "core/units.h"
#include "swap/gradient_window.h"
#include "zero3/partitioner.h"

namespace zinf::zero3 {
namespace {

// The Engine's one-buffer host windows (zero3::HostWindow): at least a
// page, no huge pages (they are touched once, not streamed).
aio::PinnedPoolOptions OneBuffer(int64_t bytes, bool pin, const char* name) {
  aio::PinnedPoolOptions o;
  o.buffer_count = 1;
  o.buffer_bytes = std::max<int64_t>(bytes, 4096);
  o.pin = pin;
  o.huge_pages = false;
  o.name = name;
  return o;
}

aio::PinnedPoolOptions NoPool(const char* name) {
  aio::PinnedPoolOptions o;
  o.buffer_count = 0;
  o.buffer_bytes = 0;
  o.name = name;
  return o;
}

// Bytes on disk of a SwapStore holding tensors of `tensor_bytes` under
// `options` (swap_store.h): every tensor starts on a stripe, the striped
// space is spread over one file per path, each file opens with a header of
// one alignment block. Paths not given yet count as one.
int64_t SwapFileBytes(const std::vector<int64_t>& tensor_bytes, const swap::SwapStoreOptions& options) {
  const int64_t stripe = options.stripe_bytes;
  const int64_t files = std::max<int64_t>(1, static_cast<int64_t>(options.paths.size()));
  int64_t units = 0;
  for (int64_t b : tensor_bytes) units += AlignUp(b, stripe) / stripe;
  return files * (options.alignment_bytes + (units + files - 1) / files * stripe);
}

struct Packed {
  int64_t elems = 0;
  int64_t bytes = 0;
};

// The largest total of blocks (sizes in elements) within `bound` elements,
// and the device footprint of that set. Exact by trying every mix of all
// size classes but the most numerous one, which fills what is left: a model
// has few distinct block sizes (a GPT: embedding, layers, head). With too
// many mixes to try, min(bound, all) with rounding slack per block: an
// upper bound.
Packed LargestWithin(const std::vector<int64_t>& sizes, int64_t bound, int64_t elem_bytes) {
  std::map<int64_t, int64_t> classes;  // size -> count
  int64_t all = 0;
  for (int64_t s : sizes) {
    ++classes[s];
    all += s;
  }
  if (all <= bound) {
    Packed p;
    for (int64_t s : sizes) {
      p.elems += s;
      p.bytes += DeviceFootprint(s * elem_bytes);
    }
    return p;
  }
  std::vector<std::pair<int64_t, int64_t>> cls(classes.begin(), classes.end());
  std::sort(cls.begin(), cls.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  int64_t mixes = 1;
  for (size_t i = 1; i < cls.size() && mixes <= (int64_t{1} << 20); ++i) mixes *= cls[i].second + 1;
  if (mixes > (int64_t{1} << 20)) {
    const int64_t elems = std::min(bound, all);
    return {elems, DeviceFootprint(elems * elem_bytes) + kDeviceAlignBytes * static_cast<int64_t>(sizes.size())};
  }
  Packed best;
  std::vector<int64_t> take(cls.size(), 0);  // counts of classes 1.. in the current mix
  for (int64_t mix = 0; mix < mixes; ++mix) {
    int64_t rest = mix;
    Packed p;
    for (size_t i = 1; i < cls.size(); ++i) {
      take[i] = rest % (cls[i].second + 1);
      rest /= cls[i].second + 1;
      p.elems += take[i] * cls[i].first;
      p.bytes += take[i] * DeviceFootprint(cls[i].first * elem_bytes);
    }
    if (p.elems > bound) continue;
    const int64_t fill = std::min(cls[0].second, (bound - p.elems) / cls[0].first);
    p.elems += fill * cls[0].first;
    p.bytes += fill * DeviceFootprint(cls[0].first * elem_bytes);
    if (p.elems > best.elems || (p.elems == best.elems && p.bytes > best.bytes)) best = p;
  }
  return best;
}

// The working parameters' home: device, one host buffer, or the swapper.
Status PlanParamHome(const Config& config, const Partitioner& part, BufferPlan& p) {
  const ZeroConfig& zero = config.zero;
  const int64_t total = part.total_shard_numel();
  p.param_home = zero.offload_param.device;
  p.param_home_host = NoPool("param home");
  p.param_swapper = swap::ParamSwapperOptionsFromConfig(zero);
  p.param_swapper.element_size_bytes = static_cast<int32_t>(p.param_elem_bytes);
  p.param_swap_buffers = NoPool("parameter buffers (offload_param)");
  switch (p.param_home) {
    case OffloadDevice::kNone:
      p.param_swapper.buffer_elems = std::min(p.param_swapper.buffer_elems, part.max_shard_numel());
      p.param_home_device_bytes = total * p.param_elem_bytes;
      break;
    case OffloadDevice::kCpu:
      p.param_swapper.buffer_elems = std::min(p.param_swapper.buffer_elems, part.max_shard_numel());
      p.param_home_host = OneBuffer(total * p.param_elem_bytes, zero.offload_param.pin_memory, "param home");
      break;
    case OffloadDevice::kNvme: {
      swap::ParamSwapperOptions& o = p.param_swapper;
      if (o.buffer_count < 1) {
        return Status::InvalidArgument("offload_param.buffer_count: expected >= 1, got " +
                                       std::to_string(o.buffer_count));
      }
      ZINF_ASSIGN_OR_RETURN(std::string note, FitParamBuffers(o, part.max_shard_numel()));
      if (!note.empty()) p.fitted.push_back(std::move(note));
      p.param_swap_buffers = swap::ParamSwapper::PoolOptions(o);
      std::vector<int64_t> shards;
      for (int b = 0; b < part.num_blocks(); ++b) shards.push_back(part.layout(b).shard_numel * p.param_elem_bytes);
      p.param_swap_file_bytes = SwapFileBytes(shards, o.store);
      break;
    }
  }
  return Status::Ok();
}

// The optimizer state: resident in RAM (cpu) or swapped through the pipeline (nvme).
Status PlanOptimizer(const Config& config, int64_t total, BufferPlan& p) {
  const ZeroConfig& zero = config.zero;
  swap::OptimizerSwapperOptions& oo = p.optimizer;
  oo = swap::OptimizerSwapperOptionsFromConfig(zero, total);
  if (oo.device == OffloadDevice::kNone) oo.device = OffloadDevice::kCpu;  // CPU Adam on RAM-resident state
  oo.sub_group_elems = std::min(oo.sub_group_elems, total);
  oo.prefix = "optim";
  // On NVMe the fp32 gradient lives beside master, m and v (filled through
  // the gradient window), not in a whole-shard RAM accumulator. The fit
  // sees its fourth array; the window follows the fitted sub-group.
  oo.gradients_in_store = oo.device == OffloadDevice::kNvme;
  for (std::string note : {PipelineAlways(oo), SplitForPipeline(oo), FitOptimizerPipeline(oo)}) {
    if (!note.empty()) p.fitted.push_back(std::move(note));
  }
  // The engine hands the window one block's shard at a time.
  p.grad_window = swap::GradientWindow::PoolOptions(oo, zero.offload_optimizer.pin_memory, p.max_shard_elems);
  p.norm_squares_bytes = swap::ShardSquares::FootprintBytes(total, zero.sub_group_size);
  p.num_sub_groups = swap::OptimizerSwapper::NumSubGroups(oo);
  p.optimizer_resident = swap::OptimizerSwapper::ResidentPoolOptions(oo);
  p.optimizer_pipeline = NoPool("optimizer pipeline");
  if (oo.device == OffloadDevice::kNvme) {
    aio::PinnedPoolOptions& po = p.optimizer_pipeline;
    po.buffer_count = swap::OptimizerSwapper::PoolBuffers(oo);
    po.buffer_bytes = swap::OptimizerSwapper::RequiredBufferBytes(oo, oo.store.alignment_bytes);
    po.alignment_bytes = oo.store.alignment_bytes;
    po.pin = zero.offload_optimizer.pin_memory;
    po.require_pinned = false;
    po.huge_pages = true;  // streamed: 1 MiB requests stay whole (aio/pinned_pool.h)
    po.numa_node = -1;
    // A tensor per array and sub-group: master, m, v, and the gradient when
    // it is kept in the store.
    const size_t per_group = oo.gradients_in_store ? 4 : 3;
    std::vector<int64_t> arrays;
    for (int64_t k = 0; k < p.num_sub_groups; ++k) {
      const int64_t n = std::min(oo.sub_group_elems, total - k * oo.sub_group_elems);
      arrays.insert(arrays.end(), per_group, n * int64_t{sizeof(float)});
    }
    p.optimizer_swap_file_bytes = SwapFileBytes(arrays, oo.store);
  }
  return Status::Ok();
}

// The checkpoint buffers (engine_checkpoint.cc PrepareCheckpointIo): pieces
// of a swap blob are whole stripes of the optimizer's store.
void PlanCheckpoints(BufferPlan& p) {
  int64_t bytes = 1 << 20, alignment = 4096;
  if (p.optimizer.device == OffloadDevice::kNvme) {
    bytes = std::max(bytes, p.optimizer.store.stripe_bytes);
    alignment = std::max(alignment, p.optimizer.store.alignment_bytes);
  }
  aio::PinnedPoolOptions& cp = p.checkpoint_buffers;
  cp.buffer_count = 2;
  cp.buffer_bytes = bytes;
  cp.alignment_bytes = alignment;
  cp.pin = false;
  cp.huge_pages = false;
  cp.name = "checkpoint";
}

// Persistent blocks and the window of non-persistent ones (buffer_plan.h).
void PlanGathered(const Config& config, const Partitioner& part, int64_t max_held_elems, BufferPlan& p) {
  const ZeroConfig& zero = config.zero;
  std::vector<int64_t> transient;
  int64_t largest = 0;
  for (int b = 0; b < part.num_blocks(); ++b) {
    const int64_t n = part.layout(b).padded_numel;
    const bool persistent = zero.stage < 3 || n < zero.stage3_param_persistence_threshold;
    p.block_padded_elems.push_back(n);
    p.persistent.push_back(persistent);
    if (persistent) {
      ++p.persistent_blocks;
      p.persistent_elems += n;
      p.persistent_bytes += DeviceFootprint(n * p.param_elem_bytes);
    } else {
      transient.push_back(n);
      largest = std::max(largest, n);
    }
  }
  p.live_limit_elems = zero.stage3_max_live_parameters;
  p.max_held_elems = max_held_elems > 0 ? max_held_elems : largest;
  const Packed w = LargestWithin(transient, std::max(p.live_limit_elems, p.max_held_elems), p.param_elem_bytes);
  p.gathered_window_elems = w.elems;
  p.gathered_window_bytes = w.bytes;
}

std::string Elems(int64_t n) { return FormatCount(n) + " elements"; }

}  // namespace

ElementType WorkingType(const Config& config) {
  return config.fp16.enabled ? ElementType::kF16 : config.bf16.enabled ? ElementType::kBf16 : ElementType::kF32;
}

Status CheckEngineConfig(const Config& config, ElementType grad_type) {
  const ElementType param_type = WorkingType(config);
  const ZeroConfig& zero = config.zero;
  if (zero.stage < 1 || zero.stage > 3) {
    return Status::InvalidArgument("zero_optimization.stage: the engine runs stages 1, 2 and 3, got " +
                                   std::to_string(zero.stage));
  }
  if (config.fp16.enabled && config.bf16.enabled) {
    return Status::InvalidArgument("fp16.enabled and bf16.enabled: at most one may be on");
  }
  if (config.gradient_accumulation_steps < 1) {
    return Status::InvalidArgument("gradient_accumulation_steps: expected >= 1, got " +
                                   std::to_string(config.gradient_accumulation_steps));
  }
  if (grad_type != ElementType::kF32 && grad_type != param_type) {
    return Status::InvalidArgument("engine: gradients must be fp32 or the parameters' type");
  }
  if (zero.sub_group_size < 1) {
    return Status::InvalidArgument("zero_optimization.sub_group_size: expected > 0, got " +
                                   std::to_string(zero.sub_group_size));
  }
  return Status::Ok();
}

std::string PipelineAlways(swap::OptimizerSwapperOptions& o) {
  if (o.device != OffloadDevice::kNvme || (o.pipeline_read && o.pipeline_write)) return std::string();
  const std::string off = !o.pipeline_read && !o.pipeline_write ? "pipeline_read and pipeline_write are"
                          : !o.pipeline_read                    ? "pipeline_read is"
                                                                : "pipeline_write is";
  o.pipeline_read = o.pipeline_write = true;
  return "offload_optimizer." + off +
         " off: the optimizer step still reads ahead and writes behind, within the pinned memory buffer_count "
         "gives (bit-identical results)";
}

std::string SplitForPipeline(swap::OptimizerSwapperOptions& o) {
  if (o.device != OffloadDevice::kNvme) return std::string();
  const int64_t was = std::min(o.sub_group_elems, o.total_elems);
  if (was <= 0 || (o.total_elems + was - 1) / was >= kPipelineSubGroups) return std::string();
  // Whole atoms of the norm's pieces (swap::ShardSquares): the gradient
  // window takes a sub-group's squares as it writes it, which must be a
  // range of whole pieces.
  const int64_t piece =
      AlignUp(std::max(kMinPipelineSubGroupElems, (o.total_elems + kPipelineSubGroups - 1) / kPipelineSubGroups),
              swap::ShardSquares::kAtom);
  if (piece >= was) return std::string();
  const int64_t align = o.store.alignment_bytes;
  const int64_t given_bytes = o.buffer_count * swap::OptimizerSwapper::RequiredBufferBytes(o, align);
  o.sub_group_elems = piece;
  const int64_t n = (o.total_elems + piece - 1) / piece, had = (o.total_elems + was - 1) / was;
  // The pinned memory the config gives, in buffers of the smaller
  // sub-group: more of them in flight (up to every sub-group's), so that
  // the state is read under the backward pass (PrefetchStep), not after it.
  const int64_t arrays = swap::OptimizerSwapper::ArraysOf(o);
  const int64_t count =
      std::min(given_bytes / swap::OptimizerSwapper::RequiredBufferBytes(o, align), arrays * n) / arrays * arrays;
  std::string more;
  if (count > o.buffer_count) {
    more = "; the pinned memory of buffer_count " + std::to_string(o.buffer_count) + " holds " +
           std::to_string(count / arrays) + " of them in flight (" + std::to_string(count) + " buffers of " +
           FormatBytes(swap::OptimizerSwapper::RequiredBufferBytes(o, align)) + ")";
    o.buffer_count = count;
  }
  return "sub_group_size leaves the optimizer shard (" + FormatCount(o.total_elems) + " elements) in " +
         std::to_string(had) + " sub-group(s): split into " + std::to_string(n) + " of " + FormatCount(piece) +
         " elements, so that NVMe reads, Adam and writes pipeline and the next forward waits only for its first "
         "blocks" +
         more + " (bit-identical results)";
}

std::string FitOptimizerPipeline(swap::OptimizerSwapperOptions& o) {
  using swap::OptimizerSwapper;
  if (o.device != OffloadDevice::kNvme) return std::string();
  const int64_t need = OptimizerSwapper::RequiredBuffers(o);
  const int64_t given = o.buffer_count;
  if (given >= need) return std::string();
  const int64_t align = o.store.alignment_bytes;
  const int64_t buffer_bytes = OptimizerSwapper::RequiredBufferBytes(o, align);
  const int64_t pinned = given * buffer_bytes;
  // The largest aligned piece of which `need` fit in the given memory; a
  // buffer holds at least one alignment unit, so a sub-group within one is
  // not split (its buffers cost need x align, a few KiB).
  const int64_t piece_bytes = std::max(align, pinned / need / align * align);
  if (piece_bytes >= buffer_bytes) return std::string();
  const int64_t arrays = need / (1 + int64_t{o.pipeline_read} + int64_t{o.pipeline_write});
  const std::string pipeline = o.pipeline_read && o.pipeline_write ? "pipeline_read and pipeline_write"
                               : o.pipeline_read                   ? "pipeline_read"
                                                                   : "pipeline_write";
  const int64_t was = std::min(o.sub_group_elems, o.total_elems);
  o.sub_group_elems = piece_bytes / int64_t{sizeof(float)};
  o.buffer_count = need;
  return "offload_optimizer.buffer_count " + std::to_string(given) + " (" + std::to_string(given) + " x " +
         FormatBytes(buffer_bytes) + " = " + FormatBytes(pinned) + " pinned) is fewer than the " +
         std::to_string(need) + " buffers " + pipeline + " keep (" + std::to_string(arrays) + " arrays x " +
         std::to_string(need / arrays) + " sub-groups in flight): sub-groups split from " + FormatCount(was) + " to " +
         FormatCount(o.sub_group_elems) + " elements, " + std::to_string(need) + " buffers of " +
         FormatBytes(piece_bytes) + " = " + FormatBytes(need * piece_bytes) +
         " (bit-identical results; checkpoints record the split: resume with the same buffer_count)";
}

StatusOr<std::string> FitParamBuffers(swap::ParamSwapperOptions& o, int64_t max_shard_elems) {
  if (o.buffer_elems >= max_shard_elems) {
    o.buffer_elems = max_shard_elems;  // a buffer never needs to be larger than the largest shard
    return std::string();
  }
  const int64_t count = o.buffer_count * o.buffer_elems / max_shard_elems;
  const std::string given = std::to_string(o.buffer_count) + " x buffer_size " + FormatCount(o.buffer_elems) + " = " +
                            FormatCount(o.buffer_count * o.buffer_elems) + " elements";
  if (count < 1) {
    return Status::InvalidArgument("zero_optimization.offload_param.buffer_size: the largest parameter shard has " +
                                   FormatCount(max_shard_elems) +
                                   " elements, more than all buffers hold (buffer_count " + given +
                                   "), and a shard is read into one buffer; raise buffer_count to at least " +
                                   std::to_string((max_shard_elems + o.buffer_elems - 1) / o.buffer_elems) +
                                   " or buffer_size to at least " + std::to_string(max_shard_elems));
  }
  const std::string note = "offload_param: the largest parameter shard (" + FormatCount(max_shard_elems) +
                           " elements) is larger than buffer_size; the pinned buffers (buffer_count " + given +
                           ") are re-cut into " + std::to_string(count) + " buffer(s) of one shard";
  o.buffer_count = count;
  o.buffer_elems = max_shard_elems;
  return note;
}

int64_t DeviceFootprint(int64_t bytes) { return bytes > 0 ? AlignUp(bytes, kDeviceAlignBytes) : 0; }

std::string_view BufferTierName(BufferTier tier) {
  switch (tier) {
    case BufferTier::kDevice: return "device";
    case BufferTier::kPinned: return "pinned";
    case BufferTier::kPageable: return "pageable";
    case BufferTier::kNvme: return "nvme";
  }
  return "?";
}

namespace {

// The new-parameter window (BufferPlan::new_params). `optimizer_device`:
// the config's offload_optimizer.device (none runs as cpu, but there the
// whole-shard buffer stays: nothing is offloaded, and that run is the
// reference the ring's results are compared with).
void PlanNewParams(OffloadDevice optimizer_device, BufferPlan& p) {
  const int64_t total = p.total_shard_elems;
  if (p.param_home == OffloadDevice::kCpu) {
    // The home is the whole shard in pinned RAM: the update writes it.
    p.new_params = NoPool("new params");
    p.new_params_in_home = true;
    return;
  }
  if (p.param_home == OffloadDevice::kNone && optimizer_device == OffloadDevice::kNone) {
    p.new_params = OneBuffer(total * p.param_elem_bytes, true, "new params");
    return;
  }
  // Two sub-groups (the one the worker writes, the one before it) and a
  // block: the driver drains blocks in order, so the worker, waiting for
  // space for sub-group k, only waits for blocks ending inside sub-group
  // k-1 or earlier, which it has published.
  const int64_t g = p.optimizer.sub_group_elems > 0 ? p.optimizer.sub_group_elems : total;
  const int64_t want = (2 * g + p.max_shard_elems + g - 1) / g * g;
  if (want >= total) {
    p.new_params = OneBuffer(total * p.param_elem_bytes, true, "new params");
    p.new_params_ring_elems = total;
    return;
  }
  p.new_params_ring_elems = want;
  p.new_params = OneBuffer(want * p.param_elem_bytes, true, "new params");
}

// A forward-only engine (EngineOptions::forward_only) keeps the working
// parameters and their gathers, and nothing the update or the gradient
// needs: no optimizer state, accumulator, gradient window, norm sums or
// device gradient buffers. Initial values and a checkpoint's master weights
// go home block by block: each block's fp32 shard in the staging window
// (one fp32 shard), cast into a one-shard ring (none beside a cpu home,
// written in place, nor for fp32 parameters, which go home from staging).
// The optimizer's options stay as planned: the manifest's sub-group keys
// come from them.
void PlanForwardOnly(BufferPlan& p) {
  p.optimizer_resident = NoPool("optimizer state");
  p.optimizer_pipeline = NoPool("optimizer pipeline");
  p.optimizer_swap_file_bytes = 0;
  p.grad_accumulator = NoPool("grad accumulator");
  p.grad_window = NoPool("gradient window");
  p.norm_squares_bytes = 0;
  p.grad_flat_bytes = p.grad_shard_bytes = 0;
  if (!p.new_params_in_home) {
    const bool cast = p.param_elem_bytes != 4;
    p.new_params_ring_elems = cast ? p.max_shard_elems : 0;
    p.new_params = cast ? OneBuffer(p.max_shard_elems * p.param_elem_bytes, true, "new params") : NoPool("new params");
  }
  p.grad_staging = OneBuffer(p.max_shard_elems * 4, true, "grad staging");
}

}  // namespace

StatusOr<BufferPlan> MakeBufferPlan(const Config& config, const std::vector<BlockSpec>& blocks, int world_size,
                                    DeviceKind device_kind, ElementType grad_type, int64_t max_held_elems,
                                    bool forward_only) {
  BufferPlan p;
  p.world_size = world_size;
  p.forward_only = forward_only;
  p.device_kind = device_kind;
  p.stage = config.zero.stage;
  p.param_type = WorkingType(config);
  p.grad_type = grad_type;
  p.param_elem_bytes = ElementSizeBytes(p.param_type);
  p.grad_elem_bytes = ElementSizeBytes(grad_type);
  ZINF_RETURN_IF_ERROR(CheckEngineConfig(config, grad_type));
  ZINF_ASSIGN_OR_RETURN(Partitioner part, Partitioner::Create(blocks, world_size, 0));
  const int64_t total = part.total_shard_numel();
  p.total_shard_elems = total;
  p.max_shard_elems = part.max_shard_numel();
  p.max_padded_elems = part.max_padded_numel();

  ZINF_RETURN_IF_ERROR(PlanParamHome(config, part, p));
  ZINF_RETURN_IF_ERROR(PlanOptimizer(config, total, p));
  PlanCheckpoints(p);
  p.grad_accumulator =
      p.optimizer.gradients_in_store ? NoPool("grad accumulator") : OneBuffer(total * 4, true, "grad accumulator");
  PlanNewParams(config.zero.offload_optimizer.device, p);
  // The gradient shard as it comes off the device and, for a 16-bit
  // gradient, its fp32 cast behind it. Four bytes an element at least: the
  // window is also one block's fp32 master weights at start-up.
  p.grad_staging = OneBuffer(p.max_shard_elems * (p.grad_elem_bytes == 4 ? 4 : 8), true, "grad staging");
  // Several ranks: the block's gradient flattened for the reduce-scatter,
  // and the rank's shard of it. One rank: the reduce-scatter is the
  // identity, and each tensor's gradient goes straight to grad staging.
  p.grad_flat_bytes = world_size > 1 ? p.max_padded_elems * p.grad_elem_bytes : 0;
  p.grad_shard_bytes = world_size > 1 ? p.max_shard_elems * p.grad_elem_bytes : 0;
  PlanGathered(config, part, max_held_elems, p);
  if (forward_only) PlanForwardOnly(p);
  return p;
}

std::vector<BufferItem> BufferPlan::Items() const {
  std::vector<BufferItem> items;
  auto add = [&](BufferTier t, std::string what, int64_t bytes, bool transient = false) {
    if (bytes > 0) items.push_back({t, std::move(what), bytes, transient});
  };
  auto pool = [&](const aio::PinnedPoolOptions& o, std::string what, bool transient = false) {
    if (o.buffer_count > 0) {
      add(o.pin ? BufferTier::kPinned : BufferTier::kPageable, std::move(what), aio::PinnedPool::MappedBytes(o),
          transient);
    }
  };
  const std::string working = param_elem_bytes == 4 ? "fp32 working parameters" : "16-bit working parameters";

  // Device.
  add(BufferTier::kDevice, working + ", the whole rank shard (offload_param none)",
      DeviceFootprint(param_home_device_bytes));
  add(BufferTier::kDevice,
      "persistent gathered blocks (" + std::to_string(persistent_blocks) +
          (stage < 3 ? ": every block at stage " + std::to_string(stage)
                     : " below stage3_param_persistence_threshold") +
          ")",
      persistent_bytes);
  add(BufferTier::kDevice,
      "gathered blocks: at most " + Elems(gathered_window_elems) + " (max(stage3_max_live_parameters, held at once))",
      gathered_window_bytes);
  const std::string gt = grad_elem_bytes == 4 ? "fp32" : "16-bit";
  add(BufferTier::kDevice, "gradient flat buffer (largest block, " + gt + ")", DeviceFootprint(grad_flat_bytes));
  add(BufferTier::kDevice, "gradient shard buffer (largest shard, " + gt + ")", DeviceFootprint(grad_shard_bytes));

  // Host.
  pool(param_home_host, working + ", the whole rank shard (offload_param cpu)");
  pool(param_swap_buffers, "offload_param buffers (buffer_count " + std::to_string(param_swap_buffers.buffer_count) +
                               " x " + Elems(param_swapper.buffer_elems) + ")");
  pool(optimizer_resident, "fp32 optimizer state: master, m, v (offload_optimizer cpu, " +
                               std::to_string(num_sub_groups) + " sub-group(s))");
  pool(optimizer_pipeline, "optimizer pipeline buffers (" + std::to_string(optimizer_pipeline.buffer_count) +
                               " x one fp32 sub-group of " + Elems(optimizer.sub_group_elems) +
                               (optimizer.gradients_in_store ? ": master, m, v and gradient" : ": master, m, v") +
                               " of the sub-groups in flight)");
  pool(grad_accumulator, "fp32 gradient accumulator (whole shard)");
  pool(grad_window, "gradient window (" + std::to_string(grad_window.buffer_count) + " x one fp32 sub-group of " +
                        Elems(optimizer.sub_group_elems) + ": the gradient accumulated on NVMe)");
  if (forward_only) {
    pool(new_params, "working-type cast of one block on its way home (largest shard)");
    pool(grad_staging, "fp32 staging of one block's initial or saved values (largest shard)");
  } else {
    pool(new_params,
         new_params_ring_elems == 0 || new_params_ring_elems >= total_shard_elems
             ? "new-parameter buffer (whole shard, working type)"
             : "new-parameter ring (" + Elems(new_params_ring_elems) + ": sub-groups written home block by block)");
    pool(grad_staging, "gradient staging (largest shard)");
  }
  add(BufferTier::kPageable, "gradient norm's sums (one per 4 KiB of the shard and per sub_group_size)",
      norm_squares_bytes);
  pool(checkpoint_buffers, "checkpoint buffers (2, made at the first save or load)");

  // NVMe.
  add(BufferTier::kNvme, (param_elem_bytes == 4 ? "fp32" : "16-bit") + std::string(" parameter swap file(s)"),
      param_swap_file_bytes);
  add(BufferTier::kNvme,
      optimizer.gradients_in_store ? "optimizer swap file(s) (master, m, v, gradient)"
                                   : "optimizer swap file(s) (master, m, v)",
      optimizer_swap_file_bytes);
  return items;
}

int64_t BufferPlan::TierBytes(BufferTier tier, bool with_transient) const {
  int64_t sum = 0;
  for (const BufferItem& it : Items()) {
    if (it.tier == tier && (with_transient || !it.transient)) sum += it.bytes;
  }
  return sum;
}

int64_t BufferPlan::host_fixed_bytes() const {
  int64_t sum = 0;
  for (const aio::PinnedPoolOptions* o :
       {&param_home_host, &param_swap_buffers, &optimizer_pipeline, &optimizer_resident, &grad_accumulator,
        &grad_window, &new_params, &grad_staging}) {
    if (o->buffer_count > 0) sum += aio::PinnedPool::MappedBytes(*o);
  }
  return sum;
}

int64_t BufferPlan::device_fixed_bytes() const {
  return DeviceFootprint(param_home_device_bytes) + DeviceFootprint(grad_flat_bytes) +
         DeviceFootprint(grad_shard_bytes);
}

}  // namespace zinf::zero3
